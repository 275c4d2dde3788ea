/*
 * fer_exec.c - the native NFE loop (fer_exec.h): ONNX Runtime through its C API, the solver
 * update and fer_core_step, one step after another without the Python interpreter.
 *
 * ONNX Runtime is reached through the function table OrtGetApiBase()->GetApi(version) returns,
 * from a library dlopen()ed at create. Only the table's layout is needed, not its header: the
 * table is append-only across releases (a member's index never changes), so fer_ort_api below
 * declares the members this file calls at their indices in include/onnxruntime/core/session/
 * onnxruntime_c_api.h (ONNX Runtime, Copyright (c) Microsoft Corporation, MIT License), checked
 * against the API 13 header and run against 1.32.0; the members in between are padding.
 * fer_exec_create checks the table with a status round trip (CreateStatus / GetErrorCode /
 * GetErrorMessage / ReleaseStatus) before anything else uses it.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fer_internal.h"
#include "fer_exec.h"

/* ---- the slice of the ONNX Runtime C API this file uses -------------------------------------- */
typedef struct fer_ort_opaque fer_ort_status;  /* OrtStatus; NULL means success */
typedef struct fer_ort_opaque fer_ort_env;
typedef struct fer_ort_opaque fer_ort_session;
typedef struct fer_ort_opaque fer_ort_options;
typedef struct fer_ort_opaque fer_ort_meminfo;
typedef struct fer_ort_opaque fer_ort_value;

#define FER_ORT_API_VERSION 13         /* the oldest table that has every member used here */
#define FER_ORT_LOG_ERROR 3            /* OrtLoggingLevel ORT_LOGGING_LEVEL_ERROR */
#define FER_ORT_SEQUENTIAL 0           /* ExecutionMode ORT_SEQUENTIAL */
#define FER_ORT_ENABLE_ALL 99          /* GraphOptimizationLevel ORT_ENABLE_ALL */
#define FER_ORT_ARENA_ALLOCATOR 1      /* OrtAllocatorType OrtArenaAllocator */
#define FER_ORT_MEM_DEFAULT 0          /* OrtMemType OrtMemTypeDefault */
#define FER_ORT_INVALID_ARGUMENT 2     /* OrtErrorCode ORT_INVALID_ARGUMENT */

/* OrtApi, members 0..130 (the comment of each is its index and its name in the header). */
struct fer_ort_api {
    fer_ort_status *(*create_status)(int code, const char *msg);             /* 0 CreateStatus */
    int (*get_error_code)(const fer_ort_status *st);                         /* 1 GetErrorCode */
    const char *(*get_error_message)(const fer_ort_status *st);              /* 2 GetErrorMessage */
    fer_ort_status *(*create_env)(int level, const char *logid, fer_ort_env **out); /* 3 CreateEnv */
    void *pad_4_7[4];      /* CreateEnvWithCustomLogger .. CreateSession */
    fer_ort_status *(*create_session_from_array)(const fer_ort_env *env, const void *data,
                                                 size_t len, const fer_ort_options *opts,
                                                 fer_ort_session **out); /* 8 CreateSessionFromArray */
    fer_ort_status *(*run)(fer_ort_session *sess, const void *run_options,
                           const char *const *input_names, const fer_ort_value *const *inputs,
                           size_t n_inputs, const char *const *output_names, size_t n_outputs,
                           fer_ort_value **outputs);                         /* 9 Run */
    fer_ort_status *(*create_session_options)(fer_ort_options **out);        /* 10 CreateSessionOptions */
    void *pad_11_12[2];    /* SetOptimizedModelFilePath, CloneSessionOptions */
    fer_ort_status *(*set_execution_mode)(fer_ort_options *o, int mode);     /* 13 SetSessionExecutionMode */
    void *pad_14_21[8];    /* EnableProfiling .. SetSessionLogVerbosityLevel */
    fer_ort_status *(*set_log_severity)(fer_ort_options *o, int level);      /* 22 SetSessionLogSeverityLevel */
    fer_ort_status *(*set_graph_opt_level)(fer_ort_options *o, int level);   /* 23 SetSessionGraphOptimizationLevel */
    fer_ort_status *(*set_intra_op_threads)(fer_ort_options *o, int n);      /* 24 SetIntraOpNumThreads */
    fer_ort_status *(*set_inter_op_threads)(fer_ort_options *o, int n);      /* 25 SetInterOpNumThreads */
    void *pad_26_48[23];   /* CreateCustomOpDomain .. CreateTensorAsOrtValue */
    fer_ort_status *(*create_tensor_with_data)(const fer_ort_meminfo *info, void *data,
                                               size_t len, const int64_t *shape, size_t ndim,
                                               int type, fer_ort_value **out); /* 49 CreateTensorWithDataAsOrtValue */
    void *pad_50_68[19];   /* IsTensor .. CreateMemoryInfo */
    fer_ort_status *(*create_cpu_memory_info)(int alloc_type, int mem_type,
                                              fer_ort_meminfo **out);        /* 69 CreateCpuMemoryInfo */
    void *pad_70_91[22];   /* CompareMemoryInfo .. KernelContext_GetOutput */
    void (*release_env)(fer_ort_env *p);                                     /* 92 ReleaseEnv */
    void (*release_status)(fer_ort_status *p);                               /* 93 ReleaseStatus */
    void (*release_memory_info)(fer_ort_meminfo *p);                         /* 94 ReleaseMemoryInfo */
    void (*release_session)(fer_ort_session *p);                             /* 95 ReleaseSession */
    void (*release_value)(fer_ort_value *p);                                 /* 96 ReleaseValue */
    void *pad_97_99[3];    /* ReleaseRunOptions, ReleaseTypeInfo, ReleaseTensorTypeAndShapeInfo */
    void (*release_session_options)(fer_ort_options *p);                     /* 100 ReleaseSessionOptions */
    void *pad_101_129[29]; /* ReleaseCustomOpDomain .. FillStringTensorElement */
    fer_ort_status *(*add_session_config_entry)(fer_ort_options *o, const char *key,
                                                const char *value);          /* 130 AddSessionConfigEntry */
};

/* OrtApiBase: the library's one exported entry point returns this. */
struct fer_ort_api_base {
    const struct fer_ort_api *(*get_api)(uint32_t version);
    const char *(*get_version_string)(void);
};

_Static_assert(offsetof(struct fer_ort_api, run) == 9 * sizeof(void *), "OrtApi layout: Run");
_Static_assert(offsetof(struct fer_ort_api, create_tensor_with_data) == 49 * sizeof(void *),
               "OrtApi layout: CreateTensorWithDataAsOrtValue");
_Static_assert(offsetof(struct fer_ort_api, create_cpu_memory_info) == 69 * sizeof(void *),
               "OrtApi layout: CreateCpuMemoryInfo");
_Static_assert(offsetof(struct fer_ort_api, release_env) == 92 * sizeof(void *),
               "OrtApi layout: ReleaseEnv");
_Static_assert(offsetof(struct fer_ort_api, release_session_options) == 100 * sizeof(void *),
               "OrtApi layout: ReleaseSessionOptions");
_Static_assert(offsetof(struct fer_ort_api, add_session_config_entry) == 130 * sizeof(void *),
               "OrtApi layout: AddSessionConfigEntry");

/* ---- the exec ------------------------------------------------------------------------------------
 * Invariants after a successful create:
 *   - api, env, session and mem are live until destroy; the library handle stays loaded for the
 *     process (ONNX Runtime keeps thread-local state that outlives a dlclose);
 *   - n_inputs = 2 + n_static; in_names[0] = x, [1] = t, then the statics, pointing into names;
 *   - in_vals[(n - 1) * n_inputs + i] is input i over the first n rows of its buffer and
 *     out_vals[n - 1] the output over the first n rows of v, for every n in 1..max_rows;
 *   - x, v, state are float32 rows of x_len floats, t one float a row (cfg's buffers).
 */
struct fer_exec {
    const struct fer_ort_api *api;
    fer_ort_env *env;
    fer_ort_session *session;
    fer_ort_meminfo *mem;
    uint32_t max_rows;
    uint32_t n_inputs;
    uint64_t x_len;
    float *x;
    float *t;
    float *v;
    float *state;
    fer_ort_value **in_vals;
    fer_ort_value **out_vals;
    const char *in_names[2 + FER_EXEC_MAX_STATIC];
    const char *out_name;
    char names[3 + FER_EXEC_MAX_STATIC][FER_EXEC_NAME_MAX];
    const char *version;
    char err[FER_EXEC_ERROR_MAX];
};

static size_t elem_size(uint32_t dtype)
{
    switch (dtype) {
    case FER_EXEC_UINT8:
    case FER_EXEC_INT8:
    case FER_EXEC_BOOL:
        return 1;
    case FER_EXEC_FLOAT:
    case FER_EXEC_INT32:
        return 4;
    case FER_EXEC_INT64:
    case FER_EXEC_DOUBLE:
        return 8;
    default:
        return 0;
    }
}

/* Elements of one row of t, or 0 if t breaks its invariants. */
static uint64_t tensor_elems(const struct fer_exec_tensor *t)
{
    uint64_t n = 1;
    uint32_t i;

    if (t->data == NULL || t->name[0] == '\0' || t->ndim > FER_EXEC_MAX_DIMS ||
        memchr(t->name, '\0', FER_EXEC_NAME_MAX) == NULL || elem_size(t->dtype) == 0)
        return 0;
    for (i = 0; i < t->ndim; i++) {
        if (t->dims[i] < 1)
            return 0;
        n = fer_sat_mul(n, (uint64_t)t->dims[i]);
    }
    if (n == FER_SAT || fer_sat_mul(n, elem_size(t->dtype)) != t->row_bytes)
        return 0;
    return n;
}

static int config_ok(const struct fer_exec_config *cfg)
{
    uint64_t xn, i;

    if (cfg->max_rows < 1 || cfg->max_rows > FER_EXEC_MAX_ROWS || cfg->intra_op_threads < 1 ||
        cfg->n_static > FER_EXEC_MAX_STATIC || cfg->state == NULL)
        return 0;
    xn = tensor_elems(&cfg->x);
    if (xn == 0 || cfg->x.dtype != FER_EXEC_FLOAT || tensor_elems(&cfg->v) != xn ||
        cfg->v.dtype != FER_EXEC_FLOAT || cfg->v.ndim != cfg->x.ndim ||
        memcmp(cfg->v.dims, cfg->x.dims, cfg->x.ndim * sizeof(int64_t)) != 0)
        return 0;
    if (tensor_elems(&cfg->t) != 1 || cfg->t.dtype != FER_EXEC_FLOAT)
        return 0;
    for (i = 0; i < cfg->n_static; i++)
        if (tensor_elems(&cfg->statics[i]) == 0)
            return 0;
    return 1;
}

/* Copies why `st` failed into exec->err, releases st; returns FER_EXEC_EORT. */
static int ort_fail(struct fer_exec *e, fer_ort_status *st, const char *what)
{
    snprintf(e->err, sizeof(e->err), "%s: %s", what, e->api->get_error_message(st));
    e->api->release_status(st);
    return FER_EXEC_EORT;
}

#define FER_ORT_TRY(e, call, what)                                                               \
    do {                                                                                         \
        fer_ort_status *st_ = (call);                                                            \
        if (st_ != NULL)                                                                         \
            return ort_fail((e), st_, (what));                                                   \
    } while (0)

static void set_err(struct fer_exec *e, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(e->err, sizeof(e->err), fmt, ap);
    va_end(ap);
}

/* The library and its API table; FER_EXEC_ELIB with e->err set if either is missing or the table
 * fails the status round trip. */
static int load_api(struct fer_exec *e, const char *lib_path)
{
    const struct fer_ort_api_base *(*get_base)(void);
    const struct fer_ort_api_base *base;
    fer_ort_status *st;
    void *dl;
    int ok;

    dl = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        set_err(e, "cannot load ONNX Runtime from %s: %s", lib_path, dlerror());
        return FER_EXEC_ELIB;
    }
    *(void **)(&get_base) = dlsym(dl, "OrtGetApiBase");
    base = get_base != NULL ? get_base() : NULL;
    e->api = base != NULL ? base->get_api(FER_ORT_API_VERSION) : NULL;
    if (e->api == NULL) {
        set_err(e, "%s: no OrtGetApiBase, or no C API version %d", lib_path, FER_ORT_API_VERSION);
        return FER_EXEC_ELIB;
    }
    e->version = base->get_version_string();
    st = e->api->create_status(FER_ORT_INVALID_ARGUMENT, "fer");
    ok = st != NULL && e->api->get_error_code(st) == FER_ORT_INVALID_ARGUMENT &&
         strcmp(e->api->get_error_message(st), "fer") == 0;
    if (st != NULL)
        e->api->release_status(st);
    if (!ok) {
        set_err(e, "%s: the C API table does not behave as expected", lib_path);
        e->api = NULL;
        return FER_EXEC_ELIB;
    }
    return FER_OK;
}

/* The session options of model._session_options. */
static int make_session(struct fer_exec *e, const void *model, uint64_t len, uint32_t threads,
                        const char *affinities)
{
    const struct fer_ort_api *a = e->api;
    fer_ort_options *o = NULL;
    fer_ort_status *st;

    FER_ORT_TRY(e, a->create_env(FER_ORT_LOG_ERROR, "flowedge_exec", &e->env), "CreateEnv");
    FER_ORT_TRY(e, a->create_session_options(&o), "CreateSessionOptions");
    st = a->set_intra_op_threads(o, (int)threads);
    if (st == NULL)
        st = a->set_inter_op_threads(o, 1);
    if (st == NULL)
        st = a->set_execution_mode(o, FER_ORT_SEQUENTIAL);
    if (st == NULL)
        st = a->set_graph_opt_level(o, FER_ORT_ENABLE_ALL);
    if (st == NULL)
        st = a->set_log_severity(o, FER_ORT_LOG_ERROR);
    if (st == NULL && threads > 1)  /* spinning pool threads steal the other workers' cores */
        st = a->add_session_config_entry(o, "session.intra_op.allow_spinning", "0");
    if (st == NULL && threads > 1 && affinities != NULL && affinities[0] != '\0')
        st = a->add_session_config_entry(o, "session.intra_op_thread_affinities", affinities);
    if (st == NULL)
        st = a->create_session_from_array(e->env, model, (size_t)len, o, &e->session);
    a->release_session_options(o);
    if (st != NULL)
        return ort_fail(e, st, "session");
    FER_ORT_TRY(e, a->create_cpu_memory_info(FER_ORT_ARENA_ALLOCATOR, FER_ORT_MEM_DEFAULT, &e->mem),
                "CreateCpuMemoryInfo");
    return FER_OK;
}

/* The OrtValue of tensor t over its first n rows. */
static int make_value(struct fer_exec *e, const struct fer_exec_tensor *t, uint32_t n,
                      fer_ort_value **out)
{
    int64_t shape[1 + FER_EXEC_MAX_DIMS];

    shape[0] = n;
    memcpy(&shape[1], t->dims, t->ndim * sizeof(int64_t));
    FER_ORT_TRY(e, e->api->create_tensor_with_data(e->mem, t->data, (size_t)(t->row_bytes * n),
                                                   shape, 1 + t->ndim, (int)t->dtype, out),
                t->name);
    return FER_OK;
}

static int make_values(struct fer_exec *e, const struct fer_exec_config *cfg)
{
    uint32_t n, i;
    int rc;

    e->in_vals = calloc((size_t)cfg->max_rows * e->n_inputs, sizeof(*e->in_vals));
    e->out_vals = calloc(cfg->max_rows, sizeof(*e->out_vals));
    if (e->in_vals == NULL || e->out_vals == NULL)
        return FER_ENOMEM;
    for (n = 1; n <= cfg->max_rows; n++) {
        fer_ort_value **in = &e->in_vals[(size_t)(n - 1) * e->n_inputs];
        if ((rc = make_value(e, &cfg->x, n, &in[0])) != FER_OK ||
            (rc = make_value(e, &cfg->t, n, &in[1])) != FER_OK ||
            (rc = make_value(e, &cfg->v, n, &e->out_vals[n - 1])) != FER_OK)
            return rc;
        for (i = 0; i < cfg->n_static; i++)
            if ((rc = make_value(e, &cfg->statics[i], n, &in[2 + i])) != FER_OK)
                return rc;
    }
    return FER_OK;
}

/* One Run over the first n rows. FER_OK or FER_EXEC_EORT. */
static int run_rows(struct fer_exec *e, uint32_t n)
{
    const fer_ort_value *const *in =
        (const fer_ort_value *const *)&e->in_vals[(size_t)(n - 1) * e->n_inputs];

    FER_ORT_TRY(e, e->api->run(e->session, NULL, e->in_names, in, e->n_inputs, &e->out_name, 1,
                               &e->out_vals[n - 1]),
                "Run");
    return FER_OK;
}

static int create(struct fer_exec *e, const char *lib_path, const void *model, uint64_t len,
                  const struct fer_exec_config *cfg)
{
    const struct fer_exec_tensor *named[3 + FER_EXEC_MAX_STATIC];
    uint32_t i;
    int rc;

    if ((rc = load_api(e, lib_path)) != FER_OK)
        return rc;
    rc = make_session(e, model, len, cfg->intra_op_threads, cfg->intra_op_affinities);
    if (rc != FER_OK)
        return rc;
    e->max_rows = cfg->max_rows;
    e->n_inputs = 2 + cfg->n_static;
    e->x_len = cfg->x.row_bytes / sizeof(float);
    e->x = cfg->x.data;
    e->t = cfg->t.data;
    e->v = cfg->v.data;
    e->state = cfg->state;
    named[0] = &cfg->x;
    named[1] = &cfg->t;
    for (i = 0; i < cfg->n_static; i++)
        named[2 + i] = &cfg->statics[i];
    named[e->n_inputs] = &cfg->v;
    for (i = 0; i <= e->n_inputs; i++) {
        memcpy(e->names[i], named[i]->name, FER_EXEC_NAME_MAX);
        if (i < e->n_inputs)
            e->in_names[i] = e->names[i];
    }
    e->out_name = e->names[e->n_inputs];
    if ((rc = make_values(e, cfg)) != FER_OK)
        return rc;
    /* A first run proves the names and shapes now (and takes ORT's first-run cost here). */
    if ((rc = run_rows(e, 1)) != FER_OK)
        return rc;
    return cfg->max_rows > 1 ? run_rows(e, cfg->max_rows) : FER_OK;
}

int fer_exec_create(const char *lib_path, const void *model, uint64_t model_len,
                    const struct fer_exec_config *cfg, struct fer_exec **out, char *err,
                    uint64_t err_len)
{
    struct fer_exec *e;
    int rc;

    if (out != NULL)
        *out = NULL;
    if (err != NULL && err_len > 0)
        err[0] = '\0';
    FER_CHECK_ARGS(lib_path != NULL && model != NULL && model_len > 0 && cfg != NULL &&
                   out != NULL && config_ok(cfg));
    e = calloc(1, sizeof(*e));
    if (e == NULL)
        return FER_ENOMEM;
    rc = create(e, lib_path, model, model_len, cfg);
    if (rc != FER_OK) {
        if (err != NULL && err_len > 0)
            snprintf(err, (size_t)err_len, "%s", rc == FER_ENOMEM ? "out of memory" : e->err);
        fer_exec_destroy(e);
        return rc;
    }
    *out = e;
    return FER_OK;
}

/* What load_api and make_session made (each accepts NULL); the library stays loaded. */
static void release_ort(struct fer_exec *e)
{
    if (e->api == NULL)
        return;
    e->api->release_memory_info(e->mem);
    e->api->release_session(e->session);
    e->api->release_env(e->env);
}

void fer_exec_destroy(struct fer_exec *e)
{
    size_t i;

    if (e == NULL)
        return;
    if (e->api != NULL) {
        if (e->in_vals != NULL)
            for (i = 0; i < (size_t)e->max_rows * e->n_inputs; i++)
                e->api->release_value(e->in_vals[i]);  /* ReleaseValue accepts NULL */
        if (e->out_vals != NULL)
            for (i = 0; i < e->max_rows; i++)
                e->api->release_value(e->out_vals[i]);
    }
    release_ort(e);
    free(e->in_vals);
    free(e->out_vals);
    free(e);
}

const char *fer_exec_last_error(const struct fer_exec *e)
{
    return e != NULL ? e->err : "";
}

const char *fer_exec_ort_version(const struct fer_exec *e)
{
    return e != NULL && e->version != NULL ? e->version : "";
}

/* ---- the prefix pass ---------------------------------------------------------------------------
 * A pass reuses the exec's ORT part: `ort` is an exec of which only api, env, session, mem,
 * version and err are used (load_api, make_session, make_value, ort_fail, release_ort), so the
 * library, the session options and the error reporting are the step loop's.
 * Invariants after a successful create: n_values = n_inputs + n_outputs; vals[k * n_values + i]
 * is tensor i (inputs first, then outputs) over rows [first, first + n) for the k-th (first, n)
 * in the order first = 0..max_rows-1, n = 1..max_rows-first (pair_index); names as in the exec.
 */
struct fer_pass {
    struct fer_exec ort;
    uint32_t max_rows;
    uint32_t n_inputs;
    uint32_t n_outputs;
    uint32_t n_values;
    fer_ort_value **vals;
    const char *in_names[FER_PASS_MAX_TENSORS];
    const char *out_names[FER_PASS_MAX_TENSORS];
    char names[2 * FER_PASS_MAX_TENSORS][FER_EXEC_NAME_MAX];
};

/* Rows (first, n) in max_rows: sum over f < first of (max_rows - f), plus n - 1. */
static size_t pair_index(uint32_t max_rows, uint32_t first, uint32_t n)
{
    return (size_t)first * max_rows - (size_t)first * (first - 1u) / 2u + n - 1u;
}

static int pass_config_ok(const struct fer_pass_config *cfg)
{
    uint32_t i;

    if (cfg->max_rows < 1 || cfg->max_rows > FER_PASS_MAX_ROWS || cfg->intra_op_threads < 1 ||
        cfg->n_inputs < 1 || cfg->n_inputs > FER_PASS_MAX_TENSORS || cfg->n_outputs < 1 ||
        cfg->n_outputs > FER_PASS_MAX_TENSORS)
        return 0;
    for (i = 0; i < cfg->n_inputs; i++)
        if (tensor_elems(&cfg->inputs[i]) == 0)
            return 0;
    for (i = 0; i < cfg->n_outputs; i++)
        if (tensor_elems(&cfg->outputs[i]) == 0)
            return 0;
    return 1;
}

/* tensor t's OrtValue over rows [first, first + n). */
static int make_rows_value(struct fer_exec *e, const struct fer_exec_tensor *t, uint32_t first,
                           uint32_t n, fer_ort_value **out)
{
    struct fer_exec_tensor at = *t;

    at.data = (char *)t->data + (size_t)first * t->row_bytes;
    return make_value(e, &at, n, out);
}

static int pass_make(struct fer_pass *p, const char *lib_path, const void *model, uint64_t len,
                     const struct fer_pass_config *cfg)
{
    uint32_t i, first, n, m = cfg->max_rows;
    size_t pairs = (size_t)m * (m + 1u) / 2u;
    int rc;

    if ((rc = load_api(&p->ort, lib_path)) != FER_OK)
        return rc;
    if ((rc = make_session(&p->ort, model, len, cfg->intra_op_threads,
                           cfg->intra_op_affinities)) != FER_OK)
        return rc;
    p->max_rows = m;
    p->n_inputs = cfg->n_inputs;
    p->n_outputs = cfg->n_outputs;
    p->n_values = cfg->n_inputs + cfg->n_outputs;
    for (i = 0; i < p->n_values; i++) {
        const struct fer_exec_tensor *t =
            i < p->n_inputs ? &cfg->inputs[i] : &cfg->outputs[i - p->n_inputs];
        memcpy(p->names[i], t->name, FER_EXEC_NAME_MAX);
        if (i < p->n_inputs)
            p->in_names[i] = p->names[i];
        else
            p->out_names[i - p->n_inputs] = p->names[i];
    }
    p->vals = calloc(pairs * p->n_values, sizeof(*p->vals));
    if (p->vals == NULL)
        return FER_ENOMEM;
    for (first = 0; first < m; first++)
        for (n = 1; n <= m - first; n++) {
            fer_ort_value **v = &p->vals[pair_index(m, first, n) * p->n_values];
            for (i = 0; i < p->n_values; i++) {
                const struct fer_exec_tensor *t =
                    i < p->n_inputs ? &cfg->inputs[i] : &cfg->outputs[i - p->n_inputs];
                if ((rc = make_rows_value(&p->ort, t, first, n, &v[i])) != FER_OK)
                    return rc;
            }
        }
    if ((rc = fer_pass_run(p, 0, 1)) != FER_OK)
        return rc;
    return m > 1 ? fer_pass_run(p, 0, m) : FER_OK;
}

int fer_pass_create(const char *lib_path, const void *model, uint64_t model_len,
                    const struct fer_pass_config *cfg, struct fer_pass **out, char *err,
                    uint64_t err_len)
{
    struct fer_pass *p;
    int rc;

    if (out != NULL)
        *out = NULL;
    if (err != NULL && err_len > 0)
        err[0] = '\0';
    FER_CHECK_ARGS(lib_path != NULL && model != NULL && model_len > 0 && cfg != NULL &&
                   out != NULL && pass_config_ok(cfg));
    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return FER_ENOMEM;
    rc = pass_make(p, lib_path, model, model_len, cfg);
    if (rc != FER_OK) {
        if (err != NULL && err_len > 0)
            snprintf(err, (size_t)err_len, "%s",
                     rc == FER_ENOMEM ? "out of memory" : p->ort.err);
        fer_pass_destroy(p);
        return rc;
    }
    *out = p;
    return FER_OK;
}

void fer_pass_destroy(struct fer_pass *p)
{
    size_t i, n;

    if (p == NULL)
        return;
    if (p->ort.api != NULL && p->vals != NULL) {
        n = (size_t)p->max_rows * (p->max_rows + 1u) / 2u * p->n_values;
        for (i = 0; i < n; i++)
            p->ort.api->release_value(p->vals[i]);  /* ReleaseValue accepts NULL */
    }
    release_ort(&p->ort);
    free(p->vals);
    free(p);
}

const char *fer_pass_last_error(const struct fer_pass *p)
{
    return p != NULL ? p->ort.err : "";
}

int fer_pass_run(struct fer_pass *p, uint32_t first, uint32_t n_rows)
{
    fer_ort_value **v;

    FER_CHECK_ARGS(p != NULL && n_rows >= 1 && n_rows <= p->max_rows &&
                   first <= p->max_rows - n_rows);
    v = &p->vals[pair_index(p->max_rows, first, n_rows) * p->n_values];
    FER_ORT_TRY(&p->ort, p->ort.api->run(p->ort.session, NULL, p->in_names,
                                          (const fer_ort_value *const *)v, p->n_inputs,
                                          p->out_names, p->n_outputs, &v[p->n_inputs]),
                "Run");
    return FER_OK;
}

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;

    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int fer_pass_run_done(struct fer_pass *p, struct fer_core *core, const uint32_t *lanes,
                      uint32_t first, uint32_t n_rows, int32_t *results, uint64_t *times)
{
    uint64_t start, end;
    uint32_t r;
    int rc;

    FER_CHECK_ARGS(core != NULL && lanes != NULL && results != NULL && times != NULL);
    start = clock_ns(CLOCK_MONOTONIC);
    if ((rc = fer_pass_run(p, first, n_rows)) != FER_OK)
        return rc;
    end = clock_ns(CLOCK_MONOTONIC);
    times[0] = end;
    times[1] = end - start;
    for (r = 0; r < n_rows; r++)
        results[r] = (int32_t)fer_core_prefix_done(core, lanes[r], end, end - start);
    return FER_OK;
}

/* ---- the loop ------------------------------------------------------------------------------- */

/* Field 2 of /proc/thread-self/schedstat (ns runnable, not running); 0 without it. */
static int64_t runqueue_ns(int fd)
{
    char buf[96];
    ssize_t n;
    char *p;

    if (fd < 0 || (n = pread(fd, buf, sizeof(buf) - 1, 0)) <= 0)
        return 0;
    buf[n] = '\0';
    p = strchr(buf, ' ');
    return p != NULL ? (int64_t)strtoll(p + 1, NULL, 10) : 0;
}

/* Probe instant `point` of the current probe row (bench only). */
static void probe_mark(const struct fer_exec_report *r, int point)
{
    int64_t *row;

    if (r->probe == NULL)
        return;
    row = &r->probe[((*r->probe_count % r->probe_rows) * 5 + (uint64_t)point) * 3];
    row[0] = (int64_t)clock_ns(CLOCK_MONOTONIC);
    row[1] = (int64_t)clock_ns(CLOCK_THREAD_CPUTIME_ID);
    row[2] = runqueue_ns(r->probe_fd);
}

/* model.FlowIntegrator._advance for one row, in float32, operation for operation:
 *   MID_HALF: tmp = v * half_dt; x = state + tmp
 *   else:     tmp = v * dt; state = state + tmp; x = state
 * Each product is rounded to float before the sum (-ffp-contract=off keeps it from becoming an
 * FMA), exactly as numpy's two separate float32 ufuncs round. */
static void advance(float *restrict state, float *restrict x, const float *restrict v,
                    uint64_t len, int kind, float dt, float half_dt)
{
    uint64_t i;

    if (kind == FER_EXEC_MID_HALF) {
        for (i = 0; i < len; i++) {
            float tmp = v[i] * half_dt;
            x[i] = state[i] + tmp;
        }
    } else {
        for (i = 0; i < len; i++) {
            float tmp = v[i] * dt;
            state[i] = state[i] + tmp;
            x[i] = state[i];
        }
    }
}

int fer_exec_time_runs(struct fer_exec *e, uint32_t n_rows, uint32_t runs, uint64_t *ns)
{
    uint32_t i;
    int rc;

    FER_CHECK_ARGS(e != NULL && ns != NULL && n_rows >= 1 && n_rows <= e->max_rows);
    for (i = 0; i < runs; i++) {
        uint64_t start = clock_ns(CLOCK_MONOTONIC);

        if ((rc = run_rows(e, n_rows)) != FER_OK)
            return rc;
        ns[i] = clock_ns(CLOCK_MONOTONIC) - start;
    }
    return FER_OK;
}

static int rows_ok(const struct fer_exec *e, const struct fer_core *core,
                   const struct fer_exec_row *rows, uint32_t n)
{
    uint32_t r, q;

    if (core == NULL || rows == NULL || n < 1 || n > e->max_rows)
        return 0;
    for (r = 0; r < n; r++) {
        if (rows[r].next >= rows[r].total || rows[r].times == NULL || rows[r].kinds == NULL)
            return 0;
        for (q = 0; q < r; q++)
            if (rows[q].lane == rows[r].lane)
                return 0;
    }
    return 1;
}

static int report_ok(const struct fer_exec_report *r)
{
    return r != NULL && r->nfe_ring != NULL && r->ring_len > 0 && r->nfe_count != NULL &&
           r->last_progress_ns != NULL && r->step_count != NULL &&
           (r->probe == NULL || (r->probe_rows > 0 && r->probe_count != NULL));
}

int fer_exec_run(struct fer_exec *e, struct fer_core *core, struct fer_exec_row *rows,
                 uint32_t n_rows, const uint32_t *stop_flag, const uint64_t *fault_delay_ns,
                 uint32_t flags, const struct fer_exec_report *rep)
{
    FER_CHECK_ARGS(e != NULL && stop_flag != NULL && report_ok(rep) &&
                   rows_ok(e, core, rows, n_rows));
    for (;;) {
        uint64_t start, end, step, delay;
        uint32_t r;
        int ended = 0, rc;

        if (__atomic_load_n(stop_flag, __ATOMIC_RELAXED) != 0)
            return FER_EXEC_STOPPED;
        for (r = 0; r < n_rows; r++)
            if (rows[r].next >= rows[r].total)  /* CONTINUE with no NFE left: core and plan differ */
                return FER_EINVAL;
        probe_mark(rep, 0);
        start = clock_ns(CLOCK_MONOTONIC);
        for (r = 0; r < n_rows; r++)
            e->t[r] = rows[r].times[rows[r].next];
        probe_mark(rep, 1);
        if ((rc = run_rows(e, n_rows)) != FER_OK)
            return rc;
        probe_mark(rep, 2);
        for (r = 0; r < n_rows; r++) {
            struct fer_exec_row *w = &rows[r];
            advance(&e->state[r * e->x_len], &e->x[r * e->x_len], &e->v[r * e->x_len], e->x_len,
                    w->kinds[w->next], w->dt, w->half_dt);
            w->next++;
        }
        probe_mark(rep, 3);
        delay = fault_delay_ns != NULL ? __atomic_load_n(fault_delay_ns, __ATOMIC_RELAXED) : 0;
        if (delay != 0) {
            struct timespec d = {(time_t)(delay / 1000000000u), (long)(delay % 1000000000u)};
            while (clock_nanosleep(CLOCK_MONOTONIC, 0, &d, &d) == EINTR)
                ;
        }
        end = clock_ns(CLOCK_MONOTONIC);
        step = __atomic_load_n(rep->step_count, __ATOMIC_RELAXED);
        rep->nfe_ring[step % rep->ring_len] = (int64_t)(end - start);
        if (rep->step_rows != NULL)
            rep->step_rows[step % rep->ring_len] = (int32_t)n_rows;
        __atomic_store_n(rep->step_count, step + 1, __ATOMIC_RELAXED);
        __atomic_store_n(rep->nfe_count, __atomic_load_n(rep->nfe_count, __ATOMIC_RELAXED) + n_rows,
                         __ATOMIC_RELAXED);
        for (r = 0; r < n_rows; r++) {
            rc = fer_core_step(core, rows[r].lane, end, end - start);
            rows[r].result = rc;
            if (rc < 0)
                return rc;
            ended |= rc != FER_STEP_CONTINUE;
        }
        __atomic_store_n(rep->last_progress_ns, end, __ATOMIC_RELAXED);
        if (rep->probe != NULL) {
            probe_mark(rep, 4);
            __atomic_store_n(rep->probe_count, *rep->probe_count + 1, __ATOMIC_RELAXED);
        }
        if (ended)
            return FER_EXEC_ROWS_ENDED;
        if (flags & FER_EXEC_ONE_STEP)
            return FER_EXEC_YIELDED;
        if ((flags & FER_EXEC_JOIN) && n_rows < e->max_rows && fer_core_queued(core) > 0)
            return FER_EXEC_JOINABLE;
    }
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_ort.c - the slice of ONNX Runtime's C API the core uses (fer_ort.h): the library loaded at
 * create, the session, OrtValues over caller-owned rows, Run, statuses turned into messages, and
 * the one create / destroy scaffold of the exec (fer_exec.c) and the prefix pass (fer_pass.c).
 *
 * ONNX Runtime is not linked. It is reached through the function table
 * OrtGetApiBase()->GetApi(version) returns, from a library dlopen()ed at create. Only the table's
 * layout is needed, not its header: the table is append-only across releases (a member's index
 * never changes), so fer_ort_api below declares the members the core calls at their indices in
 * include/onnxruntime/core/session/onnxruntime_c_api.h (ONNX Runtime, Copyright (c) Microsoft
 * Corporation, MIT License), checked against the API 13 header and run against 1.32.0; the
 * members in between are padding. Create checks the table with a status round trip
 * (CreateStatus / GetErrorCode / GetErrorMessage / ReleaseStatus) before anything else uses it.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fer_internal.h"
#include "fer_tensor.h"
#include "fer_ort.h"

_Static_assert(FER_ORT_ERROR_MAX == FER_EXEC_ERROR_MAX, "fer_ort.h and fer_tensor.h: err size");

/* ---- the slice of the ONNX Runtime C API the core uses --------------------------------------- */
typedef struct fer_ort_opaque fer_ort_status;  /* OrtStatus; NULL means success */
typedef struct fer_ort_opaque fer_ort_env;
typedef struct fer_ort_opaque fer_ort_session;
typedef struct fer_ort_opaque fer_ort_options;
typedef struct fer_ort_opaque fer_ort_meminfo;

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

/* ---- statuses into messages ------------------------------------------------------------------ */

/* Copies why `st` failed into o->err, releases st; returns FER_EXEC_EORT. */
static int ort_fail(struct fer_ort *o, fer_ort_status *st, const char *what)
{
    snprintf(o->err, sizeof(o->err), "%s: %s", what, o->api->get_error_message(st));
    o->api->release_status(st);
    return FER_EXEC_EORT;
}

#define FER_ORT_TRY(o, call, what)                                                               \
    do {                                                                                         \
        fer_ort_status *st_ = (call);                                                            \
        if (st_ != NULL)                                                                         \
            return ort_fail((o), st_, (what));                                                   \
    } while (0)

static void set_err(struct fer_ort *o, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(o->err, sizeof(o->err), fmt, ap);
    va_end(ap);
}

/* ---- the library and the session ------------------------------------------------------------- */

/* The library and its API table; FER_EXEC_ELIB with o->err set if either is missing or the table
 * fails the status round trip. */
static int load_api(struct fer_ort *o, const char *lib_path)
{
    const struct fer_ort_api_base *(*get_base)(void);
    const struct fer_ort_api_base *base;
    fer_ort_status *st;
    void *dl;
    int ok;

    dl = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        set_err(o, "cannot load ONNX Runtime from %s: %s", lib_path, dlerror());
        return FER_EXEC_ELIB;
    }
    *(void **)(&get_base) = dlsym(dl, "OrtGetApiBase");
    base = get_base != NULL ? get_base() : NULL;
    o->api = base != NULL ? base->get_api(FER_ORT_API_VERSION) : NULL;
    if (o->api == NULL) {
        set_err(o, "%s: no OrtGetApiBase, or no C API version %d", lib_path, FER_ORT_API_VERSION);
        return FER_EXEC_ELIB;
    }
    o->version = base->get_version_string();
    st = o->api->create_status(FER_ORT_INVALID_ARGUMENT, "fer");
    ok = st != NULL && o->api->get_error_code(st) == FER_ORT_INVALID_ARGUMENT &&
         strcmp(o->api->get_error_message(st), "fer") == 0;
    if (st != NULL)
        o->api->release_status(st);
    if (!ok) {
        set_err(o, "%s: the C API table does not behave as expected", lib_path);
        o->api = NULL;
        return FER_EXEC_ELIB;
    }
    return FER_OK;
}

/* The session options of model._session_options. */
static int make_session(struct fer_ort *o, const void *model, uint64_t len, uint32_t threads,
                        const char *affinities)
{
    const struct fer_ort_api *a = o->api;
    fer_ort_options *opts = NULL;
    fer_ort_status *st;

    FER_ORT_TRY(o, a->create_env(FER_ORT_LOG_ERROR, "flowedge_exec", &o->env), "CreateEnv");
    FER_ORT_TRY(o, a->create_session_options(&opts), "CreateSessionOptions");
    st = a->set_intra_op_threads(opts, (int)threads);
    if (st == NULL)
        st = a->set_inter_op_threads(opts, 1);
    if (st == NULL)
        st = a->set_execution_mode(opts, FER_ORT_SEQUENTIAL);
    if (st == NULL)
        st = a->set_graph_opt_level(opts, FER_ORT_ENABLE_ALL);
    if (st == NULL)
        st = a->set_log_severity(opts, FER_ORT_LOG_ERROR);
    if (st == NULL && threads > 1)  /* spinning pool threads steal the other workers' cores */
        st = a->add_session_config_entry(opts, "session.intra_op.allow_spinning", "0");
    if (st == NULL && threads > 1 && affinities != NULL && affinities[0] != '\0')
        st = a->add_session_config_entry(opts, "session.intra_op_thread_affinities", affinities);
    if (st == NULL)
        st = a->create_session_from_array(o->env, model, (size_t)len, opts, &o->session);
    a->release_session_options(opts);
    if (st != NULL)
        return ort_fail(o, st, "session");
    FER_ORT_TRY(o, a->create_cpu_memory_info(FER_ORT_ARENA_ALLOCATOR, FER_ORT_MEM_DEFAULT, &o->mem),
                "CreateCpuMemoryInfo");
    return FER_OK;
}

/* ---- the create scaffold --------------------------------------------------------------------- */

int fer_ort_create(const struct fer_ort_kind *kind, const char *lib_path, const void *model,
                   uint64_t model_len, const void *cfg, void **out, char *err, uint64_t err_len)
{
    struct fer_ort *o;
    int rc;

    if (out != NULL)
        *out = NULL;
    if (err != NULL && err_len > 0)
        err[0] = '\0';
    FER_CHECK_ARGS(lib_path != NULL && model != NULL && model_len > 0 && cfg != NULL &&
                   out != NULL && kind->config_ok(cfg));
    o = calloc(1, kind->size);
    if (o == NULL)
        return FER_ENOMEM;
    if ((rc = load_api(o, lib_path)) == FER_OK &&
        (rc = make_session(o, model, model_len, kind->intra_op_threads(cfg),
                           kind->intra_op_affinities(cfg))) == FER_OK)
        rc = kind->build(o, cfg);
    if (rc != FER_OK) {
        if (err != NULL && err_len > 0)
            snprintf(err, (size_t)err_len, "%s", rc == FER_ENOMEM ? "out of memory" : o->err);
        fer_ort_destroy(o);
        return rc;
    }
    *out = o;
    return FER_OK;
}

void fer_ort_destroy(struct fer_ort *o)
{
    size_t i;

    if (o == NULL)
        return;
    if (o->api != NULL) {
        if (o->vals != NULL)
            for (i = 0; i < o->n_vals; i++)
                o->api->release_value(o->vals[i]);  /* ReleaseValue accepts NULL */
        o->api->release_memory_info(o->mem);       /* each Release accepts NULL */
        o->api->release_session(o->session);
        o->api->release_env(o->env);
    }
    free(o->vals);
    free(o);
}

/* ---- values and runs ------------------------------------------------------------------------- */

int fer_ort_values(struct fer_ort *o, size_t n)
{
    o->vals = calloc(n, sizeof(*o->vals));
    if (o->vals == NULL)
        return FER_ENOMEM;
    o->n_vals = n;
    return FER_OK;
}

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

uint64_t fer_ort_tensor_elems(const struct fer_exec_tensor *t)
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

int fer_ort_rows_value(struct fer_ort *o, const struct fer_exec_tensor *t, uint32_t first,
                       uint32_t n, fer_ort_value **out)
{
    int64_t shape[1 + FER_EXEC_MAX_DIMS];

    shape[0] = n;
    memcpy(&shape[1], t->dims, t->ndim * sizeof(int64_t));
    FER_ORT_TRY(o, o->api->create_tensor_with_data(o->mem,
                                                   (char *)t->data + (size_t)first * t->row_bytes,
                                                   (size_t)(t->row_bytes * n), shape, 1 + t->ndim,
                                                   (int)t->dtype, out),
                t->name);
    return FER_OK;
}

int fer_ort_run(struct fer_ort *o, const char *const *in_names, const fer_ort_value *const *in,
                size_t n_in, const char *const *out_names, size_t n_out, fer_ort_value **out)
{
    FER_ORT_TRY(o, o->api->run(o->session, NULL, in_names, in, n_in, out_names, n_out, out), "Run");
    return FER_OK;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_exec.c - the native NFE loop (fer_exec.h): the exec's session over the caller's rows, the
 * solver update and fer_core_step, one step after another without the Python interpreter.
 *
 * ONNX Runtime (the library, the session, OrtValues, Run, error messages) is fer_ort.c's; an exec
 * is a struct fer_ort plus the step graph's names and the values of every row count, made by
 * fer_ort.c's create scaffold (which the prefix pass, fer_pass.c, shares).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fer_internal.h"
#include "fer_tensor.h"
#include "fer_exec.h"
#include "fer_ort.h"

/* ---- the exec ------------------------------------------------------------------------------------
 * Invariants after a successful create:
 *   - ort is fer_ort.h's (first member: the scaffold allocates and frees the exec through it);
 *   - n_inputs = 2 + n_static; in_names[0] = x, [1] = t, then the statics, pointing into names;
 *   - ort.vals holds max_rows x n_inputs input values, then max_rows output values:
 *     in_vals[(n - 1) * n_inputs + i] is input i over the first n rows of its buffer and
 *     out_vals[n - 1] the output over the first n rows of v, for every n in 1..max_rows;
 *   - x, v, state are float32 rows of x_len floats, t one float a row (cfg's buffers).
 */
struct fer_exec {
    struct fer_ort ort;
    uint32_t max_rows;
    uint32_t n_inputs;
    uint64_t x_len;
    uint32_t t_cols;     /* t floats per row: 1, or one per action row */
    uint32_t rtc_mode;   /* FER_EXEC_RTC_* */
    uint32_t action_dim;
    float clean_time;
    float *x;
    float *t;
    float *v;
    float *state;
    fer_ort_value **in_vals;
    fer_ort_value **out_vals;
    const char *in_names[2 + FER_EXEC_MAX_STATIC];
    const char *out_name;
    char names[3 + FER_EXEC_MAX_STATIC][FER_EXEC_NAME_MAX];
};

_Static_assert(offsetof(struct fer_exec, ort) == 0, "struct fer_ort first (fer_ort.h)");

static int config_ok(const void *arg)
{
    const struct fer_exec_config *cfg = arg;
    uint64_t xn, tn, i;

    if (cfg->max_rows < 1 || cfg->max_rows > FER_EXEC_MAX_ROWS || cfg->intra_op_threads < 1 ||
        cfg->n_static > FER_EXEC_MAX_STATIC || cfg->state == NULL)
        return 0;
    xn = fer_ort_tensor_elems(&cfg->x);
    if (xn == 0 || cfg->x.dtype != FER_EXEC_FLOAT || fer_ort_tensor_elems(&cfg->v) != xn ||
        cfg->v.dtype != FER_EXEC_FLOAT || cfg->v.ndim != cfg->x.ndim ||
        memcmp(cfg->v.dims, cfg->x.dims, cfg->x.ndim * sizeof(int64_t)) != 0)
        return 0;
    tn = fer_ort_tensor_elems(&cfg->t);
    if (tn == 0 || cfg->t.dtype != FER_EXEC_FLOAT || cfg->rtc_mode > FER_EXEC_RTC_INPAINT)
        return 0;
    if ((tn > 1 || cfg->rtc_mode != FER_EXEC_RTC_OFF) &&
        (cfg->action_dim == 0 || xn % cfg->action_dim != 0 ||
         (cfg->clean_time != 0.0f && cfg->clean_time != 1.0f)))
        return 0;
    if (tn > 1 && tn * cfg->action_dim != xn)
        return 0;
    for (i = 0; i < cfg->n_static; i++)
        if (fer_ort_tensor_elems(&cfg->statics[i]) == 0)
            return 0;
    return 1;
}

static uint32_t intra_op_threads(const void *cfg)
{
    return ((const struct fer_exec_config *)cfg)->intra_op_threads;
}

static const char *intra_op_affinities(const void *cfg)
{
    return ((const struct fer_exec_config *)cfg)->intra_op_affinities;
}

static int make_values(struct fer_exec *e, const struct fer_exec_config *cfg)
{
    uint32_t n, i;
    int rc;

    if ((rc = fer_ort_values(&e->ort, (size_t)cfg->max_rows * (e->n_inputs + 1u))) != FER_OK)
        return rc;
    e->in_vals = e->ort.vals;
    e->out_vals = &e->ort.vals[(size_t)cfg->max_rows * e->n_inputs];
    for (n = 1; n <= cfg->max_rows; n++) {
        fer_ort_value **in = &e->in_vals[(size_t)(n - 1) * e->n_inputs];
        if ((rc = fer_ort_rows_value(&e->ort, &cfg->x, 0, n, &in[0])) != FER_OK ||
            (rc = fer_ort_rows_value(&e->ort, &cfg->t, 0, n, &in[1])) != FER_OK ||
            (rc = fer_ort_rows_value(&e->ort, &cfg->v, 0, n, &e->out_vals[n - 1])) != FER_OK)
            return rc;
        for (i = 0; i < cfg->n_static; i++)
            if ((rc = fer_ort_rows_value(&e->ort, &cfg->statics[i], 0, n, &in[2 + i])) != FER_OK)
                return rc;
    }
    return FER_OK;
}

/* One Run over the first n rows. FER_OK or FER_EXEC_EORT. */
static int run_rows(struct fer_exec *e, uint32_t n)
{
    return fer_ort_run(&e->ort, e->in_names,
                       (const fer_ort_value *const *)&e->in_vals[(size_t)(n - 1) * e->n_inputs],
                       e->n_inputs, &e->out_name, 1, &e->out_vals[n - 1]);
}

/* fer_ort_kind.build: the exec over a session that exists. */
static int build(struct fer_ort *o, const void *arg)
{
    const struct fer_exec_config *cfg = arg;
    const struct fer_exec_tensor *named[3 + FER_EXEC_MAX_STATIC];
    struct fer_exec *e = (struct fer_exec *)o;
    uint32_t i;
    int rc;

    e->max_rows = cfg->max_rows;
    e->n_inputs = 2 + cfg->n_static;
    e->x_len = cfg->x.row_bytes / sizeof(float);
    e->t_cols = (uint32_t)fer_ort_tensor_elems(&cfg->t);
    e->rtc_mode = cfg->rtc_mode;
    e->action_dim = cfg->action_dim;
    e->clean_time = cfg->clean_time;
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

static const struct fer_ort_kind exec_kind = {sizeof(struct fer_exec), config_ok,
                                              intra_op_threads, intra_op_affinities,
                                              build};

int fer_exec_create(const char *lib_path, const void *model, uint64_t model_len,
                    const struct fer_exec_config *cfg, struct fer_exec **out, char *err,
                    uint64_t err_len)
{
    void *e = NULL;
    int rc = fer_ort_create(&exec_kind, lib_path, model, model_len, cfg, out != NULL ? &e : NULL,
                            err, err_len);

    if (out != NULL)
        *out = e;
    return rc;
}

void fer_exec_destroy(struct fer_exec *e)
{
    fer_ort_destroy(e != NULL ? &e->ort : NULL);
}

const char *fer_exec_last_error(const struct fer_exec *e)
{
    return e != NULL ? e->ort.err : "";
}

const char *fer_exec_ort_version(const struct fer_exec *e)
{
    return e != NULL && e->ort.version != NULL ? e->ort.version : "";
}

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;

    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
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

/* ---- real-time chunking (struct fer_exec_row; rtc.py's functions) ------------------------------- */

/* rtc.hold_prefix: the first n floats of state and x become the prefix, bit for bit. */
static void hold_prefix(float *restrict state, float *restrict x, const float *restrict prefix,
                        uint64_t n)
{
    memcpy(state, prefix, n * sizeof(float));
    memcpy(x, prefix, n * sizeof(float));
}

/* rtc.inpaint over the first n floats, the update having landed at flow time t. */
static void inpaint(float *restrict state, float *restrict x, const float *restrict x0,
                    const float *restrict prefix, uint64_t n, float t, float clean_time)
{
    float w = 1.0f - t, a = clean_time == 1.0f ? w : t, b = clean_time == 1.0f ? t : w;
    uint64_t i;

    for (i = 0; i < n; i++) {
        float p = x0[i] * a;
        float q = prefix[i] * b;
        state[i] = p + q;
        x[i] = state[i];
    }
}

/* The row's time input before its NFE: the solver's t on every column (one, or one per action
 * row); training_time: the frozen rows' state and x held to the prefix, their columns clean. */
static void before_nfe(struct fer_exec *e, uint32_t r, const struct fer_exec_row *w)
{
    float *t = &e->t[(size_t)r * e->t_cols];
    uint32_t c;

    for (c = 0; c < e->t_cols; c++)
        t[c] = w->times[w->next];
    if (w->frozen == 0 || e->rtc_mode != FER_EXEC_RTC_TRAINING_TIME)
        return;
    hold_prefix(&e->state[r * e->x_len], &e->x[r * e->x_len], w->prefix,
                (uint64_t)w->frozen * e->action_dim);
    for (c = 0; c < w->frozen && c < e->t_cols; c++)
        t[c] = e->clean_time;
}

/* After the row's update (next not yet advanced): inpaint's projection; after its last NFE, the
 * hold that makes the answer's frozen rows the prefix's bits. */
static void after_nfe(struct fer_exec *e, uint32_t r, const struct fer_exec_row *w)
{
    uint64_t n = (uint64_t)w->frozen * e->action_dim;
    float *state = &e->state[r * e->x_len], *x = &e->x[r * e->x_len];

    if (w->frozen == 0)
        return;
    if (e->rtc_mode == FER_EXEC_RTC_INPAINT)
        inpaint(state, x, w->x0, w->prefix, n, w->land[w->next], e->clean_time);
    if (w->next + 1 == w->total)
        hold_prefix(state, x, w->prefix, n);
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
        const struct fer_exec_row *w = &rows[r];

        if (w->next >= w->total || w->times == NULL || w->kinds == NULL)
            return 0;
        if (w->frozen != 0 &&
            (e->rtc_mode == FER_EXEC_RTC_OFF || w->prefix == NULL ||
             (uint64_t)w->frozen * e->action_dim >= e->x_len ||
             (e->rtc_mode == FER_EXEC_RTC_INPAINT && (w->x0 == NULL || w->land == NULL))))
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
           (r->probe == NULL || (r->probe_rows > 0 && r->probe_count != NULL)) &&
           (r->cede_ns == 0 || (r->cede_state != NULL && r->cede_every_ns > 0));
}

static void sleep_ns(uint64_t ns)
{
    struct timespec d = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};

    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &d, &d) == EINTR)
        ;
}

/* docs/design.md §5.3: a SCHED_FIFO worker that never leaves its CPU loses it for ~50 ms once a
 * second, when the kernel hands normal tasks their reserved share (RT throttling, the fair
 * server). Pausing cede_ns after every cede_every_ns of compute hands that share over in small
 * slices instead; admission prices the pauses, so the core hears of each one (fer_core_paused)
 * and leaves it out of the step's busy span. Before a step, outside its timing. */
static void cede(const struct fer_exec_report *r, struct fer_core *core, uint32_t lane,
                 uint32_t n_rows)
{
    uint64_t now, last, after, *state = r->cede_state;

    if (r->cede_ns == 0)
        return;
    now = clock_ns(CLOCK_MONOTONIC);
    last = __atomic_load_n(r->last_progress_ns, __ATOMIC_RELAXED);
    if (state[0] == 0 || (now > last && now - last >= r->cede_ns))
        state[0] = now; /* idle for at least a pause since the last step: a new stretch */
    if (now - state[0] < r->cede_every_ns)
        return;
    sleep_ns(r->cede_ns);
    after = clock_ns(CLOCK_MONOTONIC);
    __atomic_store_n(&state[1], state[1] + (after - now) * n_rows, __ATOMIC_RELAXED);
    state[0] = after;
    (void)fer_core_paused(core, lane, r->cede_ns);
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
        cede(rep, core, rows[0].lane, n_rows);
        probe_mark(rep, 0);
        start = clock_ns(CLOCK_MONOTONIC);
        for (r = 0; r < n_rows; r++)
            before_nfe(e, r, &rows[r]);
        probe_mark(rep, 1);
        if ((rc = run_rows(e, n_rows)) != FER_OK)
            return rc;
        probe_mark(rep, 2);
        for (r = 0; r < n_rows; r++) {
            struct fer_exec_row *w = &rows[r];
            advance(&e->state[r * e->x_len], &e->x[r * e->x_len], &e->v[r * e->x_len], e->x_len,
                    w->kinds[w->next], w->dt, w->half_dt);
            after_nfe(e, r, w);
            w->next++;
        }
        probe_mark(rep, 3);
        delay = fault_delay_ns != NULL ? __atomic_load_n(fault_delay_ns, __ATOMIC_RELAXED) : 0;
        if (delay != 0)
            sleep_ns(delay);
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

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_serve.c - a worker's request cycle in C (fer_serve.h): wait, join, prefix, steps, answer,
 * leave. Uses only public calls (fer.h, fer_exec.h, fer_pass.h, fer_noise.h); the rows' layout is
 * batch.BatchRows', described to it by the config.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fer_internal.h"
#include "fer_tensor.h"
#include "fer_exec.h"
#include "fer_pass.h"
#include "fer_noise.h"
#include "fer_serve.h"

#define RING_POLL_NS 50000u /* the ring-space wait's poll, as workers._finish_lane */

/*
 * Invariants between calls: 0 <= n <= max_rows; rows[0..n) are the held requests, row r's plan
 * in buffer plan_of[r] (rows[r].times / kinds, and with RTC land and x0, point into it, and a
 * frozen row's prefix into its slot's payload); plan_of is a permutation of
 * 0..max_rows-1, so a joiner always gets a buffer no held row uses; *cfg.rows_held == n.
 */
struct fer_serve {
    struct fer_serve_config cfg;
    struct fer_exec *exec;
    struct fer_pass *pass;
    struct fer_exec_row *rows;
    uint32_t n;
    float *times;       /* max_rows x max_nfe */
    int8_t *kinds;      /* max_rows x max_nfe */
    float *land;        /* max_rows x max_nfe: inpaint's landing times (RTC only) */
    float *x0;          /* max_rows x x_len: inpaint's initial noise (RTC only) */
    uint32_t *plan_of;  /* max_rows */
    float *obs_scratch; /* obs_dim floats: dispatch's observation when rows have none */
    float *actions;     /* n_actions floats */
    uint32_t *lanes;    /* max_rows: the joiners' lanes for the prefix pass */
    int32_t *results;   /* max_rows */
};

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int fer_plan_fill(uint32_t solver, int32_t sign, uint32_t total, float *times, int8_t *kinds,
                  float *dt_out, float *half_dt_out)
{
    uint32_t j, k, pairs;
    float dt;

    FER_CHECK_ARGS(times != NULL && kinds != NULL && dt_out != NULL && half_dt_out != NULL &&
                   total >= 1 && solver <= FER_SERVE_MIDPOINT && (sign == 1 || sign == -1));
    if (solver == FER_SERVE_EULER) {
        k = total;
        for (j = 0; j < total; j++) {
            times[j] = (float)((double)j / (double)k);
            kinds[j] = FER_EXEC_EULER;
        }
    } else {
        k = total / 2u + total % 2u;
        pairs = total / 2u;
        for (j = 0; j < pairs; j++) {
            times[2u * j] = (float)((double)j / (double)k);
            kinds[2u * j] = FER_EXEC_MID_HALF;
            times[2u * j + 1u] = (float)(((double)j + 0.5) / (double)k);
            kinds[2u * j + 1u] = FER_EXEC_MID_FULL;
        }
        if (total % 2u) {
            times[total - 1u] = (float)((double)pairs / (double)k);
            kinds[total - 1u] = FER_EXEC_EULER;
        }
    }
    dt = (float)(1.0 / (double)k);
    if (sign < 0) {
        for (j = 0; j < total; j++)
            times[j] = 1.0f - times[j];
        dt = -dt;
    }
    *dt_out = dt;
    *half_dt_out = dt / 2.0f;
    return FER_OK;
}

static int rowbuf_ok(const struct fer_serve_rowbuf *b)
{
    return b->data != NULL && b->row_bytes > 0;
}

static int config_ok(const struct fer_serve_config *c)
{
    uint32_t i;

    if (c->max_rows < 1 || c->max_rows > FER_EXEC_MAX_ROWS || c->max_nfe < 1 ||
        c->solver > FER_SERVE_MIDPOINT || (c->sign != 1 && c->sign != -1) || c->x_len < 1 ||
        c->x == NULL || c->state == NULL || c->n_moves > FER_SERVE_MAX_MOVES ||
        c->n_copies > FER_SERVE_MAX_COPIES || (c->action_offset == NULL) != (c->action_scale == NULL) ||
        (c->n_actions > 0 && c->action_index == NULL) || c->rows_held == NULL ||
        c->prefix_ring == NULL || c->prefix_ring_len < 1 || c->prefix_count == NULL ||
        c->rtc_mode > FER_EXEC_RTC_INPAINT || (c->rtc_mode != FER_EXEC_RTC_OFF &&
        (c->solver != FER_SERVE_EULER || (c->clean_time != 0.0f && c->clean_time != 1.0f) ||
         c->prefix_offset % sizeof(float) != 0)))
        return 0;
    for (i = 0; i < c->n_moves; i++)
        if (!rowbuf_ok(&c->moves[i]))
            return 0;
    for (i = 0; i < c->n_copies; i++)
        if (!rowbuf_ok(&c->copies[i].to))
            return 0;
    for (i = 0; i < c->n_actions; i++)
        if (c->action_index[i] >= c->x_len)
            return 0;
    return 1;
}

int fer_serve_create(const struct fer_serve_config *cfg, struct fer_exec *exec,
                     struct fer_pass *pass, struct fer_exec_row *rows, struct fer_serve **out)
{
    struct fer_serve *s;
    size_t plan = 0;
    uint32_t r;

    if (out != NULL)
        *out = NULL;
    FER_CHECK_ARGS(cfg != NULL && exec != NULL && rows != NULL && out != NULL && config_ok(cfg));
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return FER_ENOMEM;
    s->cfg = *cfg;
    s->exec = exec;
    s->pass = pass;
    s->rows = rows;
    if (!__builtin_mul_overflow((size_t)cfg->max_rows, (size_t)cfg->max_nfe, &plan)) {
        s->times = calloc(plan, sizeof(*s->times));
        s->kinds = calloc(plan, sizeof(*s->kinds));
        if (cfg->rtc_mode != FER_EXEC_RTC_OFF) {
            s->land = calloc(plan, sizeof(*s->land));
            s->x0 = calloc((size_t)cfg->max_rows * cfg->x_len, sizeof(*s->x0));
        }
    }
    s->plan_of = calloc(cfg->max_rows, sizeof(*s->plan_of));
    s->obs_scratch = calloc(cfg->obs_dim ? cfg->obs_dim : 1u, sizeof(float));
    s->actions = calloc(cfg->n_actions ? cfg->n_actions : 1u, sizeof(float));
    s->lanes = calloc(cfg->max_rows, sizeof(*s->lanes));
    s->results = calloc(cfg->max_rows, sizeof(*s->results));
    if (s->times == NULL || s->kinds == NULL || s->plan_of == NULL || s->obs_scratch == NULL ||
        s->actions == NULL || s->lanes == NULL || s->results == NULL ||
        (cfg->rtc_mode != FER_EXEC_RTC_OFF && (s->land == NULL || s->x0 == NULL))) {
        fer_serve_destroy(s);
        return FER_ENOMEM;
    }
    for (r = 0; r < cfg->max_rows; r++)
        s->plan_of[r] = r;
    __atomic_store_n(cfg->rows_held, 0, __ATOMIC_RELAXED);
    *out = s;
    return FER_OK;
}

void fer_serve_destroy(struct fer_serve *s)
{
    if (s == NULL)
        return;
    free(s->times);
    free(s->kinds);
    free(s->land);
    free(s->x0);
    free(s->plan_of);
    free(s->obs_scratch);
    free(s->actions);
    free(s->lanes);
    free(s->results);
    free(s);
}

uint32_t fer_serve_rows(const struct fer_serve *s)
{
    return s != NULL ? s->n : 0;
}

static void set_held(struct fer_serve *s, uint32_t n)
{
    s->n = n;
    __atomic_store_n(s->cfg.rows_held, (uint64_t)n, __ATOMIC_RELAXED);
}

static void *row_of(const struct fer_serve_rowbuf *b, uint32_t r)
{
    return (char *)b->data + (size_t)r * b->row_bytes;
}

/* A joiner with frozen rows (docs/design.md §5.4): its prefix where the intake put it in the
 * slot payload; for inpaint its x(0) and where each NFE lands (rtc.landing_times: NFE j lands
 * where NFE j + 1 evaluates, the last at the clean time). */
static int join_rtc(struct fer_serve *s, struct fer_core *core, uint32_t r,
                    const struct fer_work *w)
{
    const struct fer_serve_config *c = &s->cfg;
    struct fer_exec_row *row = &s->rows[r];
    size_t at = (size_t)s->plan_of[r] * c->max_nfe;
    const char *payload = fer_core_payload(core, w->slot);
    uint32_t j;

    if (c->rtc_mode == FER_EXEC_RTC_OFF || payload == NULL)
        return FER_ESTATE; /* the core gave frozen rows to a serve without RTC */
    row->prefix = (const float *)(const void *)(payload + c->prefix_offset);
    row->x0 = &s->x0[(size_t)s->plan_of[r] * c->x_len];
    row->land = &s->land[at];
    memcpy(&s->x0[(size_t)s->plan_of[r] * c->x_len], &c->state[(size_t)r * c->x_len],
           (size_t)c->x_len * sizeof(float));
    for (j = 0; j + 1 < w->remaining_nfe; j++)
        s->land[at + j] = s->times[at + j + 1];
    s->land[at + w->remaining_nfe - 1] = c->clean_time;
    return FER_OK;
}

/* Row r takes dispatched work w (BatchRows.join): x(0), plan, inputs, the row table entry. */
static int join(struct fer_serve *s, struct fer_core *core, uint32_t r, const struct fer_work *w)
{
    const struct fer_serve_config *c = &s->cfg;
    struct fer_exec_row *row = &s->rows[r];
    size_t at = (size_t)s->plan_of[r] * c->max_nfe;
    float *state = &c->state[(size_t)r * c->x_len];
    const char *payload;
    float dt, half_dt;
    uint32_t i;
    int rc;

    if (w->remaining_nfe < 1 || w->remaining_nfe > c->max_nfe)
        return FER_ESTATE; /* the core admits 1..max_nfe: core and serve disagree */
    if ((rc = fer_plan_fill(c->solver, c->sign, w->remaining_nfe, &s->times[at], &s->kinds[at],
                            &dt, &half_dt)) != FER_OK)
        return rc;
    if ((rc = fer_noise_fill(w->noise_seed, state, c->x_len)) != FER_OK)
        return rc;
    memcpy(&c->x[(size_t)r * c->x_len], state, (size_t)c->x_len * sizeof(float));
    if (c->n_copies > 0) {
        payload = fer_core_payload(core, w->slot);
        if (payload == NULL)
            return FER_ESTATE;
        for (i = 0; i < c->n_copies; i++)
            memcpy(row_of(&c->copies[i].to, r), payload + c->copies[i].payload_offset,
                   (size_t)c->copies[i].to.row_bytes);
    }
    row->lane = w->lane;
    row->next = 0;
    row->total = w->remaining_nfe;
    row->result = FER_STEP_CONTINUE;
    row->dt = dt;
    row->half_dt = half_dt;
    row->times = &s->times[at];
    row->kinds = &s->kinds[at];
    row->frozen = w->frozen_rows;
    if (w->frozen_rows != 0)
        return join_rtc(s, core, r, w);
    return FER_OK;
}

/* Row r leaves (BatchRows.leave): the last row moves into it; its plan buffer goes to the last
 * row's place, free for the next joiner. */
static void leave(struct fer_serve *s, uint32_t r)
{
    uint32_t last = s->n - 1u, i, plan;

    if (r != last) {
        for (i = 0; i < s->cfg.n_moves; i++)
            memcpy(row_of(&s->cfg.moves[i], r), row_of(&s->cfg.moves[i], last),
                   (size_t)s->cfg.moves[i].row_bytes);
        s->rows[r] = s->rows[last];
        plan = s->plan_of[r];
        s->plan_of[r] = s->plan_of[last];
        s->plan_of[last] = plan;
    }
    set_held(s, last);
}

/* Row r's work is DONE: its actions (BatchRows.actions) into its ring, waiting a bounded time
 * for space (workers._finish_lane). The code finish decided, or a negative status. */
static int answer(struct fer_serve *s, struct fer_core *core, uint32_t r)
{
    const struct fer_serve_config *c = &s->cfg;
    const float *state = &c->state[(size_t)r * c->x_len];
    uint32_t i, lane = s->rows[r].lane;
    uint64_t give_up;
    int space, finite = 1;

    for (i = 0; i < c->n_actions; i++) {
        float v = state[c->action_index[i]];
        if (c->action_offset != NULL) {
            v = v - c->action_offset[i];
            v = v / c->action_scale[i];
        }
        s->actions[i] = v;
        finite &= isfinite(v) != 0;
    }
    give_up = fer_sat_add(now_ns(), c->output_wait_ns);
    while ((space = fer_core_output_space(core, lane)) == 0 && now_ns() < give_up) {
        struct timespec d = {0, (long)RING_POLL_NS};
        while (clock_nanosleep(CLOCK_MONOTONIC, 0, &d, &d) == EINTR)
            ;
    }
    if (space < 0)
        return space;
    if (!finite) /* a NaN or an infinity is never an answer (docs/design.md §3) */
        return fer_core_fail(core, lane, now_ns(), FER_FAIL_NON_FINITE);
    return fer_core_finish(core, lane, now_ns(), s->actions); /* full ring: counted drop */
}

/* Rows [first, s->n) were in a model call that raised: each ends INFERENCE_FAILED (runtime error)
 * and leaves; the caller returns the call's status, so the worker counts the error. */
static int fail_rows(struct fer_serve *s, struct fer_core *core, uint32_t first, int status)
{
    uint32_t r;
    int rc;

    for (r = first; r < s->n; r++)
        if ((rc = fer_core_fail(core, s->rows[r].lane, now_ns(), FER_FAIL_RUNTIME_ERROR)) < 0)
            return rc;
    set_held(s, first);
    return status;
}

/* A step boundary: free rows take queued work in EDF order; two-phase joiners run their prefix
 * pass together and those the core stops leave. */
static int boundary(struct fer_serve *s, struct fer_core *core, const struct fer_exec_report *rep)
{
    const struct fer_serve_config *c = &s->cfg;
    uint32_t first = s->n, r, count;
    uint64_t now, times[2], k;
    struct fer_work w;
    int rc;

    if (s->n >= c->max_rows || fer_core_queued(core) <= 0)
        return FER_OK;
    now = now_ns();
    while (s->n < c->max_rows) {
        w.observation = c->observation != NULL ? &c->observation[(size_t)s->n * c->obs_dim]
                                               : s->obs_scratch;
        if ((rc = fer_core_dispatch_worker(core, c->worker, now, &w)) <= 0) {
            if (rc < 0)
                return rc;
            break;
        }
        if ((rc = join(s, core, s->n, &w)) != FER_OK)
            return rc;
        set_held(s, s->n + 1u);
        __atomic_store_n(rep->last_progress_ns, now, __ATOMIC_RELAXED);
    }
    count = s->n - first;
    if (count == 0 || s->pass == NULL)
        return FER_OK;
    for (r = 0; r < count; r++)
        s->lanes[r] = s->rows[first + r].lane;
    rc = fer_pass_run_done(s->pass, core, s->lanes, first, count, s->results, times);
    if (rc == FER_EXEC_EORT)
        return fail_rows(s, core, first, rc); /* the joiners' prefix pass raised */
    if (rc != FER_OK)
        return rc;
    k = __atomic_load_n(c->prefix_count, __ATOMIC_RELAXED);
    c->prefix_ring[k % c->prefix_ring_len] = (int64_t)times[1];
    __atomic_store_n(c->prefix_count, k + 1u, __ATOMIC_RELAXED);
    __atomic_store_n(rep->last_progress_ns, times[0], __ATOMIC_RELAXED);
    for (r = 0; r < count; r++)
        if (s->results[r] < 0)
            return s->results[r]; /* a joiner's lane had no such work: core and serve disagree */
    for (r = s->n; r-- > first;) /* last first: a leave moves a row already visited */
        if (s->results[r - first] != FER_STEP_CONTINUE)
            leave(s, r); /* stale or expired: the core emitted its outcome */
    return FER_OK;
}

int fer_serve_run(struct fer_serve *s, struct fer_core *core, const uint32_t *stop_flag,
                  const uint64_t *fault_delay_ns, const struct fer_exec_report *rep)
{
    struct fer_config cc;
    uint32_t r;
    int rc;

    FER_CHECK_ARGS(s != NULL && core != NULL && stop_flag != NULL && rep != NULL &&
                   rep->last_progress_ns != NULL);
    if ((rc = fer_core_get_config(core, &cc)) != FER_OK)
        return rc;
    FER_CHECK_ARGS(s->cfg.worker < cc.workers && s->cfg.max_rows == cc.batch_slots &&
                   s->cfg.n_actions == cc.action_len && s->cfg.obs_dim == cc.obs_dim &&
                   s->cfg.max_nfe >= cc.max_nfe);
    for (;;) {
        if (__atomic_load_n(stop_flag, __ATOMIC_RELAXED) != 0)
            return FER_EXEC_STOPPED;
        if (s->n == 0) {
            rc = fer_core_worker_wait(core, s->cfg.worker, s->cfg.wait_timeout_ns);
            if (rc < 0)
                return rc;
            if (__atomic_load_n(stop_flag, __ATOMIC_RELAXED) != 0)
                return FER_EXEC_STOPPED;
            if (rc == 0)
                return FER_SERVE_IDLE;
        }
        if ((rc = boundary(s, core, rep)) != FER_OK)
            return rc;
        if (s->n == 0)
            continue; /* what was queued expired at dispatch, or another worker took it */
        rc = fer_exec_run(s->exec, core, s->rows, s->n, stop_flag, fault_delay_ns, FER_EXEC_JOIN,
                          rep);
        if (rc == FER_EXEC_EORT)
            return fail_rows(s, core, 0, rc); /* the step's model call raised: all its rows */
        if (rc < 0 || rc == FER_EXEC_STOPPED)
            return rc;
        for (r = s->n; r-- > 0;) { /* last first: a leave moves a row already visited */
            int result = s->rows[r].result;
            if (result == FER_STEP_CONTINUE)
                continue;
            if (result == FER_STEP_DONE && (rc = answer(s, core, r)) < 0)
                return rc;
            leave(s, r);
        }
    }
}

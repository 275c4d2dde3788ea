/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_lane.c - the worker lanes (docs/design.md §5's non-preemptive EDF lanes, W x B of them with
 * batch slots, §5.1): waiting for work, dispatching the EDF head, accounting a two-phase model's
 * prefix pass and each NFE step, finishing, and a lane's death.
 *
 * Worker w alone calls these for its lanes [w*B, (w+1)*B), so ring w+1 keeps a single producer.
 * Each call holds core->mu for O(queue + B) at most and sleeps only in the condvar waits
 * (wait_for_work, worker_wait).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <string.h>
#include <time.h>

#include "fer_internal.h"

/* Argument check shared by every lane call. */
#define FER_LANE_OK(c, lane) ((c) != NULL && (lane) < (c)->nlanes)
#define FER_WORKER_OK(c, w) ((c) != NULL && (w) < (c)->cfg.workers)

/* Worker w's lowest-numbered free alive lane, or FER_NONE (mu held). O(B). */
static uint32_t free_lane(const struct fer_core *c, uint32_t w)
{
    uint32_t b = c->cfg.batch_slots, l;

    for (l = w * b; l < (w + 1) * b; l++)
        if (c->lanes[l].alive && c->lanes[l].slot == FER_NONE)
            return l;
    return FER_NONE;
}

/* Whether work is queued, the core runs, and (for a worker w != FER_NONE) one of w's lanes is
 * free to take it (mu held). */
static int work_ready(const struct fer_core *c, uint32_t w)
{
    return c->qlen > 0 && !c->dispatch_held &&
           !atomic_load_explicit(&c->shutdown, memory_order_relaxed) &&
           (w == FER_NONE || free_lane(c, w) != FER_NONE);
}

/* Block until work_ready(c, w), shutdown or timeout; then work_ready. Only worker w frees its
 * lanes, so without a free lane this waits out the timeout: a worker calls it when it holds
 * nothing (or has a free slot), as the thread contract says. */
static int wait_work(struct fer_core *c, uint32_t w, uint64_t timeout_ns)
{
    struct timespec ts = fer_deadline_after(timeout_ns);
    int ready;

    pthread_mutex_lock(&c->mu);
    while (!work_ready(c, w) && !atomic_load_explicit(&c->shutdown, memory_order_relaxed))
        if (pthread_cond_timedwait(&c->work_cv, &c->mu, &ts) == ETIMEDOUT)
            break;
    ready = work_ready(c, w);
    pthread_mutex_unlock(&c->mu);
    return ready;
}

int fer_core_wait_for_work(struct fer_core *c, uint32_t lane, uint64_t timeout_ns)
{
    FER_CHECK_ARGS(FER_LANE_OK(c, lane));
    return wait_work(c, FER_NONE, timeout_ns);
}

int fer_core_worker_wait(struct fer_core *c, uint32_t w, uint64_t timeout_ns)
{
    FER_CHECK_ARGS(FER_WORKER_OK(c, w));
    return wait_work(c, w, timeout_ns);
}

int fer_core_hold_dispatch(struct fer_core *c, uint32_t held)
{
    FER_CHECK_ARGS(c != NULL);
    pthread_mutex_lock(&c->mu);
    c->dispatch_held = held != 0;
    if (!held)
        pthread_cond_broadcast(&c->work_cv);
    pthread_mutex_unlock(&c->mu);
    return FER_OK;
}

int fer_core_queued(struct fer_core *c)
{
    FER_CHECK_ARGS(c != NULL);
    return (int)atomic_load_explicit(&c->qlen_hint, memory_order_relaxed);
}

/* Whether queued slot s can no longer finish by its deadline if started now. */
static int dispatch_expired(const struct fer_core *c, const struct fer_slot *s, uint64_t now)
{
    if (s->deadline_ns == 0)
        return 0;
    if (c->cfg.nfe_ns == 0)
        return now >= s->deadline_ns;
    /* cost-model hook (§5.2): pending prefix + NFEs at the cost for one request about to start
     * (the admission cost without the block mean; the prefix estimator has no block mean). */
    return !fer_meets(fer_work_finish(now, s->prefix_pending, fer_prefix_in_use(c, now),
                                      s->remaining_nfe, fer_nfe_at_dispatch(c, now)),
                      s->deadline_ns);
}

/* §5.4: the rows of slot s's prefix the robot will have started by the time its chunk is done,
 * as admission bounds that time: from now, the pending prefix pass and the remaining NFEs at the
 * cost in use, plus the reserve (and the pause a pacing worker may take, as admission counts it).
 * d = ceil((bound - prefix_start) / action_period), 0 if the bound is before prefix_start, and
 * at most min(prefix_rows, rtc_max_delay): a bound past that instant is past the effective
 * deadline, and such work is answered EXPIRED, never with a chunk. Admission off (nfe_ns 0, no
 * bound): that maximum, the only bound the deadline itself gives. */
static uint32_t frozen_rows_at(const struct fer_core *c, const struct fer_slot *s, uint64_t now)
{
    uint32_t most = fer_rtc_window_rows(c, s->prefix_rows);
    uint64_t bound, rows;

    if (s->prefix_rows == 0)
        return 0;
    if (c->cfg.nfe_ns == 0)
        return most;
    bound = fer_work_finish(now, s->prefix_pending, fer_prefix_in_use(c, now), s->remaining_nfe,
                            fer_nfe_in_use(c, now));
    bound = fer_sat_add(bound, fer_finish_reserve(c));
    if (bound <= s->prefix_start_ns)
        return 0;
    rows = (bound - s->prefix_start_ns - 1) / s->action_period_ns + 1; /* ceil, no overflow */
    return rows < most ? (uint32_t)rows : most;
}

/* §5.4: once d is fixed the robot switches to the chunk at row d, so the instant that row starts,
 * prefix_start + d x action_period, is when the chunk stops being of use: it becomes slot s's
 * deadline if earlier. A bound that holds never reaches it (d rounds the bound up to a row); a
 * stall past the reserve does, and the work is then answered EXPIRED, never a late chunk. */
static void deadline_at_switch_row(struct fer_slot *s)
{
    uint64_t at;

    if (s->prefix_rows == 0)
        return;
    at = fer_rtc_row_start(s->prefix_start_ns, s->frozen_rows, s->action_period_ns);
    if (at < s->deadline_ns)
        s->deadline_ns = at;
}

/* Put queued slot id on lane and describe it in *out (observation copied into the caller's
 * buffer). */
static void run_on_lane(struct fer_core *c, uint32_t lane, uint32_t id, uint64_t now,
                        struct fer_work *out)
{
    struct fer_slot *s = &c->slots[id];
    uint32_t w = lane / c->cfg.batch_slots;

    /* §5.2 block mean: a worker taking work with every lane idle was busy only from when the
     * work was there (its arrival), or from its own last step if the work waited for that. */
    if (!fer_worker_stepping(c, w) && s->arrival_ns > c->charged_ns[w])
        c->charged_ns[w] = s->arrival_ns;
    /* ... and the time until its first step is this request's turnover, paid by its steps */
    fer_cost_dispatched(&c->turnover[w], s->remaining_nfe);
    s->state = FER_SLOT_RUNNING;
    s->lane = lane;
    s->dispatch_ns = now;
    s->frozen_rows = frozen_rows_at(c, s, now);
    deadline_at_switch_row(s);
    c->lanes[lane].slot = id;
    FER_SLOT_VIEW(out, c, id);
    out->lane = lane;
    out->frozen_rows = s->frozen_rows;
    out->noise_seed = s->noise_seed;
    if (c->cfg.obs_dim)
        memcpy(out->observation, s->obs, (size_t)c->cfg.obs_dim * sizeof(float));
}

/* Pop the EDF head onto idle alive lane `lane` (mu held): head entries that can no longer be
 * served are answered into the worker's ring on the way (*rang set). 1 if work was dispatched. */
static int dispatch_locked(struct fer_core *c, uint32_t lane, uint64_t now, struct fer_work *out,
                           int *rang)
{
    uint32_t i, id = FER_NONE;

    /* Skip (and answer) the head entries that can no longer be served; remove them and the
     * dispatched one with a single queue_remove so the whole call stays O(queue). */
    for (i = 0; i < c->qlen; i++) {
        uint32_t q = c->queue[i];
        const struct fer_slot *s = &c->slots[q];
        if (dispatch_expired(c, s, now)) {
            *rang |= fer_emit_slot(c, q, FER_EXPIRED, now, (int32_t)lane, NULL);
        } else if (c->cfg.queue_timeout_ns != 0 &&
                   fer_sat_sub(now, s->arrival_ns) > c->cfg.queue_timeout_ns) {
            *rang |= fer_emit_slot(c, q, FER_REJECTED_DEADLINE, now, (int32_t)lane, NULL);
        } else {
            id = q;
            i++;
            break;
        }
    }
    fer_queue_remove(c, 0, i);
    if (id != FER_NONE)
        run_on_lane(c, lane, id, now, out);
    return id != FER_NONE;
}

int fer_core_dispatch(struct fer_core *c, uint32_t lane, uint64_t now, struct fer_work *out)
{
    int rang = 0, got;

    FER_CHECK_ARGS(FER_LANE_OK(c, lane) && out != NULL &&
                   (c->cfg.obs_dim == 0 || out->observation != NULL));
    pthread_mutex_lock(&c->mu);
    if (!c->lanes[lane].alive || c->lanes[lane].slot != FER_NONE) {
        pthread_mutex_unlock(&c->mu);
        return FER_ESTATE;
    }
    got = c->dispatch_held ? 0 : dispatch_locked(c, lane, now, out, &rang);
    fer_unlock_and_ring(c, rang);
    return got;
}

int fer_core_dispatch_worker(struct fer_core *c, uint32_t w, uint64_t now, struct fer_work *out)
{
    int rang = 0, got = 0;
    uint32_t lane;

    FER_CHECK_ARGS(FER_WORKER_OK(c, w) && out != NULL &&
                   (c->cfg.obs_dim == 0 || out->observation != NULL));
    pthread_mutex_lock(&c->mu);
    lane = free_lane(c, w);
    if (lane != FER_NONE && c->qlen > 0 && !c->dispatch_held)
        got = dispatch_locked(c, lane, now, out, &rang);
    fer_unlock_and_ring(c, rang);
    return got;
}

/* The running slot of `lane`, or FER_NONE if the lane is idle or dead. */
static uint32_t running_slot(const struct fer_core *c, uint32_t lane)
{
    if (!c->lanes[lane].alive)
        return FER_NONE;
    return c->lanes[lane].slot;
}

/* What follows a unit of work (a prefix pass or an NFE) of the lane's slot id, under the core
 * mutex: cancelled work stops as REJECTED_STALE first; then finished work (`done`) is DONE and
 * waits for finish; then work whose deadline has passed stops as EXPIRED; else CONTINUE. A
 * stopping slot's outcome is emitted here (*rang set when a ring was pushed). */
static int after_unit(struct fer_core *c, uint32_t id, uint32_t lane, uint64_t now, int done,
                      int *rang)
{
    const struct fer_slot *s = &c->slots[id];

    if (s->cancelled) {
        *rang = fer_emit_slot(c, id, FER_REJECTED_STALE, now, (int32_t)lane, NULL);
        return FER_STEP_STOP_STALE;
    }
    if (done)
        return FER_STEP_DONE;
    if (s->deadline_ns != 0 && now >= s->deadline_ns) {
        *rang = fer_emit_slot(c, id, FER_EXPIRED, now, (int32_t)lane, NULL);
        return FER_STEP_STOP_EXPIRED;
    }
    return FER_STEP_CONTINUE;
}

/* After the prefix pass (two_phase): like a step that does no NFE. Stale and expired work stops
 * here, before its first NFE, and the pass is measured like an NFE into its own estimator. */
int fer_core_prefix_done(struct fer_core *c, uint32_t lane, uint64_t now,
                         uint64_t prefix_ns_measured)
{
    uint32_t id;
    struct fer_slot *s;
    int rc, rang = 0;

    FER_CHECK_ARGS(FER_LANE_OK(c, lane));
    pthread_mutex_lock(&c->mu);
    id = running_slot(c, lane);
    if (id == FER_NONE || !c->slots[id].prefix_pending) {
        /* No work, a single-graph model, or the prefix was already reported. */
        pthread_mutex_unlock(&c->mu);
        return FER_ESTATE;
    }
    s = &c->slots[id];
    s->prefix_pending = 0;
    c->st.busy_ns = fer_sat_add(c->st.busy_ns, prefix_ns_measured);
    fer_cost_record(&c->prefix_cost, NULL, now, prefix_ns_measured, 0, 0); /* cost-model hook */
    /* The pass is priced by prefix_ns: the worker's next step is charged from its end. */
    c->charged_ns[lane / c->cfg.batch_slots] = now;
    rc = after_unit(c, id, lane, now, 0, &rang);
    fer_unlock_and_ring(c, rang);
    return rc;
}

/* §5.2 block mean: the busy span of the worker step lane's NFE ended at now, or 0 if another
 * row of the same step (same now) already reported it. Never less than the measured time (the
 * first step, and a clock read that lags another thread's). A pacing pause reported by
 * fer_core_paused leaves it, and a request's turnover is taken out of its first step's span and
 * paid by its steps (fer_cost_turnover). */
static uint64_t step_span(struct fer_core *c, uint32_t lane, uint64_t now, uint64_t measured)
{
    uint32_t w = lane / c->cfg.batch_slots;
    uint64_t *charged = &c->charged_ns[w], span;

    if (*charged == now)
        return 0;
    span = *charged != 0 && now > *charged ? now - *charged : 0;
    *charged = now;
    span = span > measured ? span : (measured ? measured : 1);
    return fer_cost_turnover(&c->cost, &c->turnover[w], span, measured);
}

int fer_core_paused(struct fer_core *c, uint32_t lane, uint64_t pause_ns)
{
    FER_CHECK_ARGS(FER_LANE_OK(c, lane));
    pthread_mutex_lock(&c->mu);
    fer_cost_paused(&c->turnover[lane / c->cfg.batch_slots], pause_ns);
    pthread_mutex_unlock(&c->mu);
    return FER_OK;
}

int fer_core_step(struct fer_core *c, uint32_t lane, uint64_t now, uint64_t nfe_ns_measured)
{
    uint32_t id;
    struct fer_slot *s;
    uint64_t span;
    int rc, rang = 0;

    FER_CHECK_ARGS(FER_LANE_OK(c, lane));
    pthread_mutex_lock(&c->mu);
    id = running_slot(c, lane);
    if (id == FER_NONE || c->slots[id].remaining_nfe == 0 || c->slots[id].prefix_pending) {
        /* No work, the work is already DONE and waits for finish, or its prefix has not been
         * reported (prefix_done comes first). */
        pthread_mutex_unlock(&c->mu);
        return FER_ESTATE;
    }
    s = &c->slots[id];
    s->remaining_nfe--;
    fer_client_uncommit(c, s, 1); /* §7.1: one NFE less owed */
    s->nfe_done++;
    c->st.nfe_total++;
    c->st.busy_ns = fer_sat_add(c->st.busy_ns, nfe_ns_measured);
    span = step_span(c, lane, now, nfe_ns_measured);
    rc = after_unit(c, id, lane, now, s->remaining_nfe == 0, &rang);
    /* §5.2: the worker's block closes at the end of a request (done or stopped) */
    fer_cost_record(&c->cost, &c->turnover[lane / c->cfg.batch_slots], now, nfe_ns_measured, span,
                    rc != FER_STEP_CONTINUE);
    fer_unlock_and_ring(c, rang);
    return rc;
}

int fer_core_output_space(struct fer_core *c, uint32_t lane)
{
    FER_CHECK_ARGS(FER_LANE_OK(c, lane));
    /* The lane's worker is its ring's only producer: no core mutex needed. */
    return fer_ring_free_slots(c->rings[fer_lane_ring(c, (int32_t)lane)]) > 0;
}

int fer_core_finish(struct fer_core *c, uint32_t lane, uint64_t now, const float *actions)
{
    uint32_t id, code;
    const struct fer_slot *s;
    int rang;

    FER_CHECK_ARGS(FER_LANE_OK(c, lane) && (c->cfg.action_len == 0 || actions != NULL));
    pthread_mutex_lock(&c->mu);
    id = running_slot(c, lane);
    if (id == FER_NONE || c->slots[id].remaining_nfe != 0) {
        pthread_mutex_unlock(&c->mu);
        return FER_ESTATE;
    }
    s = &c->slots[id];
    /* A newer generation accepted after the last step still makes this answer stale. */
    if (s->cancelled)
        code = FER_REJECTED_STALE;
    else if (s->deadline_ns != 0 && now > s->deadline_ns)
        code = FER_EXPIRED;
    else
        code = FER_INFERENCE;
    rang = fer_emit_slot(c, id, code, now, (int32_t)lane, code == FER_INFERENCE ? actions : NULL);
    fer_unlock_and_ring(c, rang);
    return (int)code;
}

int fer_core_fail(struct fer_core *c, uint32_t lane, uint64_t now, uint32_t cause)
{
    uint32_t id;
    int rang;

    FER_CHECK_ARGS(FER_LANE_OK(c, lane) && cause < FER_FAIL_CAUSES);
    pthread_mutex_lock(&c->mu);
    id = running_slot(c, lane);
    if (id == FER_NONE) {
        pthread_mutex_unlock(&c->mu);
        return FER_ESTATE;
    }
    /* Not a calibration miss: the model failed, the estimate was not wrong. */
    c->slots[id].tested = 0;
    c->st.failed[cause]++;
    rang = fer_emit_slot(c, id, FER_INFERENCE_FAILED, now, (int32_t)lane, NULL);
    fer_unlock_and_ring(c, rang);
    return FER_INFERENCE_FAILED;
}

int fer_core_disable_lane(struct fer_core *c, uint32_t lane, uint64_t now)
{
    uint32_t i, id, code;
    int rang = 0;

    FER_CHECK_ARGS(FER_LANE_OK(c, lane));
    pthread_mutex_lock(&c->mu);
    if (c->lanes[lane].alive) {
        id = c->lanes[lane].slot;
        if (id != FER_NONE) {
            /* Not a calibration miss: the worker died, the estimate was not wrong. */
            c->slots[id].tested = 0;
            rang = fer_emit_slot(c, id, FER_EXPIRED, now, (int32_t)lane, NULL);
        }
        c->lanes[lane].alive = 0;
        c->lanes_alive--;
        /* The last lane is gone: nothing queued will ever be dispatched. Answer it all now
         * (the lane's worker ring has this caller as its only producer): EXPIRED when the
         * relay stops (after shutdown: admitted work it will not finish), REJECTED_CAPACITY
         * when its workers died (no capacity left). */
        if (c->lanes_alive == 0) {
            code = atomic_load_explicit(&c->shutdown, memory_order_relaxed) ? FER_EXPIRED
                                                                             : FER_REJECTED_CAPACITY;
            for (i = 0; i < c->qlen; i++) {
                c->slots[c->queue[i]].tested = 0; /* not a calibration miss either */
                rang |= fer_emit_slot(c, c->queue[i], code, now, (int32_t)lane, NULL);
            }
            fer_queue_remove(c, 0, c->qlen);
        }
    }
    fer_unlock_and_ring(c, rang);
    return FER_OK;
}

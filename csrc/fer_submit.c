/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_submit.c - what happens to a request on arrival: the docs/design.md §4 decision order, one
 * small step per rule, read top to bottom in submit_locked.
 *
 *   1. validate (the node did; the core refuses what slipped through, uncounted)
 *   2. duplicate of a queued or running (session_id, sequence) -> coalesce
 *      not accepting (lifecycle: inactive, deactivating)       -> REJECTED_CAPACITY
 *   3. older than the session's accepted generation             -> REJECTED_STALE
 *   4. deadline already passed                                  -> EXPIRED
 *   5. retry / age gate                                         -> REJECTED_DEADLINE
 *   6. queue full and cannot displace, no alive lane, no room
 *      for its session (or, fair_share on, for its client)     -> REJECTED_CAPACITY
 *      (fair_share and client_weights are live: each decision reads them under core->mu)
 *   7. calibrated admission test fails (fer_admit.c), and, fair_share on, displacing
 *      over-share queued work does not make it pass (fer_share.c) -> REJECTED_DEADLINE
 *   8. accept: commit everything the steps above planned.
 *
 * Steps 3-7 are gates: each only looks (and notes what acceptance would do in struct arrival),
 * so a request they reject changes nothing. Every change is made in step 8. All of it runs
 * with core->mu held, in O(queue + workers + max_sessions), without allocating.
 */
#include <pthread.h>

#include "fer_internal.h"

/* A request being decided, and what the steps have learned about it so far. */
struct arrival {
    const struct fer_request *r;
    uint64_t now;
    uint64_t hash;      /* of r->session_id */
    uint32_t si;        /* its tracked session, or FER_NONE */
    uint32_t ncancel;   /* queued slots of si that accepting it cancels (older generations) */
    struct fer_share_cut cut; /* the queued slots it displaces: step 6's, then step 7's (§7.1) */
    uint32_t fair_mask; /* bit i: cut.slots[i] goes for the fair share (§7.1) */
    uint32_t evict;     /* the idle session evicted to make room for its own, or FER_NONE */
    uint32_t ki;        /* §7.1: its tracked client, or FER_NONE */
    uint32_t kevict;    /* §7.1: the idle client forgotten to make room for its own, or FER_NONE */
    int untracked;      /* §7.1: fair_share off and no room for its client: accepted, not charged */
    int x_over;         /* §7.1: its client is over its share before x (judged on arrival) */
    uint32_t why;       /* FER_REJECT_* of a REJECTED_CAPACITY decision */
    int tested;         /* it passed the admission test */
    int rang;           /* an outcome was committed to ring 0 */
};

/* A gate returns the decision it forces, or FER_ACCEPTED to let the request go on. */
typedef int (*fer_gate)(struct fer_core *c, struct arrival *a);

static int request_valid(const struct fer_core *c, const struct fer_request *r)
{
    return r->session_id_len <= FER_SESSION_ID_MAX && r->remaining_nfe >= 1 &&
           r->remaining_nfe <= c->cfg.max_nfe && r->retry_reason < FER_RETRY_REASONS &&
           (c->cfg.obs_dim == 0 || r->observation != NULL) &&
           (r->prefix_rows == 0 || (c->cfg.rtc_max_delay > 0 && r->action_period_ns > 0 &&
                                    r->prefix_rows <= FER_RTC_MAX_ROWS));
}

/* §5.4: a chunk is useless once the robot has executed min(prefix_rows, rtc_max_delay) rows of
 * its prefix, so that instant is a deadline too; the earlier of the two is the one that counts
 * for admission, dispatch and expiry (0 = none, as for deadline_ns). r has prefix_rows > 0. */
static uint64_t effective_deadline(const struct fer_core *c, const struct fer_request *r)
{
    uint32_t rows = fer_rtc_window_rows(c, r->prefix_rows);
    uint64_t used_up = fer_rtc_row_start(r->prefix_start_ns, rows, r->action_period_ns);

    return r->deadline_ns != 0 && r->deadline_ns < used_up ? r->deadline_ns : used_up;
}

/* From step 1 on, a request is counted, retries by count (capped) and by reason. */
static void count_submitted(struct fer_core *c, const struct fer_request *r)
{
    c->st.submitted++;
    if (r->retry_count >= 1) {
        c->st.retries_by_count[r->retry_count < FER_RETRY_COUNT_BUCKETS - 1
                                   ? r->retry_count
                                   : FER_RETRY_COUNT_BUCKETS - 1]++;
        c->st.retries_by_reason[r->retry_reason]++;
    }
}

/* 2. A duplicate of queued or running (session_id, sequence) is coalesced: no output of its own,
 * the original answers once. If the original is queued and already late, it answers now. */
static int step_coalesce(struct fer_core *c, struct arrival *a)
{
    const struct fer_slot *s;
    uint32_t id;

    if (a->si == FER_NONE)
        return 0;
    for (id = c->sessions[a->si].head; id != FER_NONE; id = s->snext) {
        s = &c->slots[id];
        if (s->sequence != a->r->sequence)
            continue;
        c->st.coalesced++;
        if (s->state == FER_SLOT_QUEUED && s->deadline_ns != 0 && a->now >= s->deadline_ns) {
            fer_queue_unlink(c, id);
            a->rang |= fer_emit_slot(c, id, FER_EXPIRED, a->now, -1, NULL);
        }
        return 1;
    }
    return 0;
}

/* Not accepting (§9: the relay is inactive or deactivating): answered at once, no compute. */
static int gate_inactive(struct fer_core *c, struct arrival *a)
{
    (void)a;
    if (!c->refusing)
        return FER_ACCEPTED;
    c->st.rejected_inactive++;
    return FER_REJECTED_CAPACITY;
}

/* 3. Older than the session's accepted generation. */
static int gate_stale(struct fer_core *c, struct arrival *a)
{
    if (a->si != FER_NONE && a->r->generation < c->sessions[a->si].generation)
        return FER_REJECTED_STALE;
    return FER_ACCEPTED;
}

/* 4. Deadline already passed. */
static int gate_expired(struct fer_core *c, struct arrival *a)
{
    if (a->r->deadline_ns != 0 && a->now >= a->r->deadline_ns)
        return FER_EXPIRED;
    return FER_ACCEPTED;
}

/* 5. Retry / age gate: age beats slack (slack > 0 here, step 4 passed), for the requests
 * age_gate selects; and the absolute queue-age limit for all. */
static int gate_age(struct fer_core *c, struct arrival *a)
{
    const struct fer_request *r = a->r;
    uint64_t age = fer_sat_sub(a->now, r->origin_ns);
    int gated = c->cfg.age_gate == FER_AGE_GATE_ALL ||
                (c->cfg.age_gate == FER_AGE_GATE_RETRIES &&
                 r->retry_count >= c->cfg.reject_if_retry_count_gte);

    if ((r->deadline_ns != 0 && gated && age >= r->deadline_ns - a->now) ||
        (c->cfg.reject_if_queue_age_ns_gte != 0 && age >= c->cfg.reject_if_queue_age_ns_gte)) {
        c->st.rejected_late_retries++;
        return FER_REJECTED_DEADLINE;
    }
    return FER_ACCEPTED;
}

/* 6a. Queue capacity, counted after removing the queued work x would cancel (§7). When full, the
 * victim is the retained request with the latest deadline (none = latest, ties: latest arrival),
 * i.e. the last retained entry in EDF order; x displaces it only with an earlier deadline.
 * fair_share on (§7.1): x of a client within its share displaces the latest over-share request
 * instead, whatever its deadline; x of a client over its share may not displace the work of a
 * client within its share (REJECTED_CAPACITY, reason fair_share). */
static int gate_queue_full(struct fer_core *c, struct arrival *a)
{
    const struct fer_request *r = a->r;
    const struct fer_slot *v;
    uint32_t i, id, fv;

    if (a->si != FER_NONE)
        for (id = c->sessions[a->si].head; id != FER_NONE; id = c->slots[id].snext)
            a->ncancel += c->slots[id].state == FER_SLOT_QUEUED &&
                          fer_cancels(&c->slots[id], a->si, r->generation);
    if (c->qlen - a->ncancel < c->cfg.queue_capacity)
        return FER_ACCEPTED;
    if (c->cfg.fair_share && !a->x_over) {
        fv = fer_share_victim(c, r, a->si, &a->cut, c->qlen, FER_NONE);
        if (fv != FER_NONE) {
            a->fair_mask |= 1u << a->cut.n;
            a->cut.slots[a->cut.n++] = fv;
            return FER_ACCEPTED;
        }
    }
    for (i = c->qlen; i-- > 0;)
        if (!fer_cancels(&c->slots[c->queue[i]], a->si, r->generation))
            break;
    v = &c->slots[c->queue[i]];
    if (r->deadline_ns == 0 || (v->deadline_ns != 0 && r->deadline_ns >= v->deadline_ns))
        return FER_REJECTED_CAPACITY;
    /* work accepted uncharged (fair_share off, client table full) counts as within its share */
    if (c->cfg.fair_share && a->x_over &&
        (v->client == FER_NONE ||
         (v->client != a->ki && !fer_client_over(c, v->client, &a->cut)))) {
        a->why = FER_REJECT_FAIR_SHARE;
        c->st.fair_share_rejected++;
        if (a->ki != FER_NONE) /* a client not tracked yet has no counter of its own */
            c->clients[a->ki].fair_rejections++;
        return FER_REJECTED_CAPACITY;
    }
    a->cut.slots[a->cut.n++] = c->queue[i];
    return FER_ACCEPTED;
}

/* 6b. No alive lane can ever serve it (all workers died): no capacity. A request the admission
 * test judges gets its answer from the lane simulation instead (step 7: it misses). */
static int gate_no_lane(struct fer_core *c, struct arrival *a)
{
    if (c->lanes_alive == 0 && !(c->cfg.nfe_ns != 0 && a->r->deadline_ns != 0))
        return FER_REJECTED_CAPACITY;
    return FER_ACCEPTED;
}

/* 6c. A new session needs a table entry: the least recently accepted idle session gives way. */
static int gate_session_room(struct fer_core *c, struct arrival *a)
{
    if (a->si != FER_NONE || c->nsession_free != 0)
        return FER_ACCEPTED;
    a->evict = fer_session_evictable(c);
    return a->evict == FER_NONE ? FER_REJECTED_CAPACITY : FER_ACCEPTED;
}

/* 6d. A new client needs a table entry (§7.1): the least recently active idle client gives way.
 * If every tracked client has work, fair_share on refuses x; off, x is accepted uncharged (the
 * table only serves the share, which is off). */
static int gate_client_room(struct fer_core *c, struct arrival *a)
{
    if (a->ki != FER_NONE || fer_client_room(c, &a->kevict) == FER_OK)
        return FER_ACCEPTED;
    if (c->cfg.fair_share)
        return FER_REJECTED_CAPACITY;
    a->untracked = 1;
    return FER_ACCEPTED;
}

/* 7b. fair_share on (§7.1): x failed the test and its client is within its share. Displace
 * over-share queued work ahead of the first miss (work after the missing job cannot delay it):
 * ahead of x first, the largest first (fer_share_victim), re-testing after each, up to
 * FER_SHARE_VICTIMS. Only the plan in a->cut grows: nothing changes unless x then passes. */
static int displace_to_fit(struct fer_core *c, struct arrival *a, uint32_t miss, uint32_t xq)
{
    uint32_t k, id, from = a->cut.n;

    if (a->x_over || c->lanes_alive == 0)
        return 0;
    for (k = 0; k < FER_SHARE_VICTIMS; k++) {
        id = fer_share_victim(c, a->r, a->si, &a->cut,
                              fer_share_job_limit(c, a->r, a->si, &a->cut, xq, miss), xq);
        if (id == FER_NONE)
            break;
        a->fair_mask |= 1u << a->cut.n;
        a->cut.slots[a->cut.n++] = id;
        if (fer_admission_test(c, a->r, a->si, a->cut.slots, a->cut.n, a->now, &miss, &xq))
            return 1;
    }
    a->cut.n = from; /* refused: the plan is dropped, nothing was changed */
    a->fair_mask &= (1u << from) - 1;
    return 0;
}

/* 7. Calibrated admission test: only with calibration and a finite deadline. */
static int gate_admission(struct fer_core *c, struct arrival *a)
{
    uint32_t miss, xq;

    if (c->cfg.nfe_ns == 0 || a->r->deadline_ns == 0)
        return FER_ACCEPTED;
    if (!fer_admission_test(c, a->r, a->si, a->cut.slots, a->cut.n, a->now, &miss, &xq) &&
        !(c->cfg.fair_share && displace_to_fit(c, a, miss, xq)))
        return FER_REJECTED_DEADLINE;
    a->tested = 1;
    return FER_ACCEPTED;
}

static const fer_gate gates[] = {
    gate_inactive, gate_stale, gate_expired, gate_age, gate_queue_full, gate_no_lane, gate_session_room,
    gate_client_room, gate_admission,
};

/* 8a. Session si accepted generation gen: running older generations stop at their next step;
 * queued ones (ncancel of them) are answered now, in EDF order: one by binary search (the usual
 * case: the previous generation), several by one compacting pass over the queue. */
static void cancel_older(struct fer_core *c, struct arrival *a)
{
    uint32_t si = a->si, i, j, id, last = FER_NONE;
    uint64_t gen = a->r->generation;
    struct fer_slot *s;

    for (id = c->sessions[si].head; id != FER_NONE; id = s->snext) {
        s = &c->slots[id];
        if (!fer_cancels(s, si, gen))
            continue;
        if (s->state == FER_SLOT_RUNNING)
            s->cancelled = 1;
        else
            last = id;
    }
    if (a->ncancel == 1) {
        fer_queue_unlink(c, last);
        a->rang |= fer_emit_slot(c, last, FER_REJECTED_STALE, a->now, -1, NULL);
    } else if (a->ncancel > 1) {
        for (i = 0, j = 0; i < c->qlen; i++) {
            id = c->queue[i];
            if (fer_cancels(&c->slots[id], si, gen)) {
                a->rang |= fer_emit_slot(c, id, FER_REJECTED_STALE, a->now, -1, NULL);
            } else {
                c->queue[j] = id;
                c->qjobs[j++] = c->qjobs[i];
            }
        }
        c->qlen = j;
    }
}

/* 8b. The session x belongs to after acceptance: evict to make room, create, or advance the
 * generation (cancelling older work). */
static void accept_session(struct fer_core *c, struct arrival *a)
{
    if (a->evict != FER_NONE)
        fer_session_evict(c, a->evict, a->now);
    if (a->si == FER_NONE) {
        a->si = fer_session_create(c, a->r, a->hash);
    } else if (a->r->generation > c->sessions[a->si].generation) {
        c->sessions[a->si].generation = a->r->generation;
        cancel_older(c, a);
    }
    c->sessions[a->si].touch = ++c->touch_seq;
    c->sessions[a->si].last_seen_ns = a->now;
}

/* 8c. Displace what steps 6 and 7 planned; a fair-share victim is answered with reason
 * fair_share and counted against its client (§7.1). */
static void displace(struct fer_core *c, struct arrival *a)
{
    uint32_t i, id;

    for (i = 0; i < a->cut.n; i++) {
        id = a->cut.slots[i];
        fer_queue_unlink(c, id);
        c->st.displaced++;
        if (a->fair_mask & (1u << i)) {
            c->slots[id].reject_reason = FER_REJECT_FAIR_SHARE;
            c->st.fair_share_displaced++;
            c->clients[c->slots[id].client].fair_rejections++;
        }
        a->rang |= fer_emit_slot(c, id, FER_REJECTED_CAPACITY, a->now, -1, NULL);
    }
}

/* 8. Accept: nothing before this changed any state; from here on every change is committed. */
static void accept(struct fer_core *c, struct arrival *a)
{
    uint32_t id;

    accept_session(c, a);
    displace(c, a);
    id = fer_slot_take(c, a->r, a->si, a->now, a->tested);
    if (!a->untracked)
        fer_client_accept(c, a->r, a->ki, a->kevict, id, a->now);
    fer_queue_insert(c, id);
    if (a->tested) /* cost-model hook (§5.2): how far ahead admission promised */
        fer_cost_promise(&c->cost, a->now, a->r->deadline_ns);
    c->st.accepted++;
    pthread_cond_signal(&c->work_cv);
}

static int submit_locked(struct fer_core *c, struct arrival *a)
{
    size_t g;
    int d;

    if (step_coalesce(c, a))
        return FER_COALESCED;
    for (g = 0; g < sizeof(gates) / sizeof(gates[0]); g++) {
        d = gates[g](c, a);
        if (d != FER_ACCEPTED) {
            if (d == FER_REJECTED_CAPACITY && a->why == FER_REJECT_NONE)
                a->why = FER_REJECT_CAPACITY;
            if (d == FER_REJECTED_CAPACITY && a->why == FER_REJECT_CAPACITY && a->r->spill)
                return FER_SPILLED; /* a pool's successor answers it (§13.5): nothing here */
            a->rang |= fer_emit_request(c, a->r, (uint32_t)d, a->why, a->now);
            return d;
        }
    }
    accept(c, a);
    return FER_ACCEPTED;
}

int fer_core_answer_spilled(struct fer_core *c, const struct fer_request *r, uint64_t now)
{
    int rang;

    FER_CHECK_ARGS(c != NULL && r != NULL);
    pthread_mutex_lock(&c->mu);
    rang = fer_emit_request(c, r, FER_REJECTED_CAPACITY, FER_REJECT_CAPACITY, now);
    fer_unlock_and_ring(c, rang);
    return FER_REJECTED_CAPACITY;
}

int fer_core_set_accepting(struct fer_core *c, uint32_t accepting)
{
    FER_CHECK_ARGS(c != NULL);
    pthread_mutex_lock(&c->mu);
    c->refusing = !accepting;
    pthread_mutex_unlock(&c->mu);
    return FER_OK;
}

int fer_core_submit(struct fer_core *c, const struct fer_request *r, uint64_t now)
{
    struct fer_request eff;
    struct arrival a = {
        .r = r, .now = now, .si = FER_NONE, .evict = FER_NONE, .ki = FER_NONE,
        .kevict = FER_NONE,
    };
    int rc;

    FER_CHECK_ARGS(c != NULL && r != NULL);
    pthread_mutex_lock(&c->mu);
    if (!request_valid(c, r)) {
        pthread_mutex_unlock(&c->mu);
        return FER_EINVAL;
    }
    if (r->prefix_rows) { /* §5.4: decided on a copy with the window's deadline */
        eff = *r;
        eff.deadline_ns = effective_deadline(c, r);
        a.r = &eff;
    }
    count_submitted(c, r);
    a.hash = fer_session_hash(r->session_id, r->session_id_len);
    a.si = fer_session_find(c, r->session_id, r->session_id_len, a.hash);
    a.ki = fer_client_find(c, r);
    if (c->cfg.fair_share) {
        /* §7.1: x's own client is judged on what it had before x (a client may go over its
         * share by the request that takes it there: the share is not a per-request quantum);
         * everyone else's share with x counted, x's client active with x's NFE. */
        a.cut.xk = a.ki;
        a.cut.xweight = fer_client_weight(c, a.r, a.ki);
        a.x_over = fer_client_over(c, a.ki, &a.cut);
        a.cut.xnfe = r->remaining_nfe;
    }
    rc = submit_locked(c, &a);
    fer_unlock_and_ring(c, a.rang);
    return rc;
}

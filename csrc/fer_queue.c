/*
 * fer_queue.c - sessions, the bounded EDF queue, worker lanes, the DESIGN §4 decision order,
 * dispatch / step / finish, and the core's outcome routing.
 *
 * Locking: one mutex (core->mu) guards everything here. Every function holds it for bounded work,
 * O(queue_capacity + workers + max_sessions) at worst, and never sleeps while holding it except in
 * the condvar wait of fer_core_wait_for_work. Outcomes are pushed into the caller's own ring
 * under the mutex (each ring has exactly one producing thread, see fer.h); the doorbell is rung
 * once per call after the mutex is released, so the publisher never waits on admission.
 *
 * Nothing here allocates after fer_core_create.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fer_internal.h"

/* ---- small helpers ---------------------------------------------------------------------------- */

const char *fer_strerror(int rc)
{
    switch (rc) {
    case FER_OK: return "ok";
    case FER_EINVAL: return "invalid argument";
    case FER_ENOMEM: return "out of memory";
    case FER_ESTATE: return "call not valid in the current lane state";
    case FER_EFULL: return "ring full";
    case FER_ESYS: return "pthread initialisation failed";
    default: return "unknown error";
    }
}

static uint64_t fnv1a(const char *p, uint32_t n)
{
    uint64_t h = 1469598103934665603ull;
    uint32_t i;

    for (i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t round_pow2(uint64_t n)
{
    uint64_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

/* EDF order: finite deadlines before none, earlier deadline first, ties by arrival (submit order). */
static int edf_before(uint64_t da, uint64_t sa, uint64_t db, uint64_t sb)
{
    if ((da == 0) != (db == 0))
        return db == 0;
    if (da != db)
        return da < db;
    return sa < sb;
}

/* ---- sessions: fixed table + open-addressing index --------------------------------------------- */

static uint32_t session_find(struct fer_core *c, const char *id, uint32_t len, uint64_t h)
{
    uint64_t i = h & c->session_hash_mask;
    uint32_t e;

    /* The index is at least twice max_sessions, so an empty bucket always ends the probe. */
    while ((e = c->session_hash[i]) != 0) {
        struct fer_session *s = &c->sessions[e - 1];
        if (s->hash == h && s->len == len && memcmp(s->id, id, len) == 0)
            return e - 1;
        i = (i + 1) & c->session_hash_mask;
    }
    return FER_NONE;
}

static void session_index_insert(struct fer_core *c, uint32_t si)
{
    uint64_t i = c->sessions[si].hash & c->session_hash_mask;

    while (c->session_hash[i] != 0)
        i = (i + 1) & c->session_hash_mask;
    c->session_hash[i] = si + 1;
}

/* Linear-probing delete by backward shift (no tombstones, so probes stay short forever). */
static void session_index_remove(struct fer_core *c, uint32_t si)
{
    uint64_t mask = c->session_hash_mask;
    uint64_t i = c->sessions[si].hash & mask, j, home;

    while (c->session_hash[i] != si + 1)
        i = (i + 1) & mask;
    j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (c->session_hash[j] == 0)
            break;
        home = c->sessions[c->session_hash[j] - 1].hash & mask;
        /* Move entry j into the hole at i unless its home lies cyclically in (i, j]. */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            c->session_hash[i] = c->session_hash[j];
            i = j;
        }
    }
    c->session_hash[i] = 0;
}

/* Least recently accepted session with no queued or running work, or FER_NONE. */
static uint32_t session_evictable(struct fer_core *c)
{
    uint32_t i, best = FER_NONE;

    for (i = 0; i < c->cfg.max_sessions; i++) {
        struct fer_session *s = &c->sessions[i];
        if (s->in_use && s->outstanding == 0 &&
            (best == FER_NONE || s->touch < c->sessions[best].touch))
            best = i;
    }
    return best;
}

/* Forget a session, including its generation watermark: a later request of the same id starts
 * a fresh session. This is why only sessions without outstanding work are evicted. */
static void session_evict(struct fer_core *c, uint32_t si, uint64_t now)
{
    struct fer_session *s = &c->sessions[si];

    c->st.sessions_evicted++;
    if (fer_sat_sub(now, s->last_seen_ns) < c->cfg.session_idle_ns)
        c->st.sessions_evicted_early++;
    session_index_remove(c, si);
    s->in_use = 0;
    c->session_free[c->nsession_free++] = si;
}

static uint32_t session_create(struct fer_core *c, const struct fer_request *r, uint64_t h)
{
    uint32_t si = c->session_free[--c->nsession_free];
    struct fer_session *s = &c->sessions[si];

    memcpy(s->id, r->session_id, r->session_id_len);
    s->len = r->session_id_len;
    s->hash = h;
    s->generation = r->generation;
    s->outstanding = 0;
    s->head = FER_NONE;
    s->in_use = 1;
    session_index_insert(c, si);
    return si;
}

/* ---- slots and the queue ---------------------------------------------------------------------- */

static void session_link(struct fer_core *c, uint32_t si, uint32_t id)
{
    struct fer_session *ss = &c->sessions[si];
    struct fer_slot *s = &c->slots[id];

    s->session = si;
    s->sprev = FER_NONE;
    s->snext = ss->head;
    if (ss->head != FER_NONE)
        c->slots[ss->head].sprev = id;
    ss->head = id;
    ss->outstanding++;
}

static void slot_free(struct fer_core *c, uint32_t id)
{
    struct fer_slot *s = &c->slots[id];
    struct fer_session *ss = &c->sessions[s->session];

    if (s->sprev != FER_NONE)
        c->slots[s->sprev].snext = s->snext;
    else
        ss->head = s->snext;
    if (s->snext != FER_NONE)
        c->slots[s->snext].sprev = s->sprev;
    ss->outstanding--;
    s->state = FER_SLOT_FREE;
    s->cancelled = 0;
    c->free_slots[c->nfree++] = id;
}

/* Position x would take in the queue: after every entry it does not precede (x arrives last). */
static uint32_t queue_position(const struct fer_core *c, uint64_t deadline, uint64_t seq)
{
    uint32_t lo = 0, hi = c->qlen, mid;

    while (lo < hi) {
        const struct fer_slot *q;
        mid = lo + (hi - lo) / 2;
        q = &c->slots[c->queue[mid]];
        if (edf_before(deadline, seq, q->deadline_ns, q->arrival_seq))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* Index of queued slot id (keys are unique: arrival_seq breaks every tie). O(log queue). */
static uint32_t queue_find(const struct fer_core *c, uint32_t id)
{
    const struct fer_slot *s = &c->slots[id];
    uint32_t lo = 0, hi = c->qlen, mid;

    while (lo < hi) {
        const struct fer_slot *q;
        mid = lo + (hi - lo) / 2;
        q = &c->slots[c->queue[mid]];
        if (edf_before(q->deadline_ns, q->arrival_seq, s->deadline_ns, s->arrival_seq))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void queue_insert(struct fer_core *c, uint32_t id)
{
    struct fer_slot *s = &c->slots[id];
    uint32_t pos = queue_position(c, s->deadline_ns, s->arrival_seq);
    size_t tail = (size_t)(c->qlen - pos);

    memmove(&c->queue[pos + 1], &c->queue[pos], tail * sizeof(*c->queue));
    memmove(&c->qjobs[pos + 1], &c->qjobs[pos], tail * sizeof(*c->qjobs));
    c->queue[pos] = id;
    c->qjobs[pos].deadline_ns = s->deadline_ns;
    c->qjobs[pos].remaining_nfe = s->remaining_nfe;
    c->qlen++;
    s->state = FER_SLOT_QUEUED;
}

/* Remove the first n entries from position pos on. */
static void queue_remove(struct fer_core *c, uint32_t pos, uint32_t n)
{
    size_t tail = (size_t)(c->qlen - pos - n);

    memmove(&c->queue[pos], &c->queue[pos + n], tail * sizeof(*c->queue));
    memmove(&c->qjobs[pos], &c->qjobs[pos + n], tail * sizeof(*c->qjobs));
    c->qlen -= n;
}

/* ---- outcomes ----------------------------------------------------------------------------------- */

/* Push one outcome into ring `ring` (the caller's own ring). Counts it by code, and as dropped
 * if the ring is full. Returns 1 if it was committed (the doorbell should be rung). */
static int emit(struct fer_core *c, uint32_t ring, const struct fer_outcome *o, const float *act)
{
    c->st.outcomes[o->code]++;
    if (fer_ring_push_quiet(c->rings[ring], o, act) == FER_OK)
        return 1;
    if (o->code == FER_INFERENCE)
        c->st.action_outputs_dropped++;
    else
        c->st.rejection_outputs_dropped++;
    return 0;
}

/* An outcome for a request decided at submit, before it got a slot. */
static int emit_request(struct fer_core *c, const struct fer_request *r, uint32_t code,
                        uint64_t now)
{
    struct fer_outcome o;

    memset(&o, 0, sizeof(o));
    memcpy(o.session_id, r->session_id, r->session_id_len);
    o.session_id_len = r->session_id_len;
    o.code = code;
    o.lane = -1;
    o.retry_count = r->retry_count;
    o.retry_reason = r->retry_reason;
    o.remaining_nfe = r->remaining_nfe;
    o.sequence = r->sequence;
    o.generation = r->generation;
    o.deadline_ros_ns = r->deadline_ros_ns;
    o.arrival_ns = now;
    o.finish_ns = now;
    return emit(c, 0, &o, NULL);
}

/* An outcome for work that holds a slot; frees the slot (and the lane, if it ran). EXPIRED and
 * REJECTED_STALE ends add the NFE already spent to nfe_wasted; an EXPIRED end of work that passed
 * the admission test is a calibration miss. */
static int emit_slot(struct fer_core *c, uint32_t id, uint32_t code, uint64_t now, int32_t lane,
                     const float *act)
{
    struct fer_slot *s = &c->slots[id];
    struct fer_outcome o;
    int ran = s->state == FER_SLOT_RUNNING;
    uint32_t ring = lane < 0 ? 0 : (uint32_t)lane + 1;
    int rang;

    memset(&o, 0, sizeof(o));
    memcpy(o.session_id, s->session_id, s->session_id_len);
    o.session_id_len = s->session_id_len;
    o.code = code;
    o.lane = lane;
    o.retry_count = s->retry_count;
    o.retry_reason = s->retry_reason;
    o.remaining_nfe = s->remaining_nfe;
    o.nfe_done = s->nfe_done;
    o.has_actions = code == FER_INFERENCE;
    o.sequence = s->sequence;
    o.generation = s->generation;
    o.deadline_ros_ns = s->deadline_ros_ns;
    o.arrival_ns = s->arrival_ns;
    o.finish_ns = now;
    o.queue_ns = fer_sat_sub(ran ? s->dispatch_ns : now, s->arrival_ns);
    o.compute_ns = ran ? fer_sat_sub(now, s->dispatch_ns) : 0;
    if (code == FER_EXPIRED || code == FER_REJECTED_STALE)
        c->st.nfe_wasted += s->nfe_done;
    if (code == FER_EXPIRED && s->tested)
        c->st.calibration_misses++;
    rang = emit(c, ring, &o, act);
    if (ran)
        c->lanes[s->lane].slot = FER_NONE;
    slot_free(c, id);
    return rang;
}

/* ---- lifetime ------------------------------------------------------------------------------------ */

static int config_valid(const struct fer_config *cfg)
{
    return cfg->workers >= 1 && cfg->workers <= FER_MAX_WORKERS && cfg->queue_capacity >= 1 &&
           cfg->queue_capacity <= FER_MAX_QUEUE && cfg->max_sessions >= 1 &&
           cfg->max_sessions <= FER_MAX_SESSIONS && cfg->max_nfe >= 1 && cfg->ring_capacity >= 1 &&
           cfg->ring_capacity <= FER_MAX_RING && cfg->age_gate <= FER_AGE_GATE_ALL &&
           fer_cost_config_valid(cfg); /* cost-model hook (fer_cost.c) */
}

int fer_core_create(const struct fer_config *cfg, struct fer_core **out)
{
    struct fer_core *c;
    pthread_condattr_t ca;
    uint32_t i;
    int rc;

    if (out == NULL)
        return FER_EINVAL;
    *out = NULL;
    if (cfg == NULL || !config_valid(cfg))
        return FER_EINVAL;
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return FER_ENOMEM;
    c->cfg = *cfg;
    c->cfg.ring_capacity = (uint32_t)round_pow2(cfg->ring_capacity);
    c->nslots = cfg->queue_capacity + cfg->workers;
    c->nrings = cfg->workers + 1;
    c->session_hash_mask = round_pow2(2ull * cfg->max_sessions) - 1;

    c->slots = calloc(c->nslots, sizeof(*c->slots));
    c->free_slots = calloc(c->nslots, sizeof(*c->free_slots));
    c->obs_slab = calloc((size_t)c->nslots * (cfg->obs_dim ? cfg->obs_dim : 1), sizeof(float));
    c->queue = calloc(cfg->queue_capacity, sizeof(*c->queue));
    c->qjobs = calloc(cfg->queue_capacity, sizeof(*c->qjobs));
    c->skip = calloc(c->nslots, sizeof(*c->skip));
    c->sessions = calloc(cfg->max_sessions, sizeof(*c->sessions));
    c->session_free = calloc(cfg->max_sessions, sizeof(*c->session_free));
    c->session_hash = calloc(c->session_hash_mask + 1, sizeof(*c->session_hash));
    c->lanes = calloc(cfg->workers, sizeof(*c->lanes));
    c->rings = calloc(c->nrings, sizeof(*c->rings));
    c->jobs = calloc((size_t)cfg->queue_capacity + 1, sizeof(*c->jobs));
    c->lane_start = calloc(cfg->workers, sizeof(*c->lane_start));
    c->lane_scratch = calloc(cfg->workers, sizeof(*c->lane_scratch));
    if (!c->slots || !c->free_slots || !c->obs_slab || !c->queue || !c->qjobs || !c->skip ||
        !c->sessions ||
        !c->session_free || !c->session_hash || !c->lanes || !c->rings || !c->jobs ||
        !c->lane_start || !c->lane_scratch) {
        fer_core_destroy(c);
        return FER_ENOMEM;
    }
    /* Free stacks are popped from the end: fill them so slot / session 0 is used first. */
    for (i = 0; i < c->nslots; i++) {
        c->slots[i].obs = &c->obs_slab[(size_t)i * cfg->obs_dim];
        c->free_slots[i] = c->nslots - 1 - i;
    }
    c->nfree = c->nslots;
    for (i = 0; i < cfg->max_sessions; i++)
        c->session_free[i] = cfg->max_sessions - 1 - i;
    c->nsession_free = cfg->max_sessions;
    for (i = 0; i < cfg->workers; i++) {
        c->lanes[i].slot = FER_NONE;
        c->lanes[i].alive = 1;
    }
    c->lanes_alive = cfg->workers;
    fer_cost_configure(&c->cost, &c->cfg); /* cost-model hook: effective window / quantile */

    rc = fer_doorbell_init(&c->bell);
    if (rc != FER_OK) {
        fer_core_destroy(c);
        return rc;
    }
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        fer_doorbell_fini(&c->bell);
        fer_core_destroy(c);
        return FER_ESYS;
    }
    /* wait_for_work times out on CLOCK_MONOTONIC, like every other time in the core. */
    if (pthread_condattr_init(&ca) != 0 || pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
        pthread_cond_init(&c->work_cv, &ca) != 0) {
        pthread_mutex_destroy(&c->mu);
        fer_doorbell_fini(&c->bell);
        fer_core_destroy(c);
        return FER_ESYS;
    }
    pthread_condattr_destroy(&ca);
    c->sync_ready = 1;
    atomic_init(&c->shutdown, 0);
    for (i = 0; i < c->nrings; i++) {
        /* Ring 0 carries only rejections: it needs no action slab. */
        rc = fer_ring_init_shared(c->cfg.ring_capacity, i == 0 ? 0 : cfg->action_len, &c->bell,
                                  &c->rings[i]);
        if (rc != FER_OK) {
            fer_core_destroy(c);
            return rc;
        }
    }
    *out = c;
    return FER_OK;
}

void fer_core_destroy(struct fer_core *c)
{
    uint32_t i;

    if (c == NULL)
        return;
    if (c->sync_ready) {
        pthread_cond_destroy(&c->work_cv);
        pthread_mutex_destroy(&c->mu);
        fer_doorbell_fini(&c->bell);
    }
    if (c->rings != NULL)
        for (i = 0; i < c->nrings; i++)
            fer_ring_destroy(c->rings[i]);
    free(c->rings);
    free(c->slots);
    free(c->free_slots);
    free(c->obs_slab);
    free(c->queue);
    free(c->qjobs);
    free(c->skip);
    free(c->sessions);
    free(c->session_free);
    free(c->session_hash);
    free(c->lanes);
    free(c->jobs);
    free(c->lane_start);
    free(c->lane_scratch);
    free(c);
}

void fer_core_shutdown(struct fer_core *c)
{
    pthread_mutex_lock(&c->mu);
    atomic_store_explicit(&c->shutdown, 1, memory_order_relaxed); /* read under mu */
    pthread_cond_broadcast(&c->work_cv);
    pthread_mutex_unlock(&c->mu);
    fer_doorbell_close(&c->bell);
}

int fer_core_get_config(struct fer_core *c, struct fer_config *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->cfg;
    pthread_mutex_unlock(&c->mu);
    return FER_OK;
}

/* ---- admission (DESIGN §4) ---------------------------------------------------------------------- */

/* Whether accepting a request of session `si` with generation `gen` cancels slot s. */
static int cancels(const struct fer_slot *s, uint32_t si, uint64_t gen)
{
    return si != FER_NONE && s->session == si && s->generation < gen;
}

/* Up to this many skipped queue entries are located by binary search and the queue copied in
 * contiguous segments around them; more fall back to one flagged pass (O(queue) either way). */
#define FER_SKIP_FAST 8

/* Append the retained queue entries in [from, to) to c->jobs, with x inserted before queue index
 * xq if xq falls in [from, to]. */
static void jobs_append(struct fer_core *c, uint32_t from, uint32_t to, uint32_t xq,
                        const struct fer_admit_job *x, uint32_t *nj, uint32_t *xpos)
{
    if (*xpos == FER_NONE && xq <= to) {
        memcpy(&c->jobs[*nj], &c->qjobs[from], (size_t)(xq - from) * sizeof(*c->jobs));
        *nj += xq - from;
        *xpos = (*nj)++;
        c->jobs[*xpos] = *x;
        from = xq;
    }
    memcpy(&c->jobs[*nj], &c->qjobs[from], (size_t)(to - from) * sizeof(*c->jobs));
    *nj += to - from;
}

/* §5: build the simulated state for x and run the predicate. victim is the slot x displaces,
 * or FER_NONE. Returns 1 if x is admissible. O(workers + queue), mostly contiguous copies. */
static int admissible(struct fer_core *c, const struct fer_request *r, uint32_t si, uint32_t victim,
                      uint64_t now)
{
    /* cost-model hook (§5.2): static = nfe_ns, adaptive = max(nfe_ns, observed tail); O(1). */
    uint64_t nfe = fer_cost_nfe_ns(&c->cost, c->cfg.nfe_ns, now);
    uint32_t nl = 0, nj = 0, nskip = 0, xq, xpos = FER_NONE, i, k, id, from;
    uint32_t skip_pos[FER_SKIP_FAST];
    struct fer_admit_job x;

    if (c->lanes_alive == 0)
        return 0;
    for (i = 0; i < c->cfg.workers; i++) {
        const struct fer_lane *l = &c->lanes[i];
        const struct fer_slot *s;
        if (!l->alive)
            continue;
        if (l->slot == FER_NONE) {
            c->lane_start[nl++] = now;
            continue;
        }
        s = &c->slots[l->slot];
        /* Cancelled work (already, or by x) stops after the step in flight: one NFE. */
        if (s->cancelled || cancels(s, si, r->generation))
            c->lane_start[nl++] = fer_sat_add(now, nfe);
        else
            c->lane_start[nl++] = fer_sat_finish(now, s->remaining_nfe, nfe);
    }
    /* The queue as it would be: minus the work x cancels and the victim, plus x (which arrives
     * last, so it goes after every entry it does not precede). */
    x.deadline_ns = r->deadline_ns;
    x.remaining_nfe = r->remaining_nfe;
    xq = queue_position(c, r->deadline_ns, c->arrival_seq + 1);
    if (si != FER_NONE)
        for (id = c->sessions[si].head; id != FER_NONE; id = c->slots[id].snext)
            if (c->slots[id].state == FER_SLOT_QUEUED &&
                cancels(&c->slots[id], si, r->generation)) {
                if (nskip < FER_SKIP_FAST)
                    skip_pos[nskip] = queue_find(c, id);
                c->skip[id] = 1;
                nskip++;
            }
    if (victim != FER_NONE) {
        if (nskip < FER_SKIP_FAST)
            skip_pos[nskip] = queue_find(c, victim);
        c->skip[victim] = 1;
        nskip++;
    }
    if (nskip <= FER_SKIP_FAST) {
        /* Sort the few skipped positions, then copy the segments between them. */
        for (i = 1; i < nskip; i++)
            for (k = i; k > 0 && skip_pos[k - 1] > skip_pos[k]; k--) {
                uint32_t t = skip_pos[k];
                skip_pos[k] = skip_pos[k - 1];
                skip_pos[k - 1] = t;
            }
        for (from = 0, k = 0; k < nskip; from = skip_pos[k++] + 1)
            jobs_append(c, from, skip_pos[k], xq, &x, &nj, &xpos);
        jobs_append(c, from, c->qlen, xq, &x, &nj, &xpos);
    } else {
        for (i = 0; i <= c->qlen; i++) {
            if (i == xq) {
                xpos = nj;
                c->jobs[nj++] = x;
            }
            if (i < c->qlen && !c->skip[c->queue[i]])
                c->jobs[nj++] = c->qjobs[i];
        }
    }
    /* Leave skip all-zero for the next call. */
    if (si != FER_NONE)
        for (id = c->sessions[si].head; id != FER_NONE; id = c->slots[id].snext)
            c->skip[id] = 0;
    if (victim != FER_NONE)
        c->skip[victim] = 0;
    /* Jobs ahead of x are not re-judged: x's acceptance only removes work (cancelled, displaced)
     * or shortens it (cancelled lanes), and EDF list placement is monotone in that, so they
     * finish no later than they already would. */
    return fer_admit_first_miss(c->lane_start, nl, c->jobs, nj, xpos, nfe,
                                c->cfg.admission_reserve_ns, c->lane_scratch) == nj;
}

static int request_valid(const struct fer_core *c, const struct fer_request *r)
{
    return r->session_id_len <= FER_SESSION_ID_MAX && r->remaining_nfe >= 1 &&
           r->remaining_nfe <= c->cfg.max_nfe && r->retry_reason < FER_RETRY_REASONS &&
           (c->cfg.obs_dim == 0 || r->observation != NULL);
}

static int submit_locked(struct fer_core *c, const struct fer_request *r, uint64_t now, int *rang)
{
    uint64_t h = fnv1a(r->session_id, r->session_id_len);
    uint32_t si = session_find(c, r->session_id, r->session_id_len, h);
    uint32_t i, id, last = FER_NONE, ncancel = 0, victim = FER_NONE, evict = FER_NONE;
    uint64_t age;
    int tested = 0;
    struct fer_slot *s;

    /* 2. duplicate of queued or running (session_id, sequence): coalesce, no output. */
    if (si != FER_NONE) {
        for (id = c->sessions[si].head; id != FER_NONE; id = c->slots[id].snext) {
            s = &c->slots[id];
            if (s->sequence != r->sequence)
                continue;
            c->st.coalesced++;
            /* The original answers once; if it is queued and already late, answer now. */
            if (s->state == FER_SLOT_QUEUED && s->deadline_ns != 0 && now >= s->deadline_ns) {
                queue_remove(c, queue_find(c, id), 1);
                *rang |= emit_slot(c, id, FER_EXPIRED, now, -1, NULL);
            }
            return FER_COALESCED;
        }
    }
    /* 3. older than the session's accepted generation. */
    if (si != FER_NONE && r->generation < c->sessions[si].generation) {
        *rang |= emit_request(c, r, FER_REJECTED_STALE, now);
        return FER_REJECTED_STALE;
    }
    /* 4. deadline already passed. */
    if (r->deadline_ns != 0 && now >= r->deadline_ns) {
        *rang |= emit_request(c, r, FER_EXPIRED, now);
        return FER_EXPIRED;
    }
    /* 5. retry / age gate: age beats slack (slack > 0 here, step 4 passed). */
    age = fer_sat_sub(now, r->origin_ns);
    if ((r->deadline_ns != 0 &&
         (c->cfg.age_gate == FER_AGE_GATE_ALL ||
          (c->cfg.age_gate == FER_AGE_GATE_RETRIES &&
           r->retry_count >= c->cfg.reject_if_retry_count_gte)) &&
         age >= r->deadline_ns - now) ||
        (c->cfg.reject_if_queue_age_ns_gte != 0 && age >= c->cfg.reject_if_queue_age_ns_gte)) {
        c->st.rejected_late_retries++;
        *rang |= emit_request(c, r, FER_REJECTED_DEADLINE, now);
        return FER_REJECTED_DEADLINE;
    }
    /* 6. capacity, counted after removing queued work x would cancel (§7). The victim is the
     * retained request with the latest deadline (none = latest, ties: latest arrival), i.e. the
     * last retained entry in EDF order. */
    if (si != FER_NONE)
        for (id = c->sessions[si].head; id != FER_NONE; id = c->slots[id].snext)
            ncancel += c->slots[id].state == FER_SLOT_QUEUED &&
                       cancels(&c->slots[id], si, r->generation);
    if (c->qlen - ncancel >= c->cfg.queue_capacity) {
        const struct fer_slot *v;
        for (i = c->qlen; i-- > 0;)
            if (!cancels(&c->slots[c->queue[i]], si, r->generation))
                break;
        victim = c->queue[i];
        v = &c->slots[victim];
        if (r->deadline_ns == 0 || (v->deadline_ns != 0 && r->deadline_ns >= v->deadline_ns)) {
            *rang |= emit_request(c, r, FER_REJECTED_CAPACITY, now);
            return FER_REJECTED_CAPACITY;
        }
    }
    /* No alive lane can ever serve it (all workers died): no capacity. A request the admission
     * test judges gets its answer from the lane simulation instead (step 7: it misses). */
    if (c->lanes_alive == 0 && !(c->cfg.nfe_ns != 0 && r->deadline_ns != 0)) {
        *rang |= emit_request(c, r, FER_REJECTED_CAPACITY, now);
        return FER_REJECTED_CAPACITY;
    }
    if (si == FER_NONE && c->nsession_free == 0) {
        evict = session_evictable(c);
        if (evict == FER_NONE) {
            *rang |= emit_request(c, r, FER_REJECTED_CAPACITY, now);
            return FER_REJECTED_CAPACITY;
        }
    }
    /* 7. calibrated admission test: only with calibration and a finite deadline. */
    if (c->cfg.nfe_ns != 0 && r->deadline_ns != 0) {
        if (!admissible(c, r, si, victim, now)) {
            *rang |= emit_request(c, r, FER_REJECTED_DEADLINE, now);
            return FER_REJECTED_DEADLINE;
        }
        tested = 1;
    }

    /* 8. accept. Nothing above changed any state; from here on every change is committed. */
    if (evict != FER_NONE)
        session_evict(c, evict, now);
    if (si == FER_NONE) {
        si = session_create(c, r, h);
    } else if (r->generation > c->sessions[si].generation) {
        c->sessions[si].generation = r->generation;
        /* Running older generations stop at their next step; queued ones are answered now, in
         * EDF order: one by binary search (the usual case: the previous generation), several
         * by one compacting pass over the queue. */
        for (id = c->sessions[si].head; id != FER_NONE; id = c->slots[id].snext) {
            s = &c->slots[id];
            if (!cancels(s, si, r->generation))
                continue;
            if (s->state == FER_SLOT_RUNNING)
                s->cancelled = 1;
            else
                last = id;
        }
        if (ncancel == 1) {
            queue_remove(c, queue_find(c, last), 1);
            *rang |= emit_slot(c, last, FER_REJECTED_STALE, now, -1, NULL);
        } else if (ncancel > 1) {
            uint32_t j = 0;
            for (i = 0; i < c->qlen; i++) {
                id = c->queue[i];
                if (cancels(&c->slots[id], si, r->generation)) {
                    *rang |= emit_slot(c, id, FER_REJECTED_STALE, now, -1, NULL);
                } else {
                    c->queue[j] = id;
                    c->qjobs[j++] = c->qjobs[i];
                }
            }
            c->qlen = j;
        }
    }
    c->sessions[si].touch = ++c->touch_seq;
    c->sessions[si].last_seen_ns = now;
    if (victim != FER_NONE) {
        queue_remove(c, queue_find(c, victim), 1);
        c->st.displaced++;
        *rang |= emit_slot(c, victim, FER_REJECTED_CAPACITY, now, -1, NULL);
    }
    id = c->free_slots[--c->nfree];
    s = &c->slots[id];
    memcpy(s->session_id, r->session_id, r->session_id_len);
    s->session_id_len = r->session_id_len;
    s->retry_count = r->retry_count;
    s->retry_reason = r->retry_reason;
    s->remaining_nfe = r->remaining_nfe;
    s->nfe_done = 0;
    s->lane = FER_NONE;
    s->tested = (uint8_t)tested;
    s->cancelled = 0;
    s->sequence = r->sequence;
    s->generation = r->generation;
    s->deadline_ns = r->deadline_ns;
    s->deadline_ros_ns = r->deadline_ros_ns;
    s->noise_seed = r->noise_seed;
    s->arrival_ns = now;
    s->arrival_seq = ++c->arrival_seq;
    s->dispatch_ns = 0;
    if (c->cfg.obs_dim)
        memcpy(s->obs, r->observation, (size_t)c->cfg.obs_dim * sizeof(float));
    session_link(c, si, id);
    queue_insert(c, id);
    c->st.accepted++;
    pthread_cond_signal(&c->work_cv);
    return FER_ACCEPTED;
}

int fer_core_submit(struct fer_core *c, const struct fer_request *r, uint64_t now)
{
    int rc, rang = 0;

    if (c == NULL || r == NULL)
        return FER_EINVAL;
    pthread_mutex_lock(&c->mu);
    if (!request_valid(c, r)) {
        pthread_mutex_unlock(&c->mu);
        return FER_EINVAL;
    }
    /* 1. (validation happened in the node) the request is counted from here on. */
    c->st.submitted++;
    if (r->retry_count >= 1) {
        c->st.retries_by_count[r->retry_count < 7 ? r->retry_count : 7]++;
        c->st.retries_by_reason[r->retry_reason]++;
    }
    rc = submit_locked(c, r, now, &rang);
    pthread_mutex_unlock(&c->mu);
    if (rang)
        fer_doorbell_ring(&c->bell);
    return rc;
}

/* ---- workers ------------------------------------------------------------------------------------- */

int fer_core_wait_for_work(struct fer_core *c, uint32_t lane, uint64_t timeout_ns)
{
    struct timespec ts;
    int ready;

    if (c == NULL || lane >= c->cfg.workers)
        return FER_EINVAL;
    ts = fer_deadline_after(timeout_ns);
    pthread_mutex_lock(&c->mu);
    while (c->qlen == 0 && !atomic_load_explicit(&c->shutdown, memory_order_relaxed))
        if (pthread_cond_timedwait(&c->work_cv, &c->mu, &ts) == ETIMEDOUT)
            break;
    ready = c->qlen > 0 && !atomic_load_explicit(&c->shutdown, memory_order_relaxed);
    pthread_mutex_unlock(&c->mu);
    return ready;
}

/* Whether queued slot s can still finish by its deadline if started now. */
static int dispatch_expired(const struct fer_core *c, const struct fer_slot *s, uint64_t now)
{
    if (s->deadline_ns == 0)
        return 0;
    if (c->cfg.nfe_ns == 0)
        return now >= s->deadline_ns;
    /* cost-model hook (§5.2): the same per-NFE cost admission assumes. */
    return !fer_meets(fer_sat_finish(now, s->remaining_nfe,
                                     fer_cost_nfe_ns(&c->cost, c->cfg.nfe_ns, now)),
                      s->deadline_ns);
}

int fer_core_dispatch(struct fer_core *c, uint32_t lane, uint64_t now, struct fer_work *out)
{
    uint32_t i, id = FER_NONE;
    int rang = 0, rc = 0;
    struct fer_slot *s;

    if (c == NULL || out == NULL || lane >= c->cfg.workers ||
        (c->cfg.obs_dim && out->observation == NULL))
        return FER_EINVAL;
    pthread_mutex_lock(&c->mu);
    if (!c->lanes[lane].alive || c->lanes[lane].slot != FER_NONE) {
        pthread_mutex_unlock(&c->mu);
        return FER_ESTATE;
    }
    /* Skip (and answer) the head entries that can no longer be served; remove them and the
     * dispatched one with a single queue_remove so the whole call stays O(queue). */
    for (i = 0; i < c->qlen; i++) {
        uint32_t q = c->queue[i];
        s = &c->slots[q];
        if (dispatch_expired(c, s, now)) {
            rang |= emit_slot(c, q, FER_EXPIRED, now, (int32_t)lane, NULL);
        } else if (c->cfg.queue_timeout_ns != 0 &&
                   fer_sat_sub(now, s->arrival_ns) > c->cfg.queue_timeout_ns) {
            rang |= emit_slot(c, q, FER_REJECTED_DEADLINE, now, (int32_t)lane, NULL);
        } else {
            id = q;
            i++;
            break;
        }
    }
    queue_remove(c, 0, i);
    if (id != FER_NONE) {
        s = &c->slots[id];
        s->state = FER_SLOT_RUNNING;
        s->lane = lane;
        s->dispatch_ns = now;
        c->lanes[lane].slot = id;
        memcpy(out->session_id, s->session_id, s->session_id_len);
        out->session_id_len = s->session_id_len;
        out->lane = lane;
        out->slot = id;
        out->remaining_nfe = s->remaining_nfe;
        out->sequence = s->sequence;
        out->generation = s->generation;
        out->noise_seed = s->noise_seed;
        out->deadline_ns = s->deadline_ns;
        if (c->cfg.obs_dim)
            memcpy(out->observation, s->obs, (size_t)c->cfg.obs_dim * sizeof(float));
        rc = 1;
    }
    pthread_mutex_unlock(&c->mu);
    if (rang)
        fer_doorbell_ring(&c->bell);
    return rc;
}

/* The running slot of `lane`, or FER_NONE if the lane is idle, dead or out of range. */
static uint32_t running_slot(const struct fer_core *c, uint32_t lane)
{
    if (lane >= c->cfg.workers || !c->lanes[lane].alive)
        return FER_NONE;
    return c->lanes[lane].slot;
}

int fer_core_step(struct fer_core *c, uint32_t lane, uint64_t now, uint64_t nfe_ns_measured)
{
    uint32_t id;
    struct fer_slot *s;
    int rc, rang = 0;

    if (c == NULL || lane >= c->cfg.workers)
        return FER_EINVAL;
    pthread_mutex_lock(&c->mu);
    id = running_slot(c, lane);
    if (id == FER_NONE || c->slots[id].remaining_nfe == 0) {
        /* No work, or the work is already DONE and waits for finish. */
        pthread_mutex_unlock(&c->mu);
        return FER_ESTATE;
    }
    s = &c->slots[id];
    s->remaining_nfe--;
    s->nfe_done++;
    c->st.nfe_total++;
    c->st.busy_ns = fer_sat_add(c->st.busy_ns, nfe_ns_measured);
    fer_cost_record(&c->cost, now, nfe_ns_measured); /* cost-model hook: measured tail */
    if (s->cancelled) {
        rang = emit_slot(c, id, FER_REJECTED_STALE, now, (int32_t)lane, NULL);
        rc = FER_STEP_STOP_STALE;
    } else if (s->remaining_nfe == 0) {
        rc = FER_STEP_DONE;
    } else if (s->deadline_ns != 0 && now >= s->deadline_ns) {
        rang = emit_slot(c, id, FER_EXPIRED, now, (int32_t)lane, NULL);
        rc = FER_STEP_STOP_EXPIRED;
    } else {
        rc = FER_STEP_CONTINUE;
    }
    pthread_mutex_unlock(&c->mu);
    if (rang)
        fer_doorbell_ring(&c->bell);
    return rc;
}

int fer_core_output_space(struct fer_core *c, uint32_t lane)
{
    if (c == NULL || lane >= c->cfg.workers)
        return FER_EINVAL;
    /* Lane i's worker is ring i+1's producer: no core mutex needed. */
    return fer_ring_free_slots(c->rings[lane + 1]) > 0;
}

int fer_core_finish(struct fer_core *c, uint32_t lane, uint64_t now, const float *actions)
{
    uint32_t id, code;
    struct fer_slot *s;
    int rang;

    if (c == NULL || lane >= c->cfg.workers || (c->cfg.action_len && actions == NULL))
        return FER_EINVAL;
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
    rang = emit_slot(c, id, code, now, (int32_t)lane, code == FER_INFERENCE ? actions : NULL);
    pthread_mutex_unlock(&c->mu);
    if (rang)
        fer_doorbell_ring(&c->bell);
    return (int)code;
}

int fer_core_disable_lane(struct fer_core *c, uint32_t lane, uint64_t now)
{
    uint32_t id;
    int rang = 0;

    if (c == NULL || lane >= c->cfg.workers)
        return FER_EINVAL;
    pthread_mutex_lock(&c->mu);
    if (c->lanes[lane].alive) {
        id = c->lanes[lane].slot;
        if (id != FER_NONE) {
            /* Not a calibration miss: the worker died, the estimate was not wrong. */
            c->slots[id].tested = 0;
            rang = emit_slot(c, id, FER_EXPIRED, now, (int32_t)lane, NULL);
        }
        c->lanes[lane].alive = 0;
        c->lanes_alive--;
        /* The last lane is gone: nothing queued will ever be dispatched. Answer it all now
         * (ring lane+1 has this caller as its only producer). */
        if (c->lanes_alive == 0) {
            uint32_t i;
            for (i = 0; i < c->qlen; i++)
                rang |= emit_slot(c, c->queue[i], FER_REJECTED_CAPACITY, now, (int32_t)lane,
                                  NULL);
            queue_remove(c, 0, c->qlen);
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (rang)
        fer_doorbell_ring(&c->bell);
    return FER_OK;
}

/* ---- publisher ------------------------------------------------------------------------------------ */

static int any_output(struct fer_core *c)
{
    uint32_t i;

    for (i = 0; i < c->nrings; i++)
        if (fer_ring_nonempty(c->rings[i]))
            return 1;
    return 0;
}

int fer_core_wait_outputs(struct fer_core *c, uint64_t timeout_ns)
{
    struct timespec ts;
    int ready;

    if (c == NULL)
        return FER_EINVAL;
    ts = fer_deadline_after(timeout_ns);
    pthread_mutex_lock(&c->bell.mu);
    /* Checked under the doorbell mutex: a producer commits, then takes this mutex to ring, so a
     * commit after this check always finds us waiting. */
    while (!(ready = any_output(c)) &&
           !atomic_load_explicit(&c->bell.closed, memory_order_relaxed)) {
        if (pthread_cond_timedwait(&c->bell.cv, &c->bell.mu, &ts) == ETIMEDOUT) {
            ready = any_output(c);
            break;
        }
    }
    pthread_mutex_unlock(&c->bell.mu);
    return ready;
}

int fer_core_pop_outcomes(struct fer_core *c, struct fer_outcome *out, float *actions,
                          uint32_t max_n)
{
    uint32_t n = 0, k, got, al;

    if (c == NULL || (out == NULL && max_n > 0))
        return FER_EINVAL;
    al = c->cfg.action_len; /* fixed at create: safe to read without the mutex */
    /* Round robin, one record per ring per pass, so a busy ring cannot starve the others. */
    do {
        got = 0;
        for (k = 0; k < c->nrings && n < max_n; k++) {
            struct fer_ring *r = c->rings[c->pop_cursor];
            c->pop_cursor = (c->pop_cursor + 1) % c->nrings;
            if (fer_ring_pop(r, &out[n], actions ? &actions[(size_t)n * al] : NULL)) {
                n++;
                got = 1;
            }
        }
    } while (got && n < max_n);
    return (int)n;
}

/* ---- any thread ---------------------------------------------------------------------------------- */

int fer_core_set_calibration(struct fer_core *c, uint64_t nfe_ns, uint64_t admission_reserve_ns)
{
    if (c == NULL)
        return FER_EINVAL;
    pthread_mutex_lock(&c->mu);
    c->cfg.nfe_ns = nfe_ns;
    c->cfg.admission_reserve_ns = admission_reserve_ns;
    pthread_mutex_unlock(&c->mu);
    return FER_OK;
}

int fer_core_set_policy(struct fer_core *c, uint32_t reject_if_retry_count_gte, uint32_t age_gate,
                        uint64_t reject_if_queue_age_ns_gte, uint64_t queue_timeout_ns)
{
    if (c == NULL || age_gate > FER_AGE_GATE_ALL)
        return FER_EINVAL;
    pthread_mutex_lock(&c->mu);
    c->cfg.reject_if_retry_count_gte = reject_if_retry_count_gte;
    c->cfg.age_gate = age_gate;
    c->cfg.reject_if_queue_age_ns_gte = reject_if_queue_age_ns_gte;
    c->cfg.queue_timeout_ns = queue_timeout_ns;
    pthread_mutex_unlock(&c->mu);
    return FER_OK;
}

int fer_core_stats(struct fer_core *c, struct fer_stats *out)
{
    uint32_t i;

    if (c == NULL || out == NULL)
        return FER_EINVAL;
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    out->queue_depth = c->qlen;
    out->sessions = c->cfg.max_sessions - c->nsession_free;
    out->lanes_alive = c->lanes_alive;
    out->lanes_busy = 0;
    for (i = 0; i < c->cfg.workers; i++)
        out->lanes_busy += c->lanes[i].slot != FER_NONE;
    out->oldest_queued_arrival_ns = 0;
    for (i = 0; i < c->qlen; i++) {
        uint64_t a = c->slots[c->queue[i]].arrival_ns;
        if (i == 0 || a < out->oldest_queued_arrival_ns)
            out->oldest_queued_arrival_ns = a;
    }
    pthread_mutex_unlock(&c->mu);
    return FER_OK;
}

int fer_core_queue_snapshot(struct fer_core *c, struct fer_queued_item *out, uint32_t max_n)
{
    uint32_t i;

    if (c == NULL || (out == NULL && max_n > 0))
        return FER_EINVAL;
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->qlen && i < max_n; i++) {
        const struct fer_slot *s = &c->slots[c->queue[i]];
        struct fer_queued_item *q = &out[i];
        memcpy(q->session_id, s->session_id, s->session_id_len);
        q->session_id_len = s->session_id_len;
        q->slot = c->queue[i];
        q->remaining_nfe = s->remaining_nfe;
        q->tested = s->tested;
        q->sequence = s->sequence;
        q->generation = s->generation;
        q->deadline_ns = s->deadline_ns;
        q->arrival_ns = s->arrival_ns;
        q->arrival_seq = s->arrival_seq;
    }
    pthread_mutex_unlock(&c->mu);
    return (int)i;
}

int fer_core_lanes_snapshot(struct fer_core *c, struct fer_lane_state *out, uint32_t max_n)
{
    uint32_t i;

    if (c == NULL || (out == NULL && max_n > 0))
        return FER_EINVAL;
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->cfg.workers && i < max_n; i++) {
        const struct fer_lane *l = &c->lanes[i];
        struct fer_lane_state *o = &out[i];
        memset(o, 0, sizeof(*o));
        o->lane = i;
        o->alive = l->alive;
        o->busy = l->slot != FER_NONE;
        if (o->busy) {
            const struct fer_slot *s = &c->slots[l->slot];
            memcpy(o->session_id, s->session_id, s->session_id_len);
            o->session_id_len = s->session_id_len;
            o->slot = l->slot;
            o->remaining_nfe = s->remaining_nfe;
            o->nfe_done = s->nfe_done;
            o->cancelled = s->cancelled;
            o->sequence = s->sequence;
            o->generation = s->generation;
            o->deadline_ns = s->deadline_ns;
            o->dispatch_ns = s->dispatch_ns;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return (int)i;
}

int fer_core_session_generation(struct fer_core *c, const char *id, uint32_t len, uint64_t *gen)
{
    uint32_t si;

    if (c == NULL || gen == NULL || len > FER_SESSION_ID_MAX || (id == NULL && len > 0))
        return FER_EINVAL;
    pthread_mutex_lock(&c->mu);
    si = session_find(c, id, len, fnv1a(id, len));
    if (si != FER_NONE)
        *gen = c->sessions[si].generation;
    pthread_mutex_unlock(&c->mu);
    return si != FER_NONE;
}

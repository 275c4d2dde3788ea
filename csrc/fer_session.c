/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_session.c - the session table (fixed array + open-addressing index, docs/design.md §7's bound
 * on tracked sessions) and the request slots each session owns, including the staging slot the
 * request thread writes a request's payload into before submit.
 *
 * A session exists only while it is worth remembering: it is created on acceptance and evicted,
 * least recently accepted first, only when the table is full and it has no queued or running work.
 * Every call here runs with core->mu held and does bounded work; nothing allocates.
 */
#include <string.h>

#include "fer_internal.h"

/* FNV-1a: short ids, no adversary gains from collisions beyond a longer probe (bounded by the
 * table size). */
uint64_t fer_session_hash(const char *p, uint32_t n)
{
    uint64_t h = 1469598103934665603ull;
    uint32_t i;

    for (i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

uint32_t fer_session_find(struct fer_core *c, const char *id, uint32_t len, uint64_t h)
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

void fer_index_insert(uint32_t *tab, uint64_t mask, uint64_t h, uint32_t e)
{
    uint64_t i = h & mask;

    while (tab[i] != 0)
        i = (i + 1) & mask;
    tab[i] = e + 1;
}

/* Linear-probing delete by backward shift (no tombstones, so probes stay short forever). */
void fer_index_remove(uint32_t *tab, uint64_t mask, uint64_t h, uint32_t e,
                      uint64_t (*hash_of)(const struct fer_core *, uint32_t),
                      const struct fer_core *c)
{
    uint64_t i = h & mask, j, home;

    while (tab[i] != e + 1)
        i = (i + 1) & mask;
    j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (tab[j] == 0)
            break;
        home = hash_of(c, tab[j] - 1) & mask;
        /* Move entry j into the hole at i unless its home lies cyclically in (i, j]. */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            tab[i] = tab[j];
            i = j;
        }
    }
    tab[i] = 0;
}

static uint64_t session_hash_of(const struct fer_core *c, uint32_t si)
{
    return c->sessions[si].hash;
}

static void session_index_insert(struct fer_core *c, uint32_t si)
{
    fer_index_insert(c->session_hash, c->session_hash_mask, c->sessions[si].hash, si);
}

static void session_index_remove(struct fer_core *c, uint32_t si)
{
    fer_index_remove(c->session_hash, c->session_hash_mask, c->sessions[si].hash, si,
                     session_hash_of, c);
}

uint32_t fer_session_evictable(struct fer_core *c)
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
void fer_session_evict(struct fer_core *c, uint32_t si, uint64_t now)
{
    struct fer_session *s = &c->sessions[si];

    c->st.sessions_evicted++;
    if (fer_sat_sub(now, s->last_seen_ns) < c->cfg.session_idle_ns)
        c->st.sessions_evicted_early++;
    session_index_remove(c, si);
    s->in_use = 0;
    c->session_free[c->nsession_free++] = si;
}

uint32_t fer_session_create(struct fer_core *c, const struct fer_request *r, uint64_t h)
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

/* ---- slots: each non-FREE slot is on its session's list ----------------------------------------- */

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

uint32_t fer_slot_take(struct fer_core *c, const struct fer_request *r, uint32_t si, uint64_t now,
                       int tested)
{
    uint32_t id = c->staging;
    struct fer_slot *s = &c->slots[id];
    const char *cid;

    /* The payload the request thread wrote into the staging slot travels with it; the next
     * request gets another free slot (the free stack is never empty here, see struct fer_slot). */
    c->staging = c->free_slots[--c->nfree];

    memcpy(s->session_id, r->session_id, r->session_id_len);
    s->session_id_len = r->session_id_len;
    s->retry_count = r->retry_count;
    s->retry_reason = r->retry_reason;
    s->remaining_nfe = r->remaining_nfe;
    s->nfe_done = 0;
    s->lane = FER_NONE;
    s->tested = (uint8_t)tested;
    s->cancelled = 0;
    s->prefix_pending = (uint8_t)c->cfg.two_phase;
    s->sequence = r->sequence;
    s->generation = r->generation;
    s->deadline_ns = r->deadline_ns;
    s->deadline_ros_ns = r->deadline_ros_ns;
    s->noise_seed = r->noise_seed;
    s->arrival_ns = now;
    s->arrival_seq = ++c->arrival_seq;
    s->dispatch_ns = 0;
    s->prefix_rows = r->prefix_rows;
    s->prefix_start_ns = r->prefix_start_ns;
    s->prefix_start_ros_ns = r->prefix_start_ros_ns;
    s->action_period_ns = r->action_period_ns;
    s->frozen_rows = 0;
    fer_client_key(r, &cid, &s->client_id_len); /* §7.1: whom it is charged to, echoed */
    memcpy(s->client_id, cid, s->client_id_len);
    s->client = FER_NONE; /* fer_client_accept attaches it, with fair_share on */
    s->reject_reason = FER_REJECT_NONE;
    if (c->cfg.obs_dim)
        memcpy(s->obs, r->observation, (size_t)c->cfg.obs_dim * sizeof(float));
    session_link(c, si, id);
    return id;
}

/* ---- the staging slot and payloads (public API, fer.h) ------------------------------------ */

int fer_core_staging_slot(struct fer_core *c)
{
    uint32_t id;

    FER_CHECK_ARGS(c != NULL);
    pthread_mutex_lock(&c->mu);
    id = c->staging;
    pthread_mutex_unlock(&c->mu);
    return (int)id;
}

void *fer_core_payload(struct fer_core *c, uint32_t slot)
{
    /* payload, payload_stride and nslots are fixed at create: no mutex needed. */
    if (c == NULL || c->payload == NULL || slot >= c->nslots)
        return NULL;
    return c->payload + (size_t)slot * c->payload_stride;
}

void fer_slot_free(struct fer_core *c, uint32_t id)
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
    fer_client_detach(c, s);
    s->client = FER_NONE;
    s->state = FER_SLOT_FREE;
    s->cancelled = 0;
    c->free_slots[c->nfree++] = id;
}

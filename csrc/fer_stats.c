/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_stats.c - read-only views of the core for diagnostics and tests: counters and gauges,
 * snapshots of the queue (EDF order) and of the lanes, a session's generation watermark, and the
 * cost model's state (fer_cost.h).
 *
 * Each call copies under core->mu (O(queue + lanes) at most) and changes nothing (cost_stats
 * only ages out what the window no longer holds, as the next sample would).
 */
#include <string.h>

#include "fer_internal.h"

int fer_core_stats(struct fer_core *c, struct fer_stats *out)
{
    uint32_t i;

    FER_CHECK_ARGS(c != NULL && out != NULL);
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    out->queue_depth = c->qlen;
    out->sessions = c->cfg.max_sessions - c->nsession_free;
    out->clients = c->nclients;
    out->lanes_alive = c->lanes_alive;
    out->lanes_busy = 0;
    for (i = 0; i < c->nlanes; i++)
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

    FER_CHECK_ARGS(c != NULL && (out != NULL || max_n == 0));
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->qlen && i < max_n; i++) {
        const struct fer_slot *s = &c->slots[c->queue[i]];
        struct fer_queued_item *q = &out[i];
        FER_SLOT_VIEW(q, c, c->queue[i]);
        q->tested = s->tested;
        q->arrival_ns = s->arrival_ns;
        q->arrival_seq = s->arrival_seq;
    }
    pthread_mutex_unlock(&c->mu);
    return (int)i;
}

/* Lane i as a snapshot record: identity and liveness always, the work's fields when busy. */
static void lane_state(const struct fer_core *c, uint32_t i, struct fer_lane_state *o)
{
    const struct fer_lane *l = &c->lanes[i];
    const struct fer_slot *s;

    memset(o, 0, sizeof(*o));
    o->lane = i;
    o->alive = l->alive;
    o->busy = l->slot != FER_NONE;
    if (!o->busy)
        return;
    s = &c->slots[l->slot];
    FER_SLOT_VIEW(o, c, l->slot);
    o->nfe_done = s->nfe_done;
    o->cancelled = s->cancelled;
    o->prefix_pending = s->prefix_pending;
    o->dispatch_ns = s->dispatch_ns;
}

int fer_core_lanes_snapshot(struct fer_core *c, struct fer_lane_state *out, uint32_t max_n)
{
    uint32_t i;

    FER_CHECK_ARGS(c != NULL && (out != NULL || max_n == 0));
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->nlanes && i < max_n; i++)
        lane_state(c, i, &out[i]);
    pthread_mutex_unlock(&c->mu);
    return (int)i;
}

int fer_core_session_generation(struct fer_core *c, const char *id, uint32_t len, uint64_t *gen)
{
    uint32_t si;

    FER_CHECK_ARGS(c != NULL && gen != NULL && len <= FER_SESSION_ID_MAX &&
                   (id != NULL || len == 0));
    pthread_mutex_lock(&c->mu);
    si = fer_session_find(c, id, len, fer_session_hash(id, len));
    if (si != FER_NONE)
        *gen = c->sessions[si].generation;
    pthread_mutex_unlock(&c->mu);
    return si != FER_NONE;
}

int fer_core_cost_stats(struct fer_core *c, uint64_t now, struct fer_cost_stats *out)
{
    const struct fer_cost *k, *p;

    FER_CHECK_ARGS(c != NULL && out != NULL);
    k = &c->cost;
    p = &c->prefix_cost;
    pthread_mutex_lock(&c->mu);
    fer_cost_age(&c->cost, now);
    fer_cost_age(&c->prefix_cost, now);
    out->cost_model = k->model;
    out->quantile_ppm = k->quantile_ppm;
    out->window_ns = k->window_ns;
    out->configured_ns = c->cfg.nfe_ns;
    out->observed_tail_ns = k->tail;
    out->quantile_tail_ns = k->qtail;
    out->block_mean_ns = k->block_mean;
    out->window_max_ns = k->window_max;
    out->window_samples = k->total;
    out->in_use_ns = c->cfg.nfe_ns ? fer_nfe_in_use(c, now) : 0;
    out->samples_total = k->samples;
    out->prefix_configured_ns = c->cfg.prefix_ns;
    out->prefix_observed_tail_ns = p->tail;
    out->prefix_in_use_ns = c->cfg.nfe_ns ? fer_prefix_in_use(c, now) : 0;
    out->prefix_samples_total = p->samples;
    pthread_mutex_unlock(&c->mu);
    return FER_OK;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_output.c - the output path of docs/design.md §8: every outcome goes from the thread that
 * decides it into that thread's own SPSC ring (ring 0 = submit, ring w+1 = worker w's lanes), and
 * from the rings to the one publisher thread.
 *
 * Producers push under core->mu without ringing; each public call rings the doorbell once, after
 * releasing the mutex (fer_unlock_and_ring), so the publisher never waits on admission. The
 * publisher's calls never take core->mu. A full ring drops the record and counts it (bounded, no
 * side queue). Nothing here allocates.
 */
#include <string.h>

#include "fer_internal.h"

/* ---- producing (core->mu held) ----------------------------------------------------------------- */

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
int fer_emit_request(struct fer_core *c, const struct fer_request *r, uint32_t code, uint32_t why,
                     uint64_t now)
{
    struct fer_outcome o;
    const char *cid;

    memset(&o, 0, sizeof(o));
    memcpy(o.session_id, r->session_id, r->session_id_len);
    o.session_id_len = r->session_id_len;
    fer_client_key(r, &cid, &o.client_id_len);
    memcpy(o.client_id, cid, o.client_id_len);
    o.reject_reason = code == FER_REJECTED_CAPACITY ? why : FER_REJECT_NONE;
    o.code = code;
    o.lane = -1;
    o.retry_count = r->retry_count;
    o.retry_reason = r->retry_reason;
    o.remaining_nfe = r->remaining_nfe;
    o.sequence = r->sequence;
    o.generation = r->generation;
    o.deadline_ros_ns = r->deadline_ros_ns;
    o.chunk_start_ros_ns = r->prefix_rows ? r->prefix_start_ros_ns : 0;
    o.arrival_ns = now;
    o.finish_ns = now;
    return emit(c, 0, &o, NULL);
}

/* EXPIRED, REJECTED_STALE and INFERENCE_FAILED ends add the NFE already spent to nfe_wasted; an EXPIRED end of work
 * that passed the admission test is a calibration miss. */
int fer_emit_slot(struct fer_core *c, uint32_t id, uint32_t code, uint64_t now, int32_t lane,
                  const float *act)
{
    struct fer_slot *s = &c->slots[id];
    struct fer_outcome o;
    int ran = s->state == FER_SLOT_RUNNING;
    uint32_t ring = fer_lane_ring(c, lane);
    int rang;

    memset(&o, 0, sizeof(o));
    memcpy(o.session_id, s->session_id, s->session_id_len);
    o.session_id_len = s->session_id_len;
    memcpy(o.client_id, s->client_id, s->client_id_len);
    o.client_id_len = s->client_id_len;
    o.reject_reason = code != FER_REJECTED_CAPACITY ? FER_REJECT_NONE
                      : s->reject_reason ? s->reject_reason : FER_REJECT_CAPACITY;
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
    o.chunk_start_ros_ns = s->prefix_rows ? s->prefix_start_ros_ns : 0;
    o.frozen_rows = code == FER_INFERENCE ? s->frozen_rows : 0;
    o.arrival_ns = s->arrival_ns;
    o.finish_ns = now;
    o.queue_ns = fer_sat_sub(ran ? s->dispatch_ns : now, s->arrival_ns);
    o.compute_ns = ran ? fer_sat_sub(now, s->dispatch_ns) : 0;
    if (code == FER_EXPIRED || code == FER_REJECTED_STALE || code == FER_INFERENCE_FAILED)
        c->st.nfe_wasted += s->nfe_done;
    if (code == FER_EXPIRED && s->tested)
        c->st.calibration_misses++;
    rang = emit(c, ring, &o, act);
    if (ran)
        c->lanes[s->lane].slot = FER_NONE;
    fer_slot_free(c, id);
    return rang;
}

void fer_unlock_and_ring(struct fer_core *c, int rang)
{
    pthread_mutex_unlock(&c->mu);
    if (rang)
        fer_doorbell_ring(&c->bell);
}

/* ---- consuming (the publisher thread; never takes core->mu) ------------------------------------ */

static int any_output(void *core)
{
    struct fer_core *c = core;
    uint32_t i;

    for (i = 0; i < c->nrings; i++)
        if (fer_ring_nonempty(c->rings[i]))
            return 1;
    return 0;
}

int fer_core_wait_outputs(struct fer_core *c, uint64_t timeout_ns)
{
    FER_CHECK_ARGS(c != NULL);
    return fer_doorbell_wait(&c->bell, any_output, c, timeout_ns);
}

int fer_core_pop_outcomes(struct fer_core *c, struct fer_outcome *out, float *actions,
                          uint32_t max_n)
{
    uint32_t n = 0, k, got, al;

    FER_CHECK_ARGS(c != NULL && (out != NULL || max_n == 0));
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

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_queue.c - the bounded EDF queue: queue[0..qlen) holds QUEUED slot ids sorted by
 * (deadline, none last; then arrival_seq), head first, and qjobs[] mirrors each entry's deadline,
 * remaining NFE and pending prefix for the admission simulation (see struct fer_core).
 *
 * arrival_seq is unique, so the order is total and every entry is found by binary search. Insert
 * and remove shift the tail with memmove: O(queue) bytes, no allocation, called with core->mu held.
 */
#include <string.h>

#include "fer_internal.h"

/* EDF order: finite deadlines before none, earlier deadline first, ties by arrival (submit order). */
static int edf_before(uint64_t da, uint64_t sa, uint64_t db, uint64_t sb)
{
    if ((da == 0) != (db == 0))
        return db == 0;
    if (da != db)
        return da < db;
    return sa < sb;
}

/* x arrives last, so it goes after every entry it does not precede. */
uint32_t fer_queue_position(const struct fer_core *c, uint64_t deadline, uint64_t seq)
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

/* An entry does not precede itself, so the position of its own key is just after it (keys are
 * unique: arrival_seq breaks every tie). */
uint32_t fer_queue_find(const struct fer_core *c, uint32_t id)
{
    const struct fer_slot *s = &c->slots[id];

    return fer_queue_position(c, s->deadline_ns, s->arrival_seq) - 1;
}

void fer_queue_insert(struct fer_core *c, uint32_t id)
{
    struct fer_slot *s = &c->slots[id];
    uint32_t pos = fer_queue_position(c, s->deadline_ns, s->arrival_seq);
    size_t tail = (size_t)(c->qlen - pos);

    memmove(&c->queue[pos + 1], &c->queue[pos], tail * sizeof(*c->queue));
    memmove(&c->qjobs[pos + 1], &c->qjobs[pos], tail * sizeof(*c->qjobs));
    c->queue[pos] = id;
    c->qjobs[pos].deadline_ns = s->deadline_ns;
    c->qjobs[pos].remaining_nfe = s->remaining_nfe;
    c->qjobs[pos].prefix_pending = s->prefix_pending;
    c->qjobs[pos]._pad = 0;
    c->qlen++;
    atomic_store_explicit(&c->qlen_hint, c->qlen, memory_order_relaxed);
    s->state = FER_SLOT_QUEUED;
}

void fer_queue_remove(struct fer_core *c, uint32_t pos, uint32_t n)
{
    size_t tail = (size_t)(c->qlen - pos - n);

    memmove(&c->queue[pos], &c->queue[pos + n], tail * sizeof(*c->queue));
    memmove(&c->qjobs[pos], &c->qjobs[pos + n], tail * sizeof(*c->qjobs));
    c->qlen -= n;
    atomic_store_explicit(&c->qlen_hint, c->qlen, memory_order_relaxed);
}

void fer_queue_unlink(struct fer_core *c, uint32_t id)
{
    fer_queue_remove(c, fer_queue_find(c, id), 1);
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_admit.c - the calibrated admission test of docs/design.md §5: a pure predicate, and the one
 * function that builds its input from the core's state (build_admission_state).
 *
 * Like the kernel's SCHED_DEADLINE admission control the predicate only answers "does it fit?"
 * on a description of the state; the description (which lanes are cancelled, which queued work
 * is pruned or displaced, where x sits in EDF order) is built below it, in the core's scratch.
 *
 * The simulated dispatcher is the real one: non-preemptive EDF over W x B lanes (W workers, B batch
 * slots each, docs/design.md §5.1: every slot advances one NFE per nfe_ns, the cost of a B-row
 * step), each queued request (in EDF order) taken by the lane that frees first. Work per call: O(njobs * nlanes), no
 * allocation. A linear scan for the earliest lane beats a heap at the W x B this usually runs with.
 */
#include <string.h>

#include "fer_internal.h"

uint32_t fer_admit_first_miss(const uint64_t *lane_start, uint32_t nlanes,
                              const struct fer_admit_job *jobs, uint32_t njobs, uint32_t check_from,
                              uint64_t nfe_ns, uint64_t prefix_ns, uint64_t reserve_ns,
                              uint64_t *scratch)
{
    uint32_t i, l, best;
    uint64_t start, finish;

    if (nlanes == 0) {
        /* Nothing will ever run: every finite deadline from check_from on is missed. */
        for (i = check_from; i < njobs; i++)
            if (jobs[i].deadline_ns != 0)
                return i;
        return njobs;
    }
    memcpy(scratch, lane_start, (size_t)nlanes * sizeof(*scratch));
    for (i = 0; i < njobs; i++) {
        /* No-deadline jobs sort last in EDF order and are never tested: nothing after the first
         * one can miss, so the simulation can stop here. */
        if (jobs[i].deadline_ns == 0)
            break;
        best = 0;
        for (l = 1; l < nlanes; l++)
            if (scratch[l] < scratch[best])
                best = l;
        start = scratch[best];
        finish = fer_work_finish(start, jobs[i].prefix_pending, prefix_ns, jobs[i].remaining_nfe,
                                 nfe_ns);
        scratch[best] = finish;
        /* Jobs ahead of check_from are placed (they delay later ones) but not judged: the caller
         * guarantees that accepting x cannot make them later than they already were. */
        if (i >= check_from && !fer_meets(fer_sat_add(finish, reserve_ns), jobs[i].deadline_ns))
            return i;
    }
    return njobs;
}

/* ---- the simulated state of a submit (core->mu held) ---------------------------------------------
 * Built in the core's admission scratch (lane_start, jobs, skip), never allocated. */

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

/* Flag queued slot id as left out of the simulated queue (c->skip), and remember its position
 * while there are few. */
static void skip_mark(struct fer_core *c, uint32_t id, uint32_t *skip_pos, uint32_t *nskip)
{
    if (*nskip < FER_SKIP_FAST)
        skip_pos[*nskip] = fer_queue_find(c, id);
    c->skip[id] = 1;
    (*nskip)++;
}

/* c->jobs = the queue as it would be if x were accepted: minus the work x cancels (queued older
 * generations of session si) and the victims, plus x at its EDF position xq. Returns the number
 * of jobs; *xpos is x's index among them. Leaves c->skip all-zero. */
static uint32_t queue_jobs(struct fer_core *c, const struct fer_request *r, uint32_t si,
                           const uint32_t *victims, uint32_t nvictims, uint32_t xq,
                           uint32_t *xpos)
{
    uint32_t skip_pos[FER_SKIP_FAST];
    uint32_t nj = 0, nskip = 0, i, k, id, from;
    struct fer_admit_job x;

    x.deadline_ns = r->deadline_ns;
    x.remaining_nfe = r->remaining_nfe;
    x.prefix_pending = c->cfg.two_phase;
    x._pad = 0;
    *xpos = FER_NONE;
    if (si != FER_NONE)
        for (id = c->sessions[si].head; id != FER_NONE; id = c->slots[id].snext)
            if (c->slots[id].state == FER_SLOT_QUEUED &&
                fer_cancels(&c->slots[id], si, r->generation))
                skip_mark(c, id, skip_pos, &nskip);
    for (i = 0; i < nvictims; i++)
        skip_mark(c, victims[i], skip_pos, &nskip);
    if (nskip <= FER_SKIP_FAST) {
        /* Sort the few skipped positions, then copy the segments between them. */
        for (i = 1; i < nskip; i++)
            for (k = i; k > 0 && skip_pos[k - 1] > skip_pos[k]; k--) {
                uint32_t t = skip_pos[k];
                skip_pos[k] = skip_pos[k - 1];
                skip_pos[k - 1] = t;
            }
        for (from = 0, k = 0; k < nskip; from = skip_pos[k++] + 1)
            jobs_append(c, from, skip_pos[k], xq, &x, &nj, xpos);
        jobs_append(c, from, c->qlen, xq, &x, &nj, xpos);
    } else {
        for (i = 0; i <= c->qlen; i++) {
            if (i == xq) {
                *xpos = nj;
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
    for (i = 0; i < nvictims; i++)
        c->skip[victims[i]] = 0;
    return nj;
}

/* What the predicate is asked about: nlanes start times in c->lane_start, njobs jobs in c->jobs,
 * x at index xpos. */
struct admission_state {
    uint32_t nlanes;
    uint32_t njobs;
    uint32_t xpos;
    uint32_t xq;      /* x's position in the queue: before queue entry xq */
};

/* §5: the state that would exist if x (request r of session si, displacing victim or FER_NONE)
 * were accepted at now. Lane start times: idle lane = now (now + one NFE for a free batch slot
 * of a worker stepping other rows, §5.1); a lane whose work is cancelled
 * (already, or by x) = now + the unit in flight (one NFE, or the prefix pass while it is
 * pending: prefix_done then stops it); any other running lane = now + its remaining cost
 * (a pending prefix, then its remaining NFE). O(lanes + queue), mostly contiguous copies. */
/* c->lane_start for the alive lanes (how many): what each frees at, as build_admission_state
 * says, with the work r (of session si) would cancel counted as cancelled (r NULL: none), and
 * no lane free before c->reserved_until (reserve_lanes_until). */
static uint32_t lane_starts(struct fer_core *c, const struct fer_request *r, uint32_t si,
                            uint64_t now, uint64_t nfe, uint64_t prefix)
{
    uint32_t i, n = 0;

    for (i = 0; i < c->nlanes; i++) {
        const struct fer_lane *l = &c->lanes[i];
        const struct fer_slot *s;
        if (!l->alive)
            continue;
        if (l->slot == FER_NONE) {
            /* §5.1: a free batch slot of a worker that is stepping other rows joins at that
             * worker's next step boundary, at most one step (nfe) away; a worker holding
             * nothing waits for work and takes it now. With B = 1 every idle lane is now. */
            c->lane_start[n] = fer_worker_stepping(c, i / c->cfg.batch_slots)
                                   ? fer_sat_add(now, nfe) : now;
        } else {
            s = &c->slots[l->slot];
            if (s->cancelled || (r != NULL && fer_cancels(s, si, r->generation)))
                c->lane_start[n] = fer_sat_add(now, s->prefix_pending ? prefix : nfe);
            else
                c->lane_start[n] = fer_work_finish(now, s->prefix_pending, prefix,
                                                   s->remaining_nfe, nfe);
        }
        if (c->lane_start[n] < c->reserved_until)
            c->lane_start[n] = c->reserved_until;
        n++;
    }
    return n;
}

static void build_admission_state(struct fer_core *c, const struct fer_request *r, uint32_t si,
                                  const uint32_t *victims, uint32_t nvictims, uint64_t now,
                                  uint64_t nfe, uint64_t prefix, struct admission_state *st)
{
    st->nlanes = lane_starts(c, r, si, now, nfe, prefix);
    /* x arrives last: it goes after every entry it does not precede. */
    st->xq = fer_queue_position(c, r->deadline_ns, c->arrival_seq + 1);
    st->njobs = queue_jobs(c, r, si, victims, nvictims, st->xq, &st->xpos);
}

int fer_admission_test(struct fer_core *c, const struct fer_request *r, uint32_t si,
                       const uint32_t *victims, uint32_t nvictims, uint64_t now, uint32_t *miss,
                       uint32_t *xq)
{
    struct admission_state st;
    uint32_t first;
    /* cost-model hook (§5.2): static = nfe_ns / prefix_ns, adaptive = max(configured, observed
     * tail), each O(1). One value of each for the lane starts and the simulation alike. */
    uint64_t nfe = fer_nfe_in_use(c, now);
    uint64_t prefix = fer_prefix_in_use(c, now);

    if (c->lanes_alive == 0)
        return 0;
    build_admission_state(c, r, si, victims, nvictims, now, nfe, prefix, &st);
    /* Jobs ahead of x are not re-judged: x's acceptance only removes work (cancelled, displaced)
     * or shortens it (cancelled lanes), and EDF list placement is monotone in that, so they
     * finish no later than they already would. */
    first = fer_admit_first_miss(c->lane_start, st.nlanes, c->jobs, st.njobs, st.xpos, nfe,
                                 prefix, fer_finish_reserve(c), c->lane_scratch);
    if (miss != NULL)
        *miss = first;
    if (xq != NULL)
        *xq = st.xq;
    return first == st.njobs;
}

int fer_core_reserve_lanes_until(struct fer_core *c, uint64_t until_ns)
{
    FER_CHECK_ARGS(c != NULL);
    pthread_mutex_lock(&c->mu);
    c->reserved_until = until_ns;
    pthread_mutex_unlock(&c->mu);
    return FER_OK;
}

/* The ns per unit (NFE, prefix pass) a drain bound assumes: what admission uses, or what the
 * workers measured over the cost window if more (with admission off, nfe_ns = 0, that alone). */
static uint64_t drain_unit(const struct fer_cost *k, uint64_t in_use)
{
    return k->tail > in_use ? k->tail : in_use;
}

uint64_t fer_core_drain_bound(struct fer_core *c, uint64_t now)
{
    uint64_t nfe, prefix, end = now, finish, latest = 0;
    uint32_t nlanes, i, l, best, held = 0, open = 0;

    if (c == NULL)
        return 0;
    pthread_mutex_lock(&c->mu);
    fer_cost_age(&c->cost, now);
    fer_cost_age(&c->prefix_cost, now);
    nfe = drain_unit(&c->cost, fer_nfe_in_use(c, now));
    prefix = c->cfg.two_phase ? drain_unit(&c->prefix_cost, fer_prefix_in_use(c, now)) : 0;
    /* running work: its own remaining cost (cancelled work: the unit in flight) */
    for (i = 0; i < c->nlanes; i++) {
        const struct fer_lane *ln = &c->lanes[i];
        const struct fer_slot *s;

        if (!ln->alive || ln->slot == FER_NONE)
            continue;
        s = &c->slots[ln->slot];
        held++;
        open |= s->deadline_ns == 0 && !s->cancelled;
        if (s->deadline_ns > latest)
            latest = s->deadline_ns;
        finish = s->cancelled ? fer_sat_add(now, s->prefix_pending ? prefix : nfe)
                              : fer_work_finish(now, s->prefix_pending, prefix, s->remaining_nfe,
                                                nfe);
        if (finish > end)
            end = finish;
    }
    /* queued work, in EDF order, on the lane that frees first (no deadline test) */
    nlanes = lane_starts(c, NULL, FER_NONE, now, nfe, prefix);
    for (i = 0; i < c->qlen; i++) {
        held++;
        open |= c->qjobs[i].deadline_ns == 0;
        if (c->qjobs[i].deadline_ns > latest)
            latest = c->qjobs[i].deadline_ns;
        if (nlanes == 0) {
            end = FER_SAT; /* nothing alive will ever run it */
            continue;
        }
        for (best = 0, l = 1; l < nlanes; l++)
            if (c->lane_start[l] < c->lane_start[best])
                best = l;
        finish = fer_work_finish(c->lane_start[best], c->qjobs[i].prefix_pending, prefix,
                                 c->qjobs[i].remaining_nfe, nfe);
        c->lane_start[best] = finish;
        if (finish > end)
            end = finish;
    }
    pthread_mutex_unlock(&c->mu);
    if (held == 0)
        return now;
    /* Work with a deadline ends by it: it expires at dispatch or stops at the first step
     * boundary after it (one unit late at most). Without a known unit cost only that bounds it;
     * work without a deadline then has no bound. */
    if (nfe == 0)
        return open ? FER_SAT : (latest > now ? latest : now);
    if (!open && fer_sat_add(latest, nfe) < end)
        return fer_sat_add(latest, nfe);
    return end;
}

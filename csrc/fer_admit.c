/*
 * fer_admit.c - the calibrated admission predicate of DESIGN §5 as one pure function.
 *
 * Like the kernel's SCHED_DEADLINE admission control it only answers "does it fit?" on a
 * description of the state; building that description (which lanes are cancelled, which queued
 * work is pruned or displaced, where x sits in EDF order) is fer_queue.c's job.
 *
 * The simulated dispatcher is the real one: non-preemptive EDF over W lanes, each queued request
 * (in EDF order) taken by the lane that frees first. Work per call: O(njobs * nlanes), no
 * allocation. A linear scan for the earliest lane beats a heap at the W this runs with (<= 64).
 */
#include <string.h>

#include "fer_internal.h"

uint32_t fer_admit_first_miss(const uint64_t *lane_start, uint32_t nlanes,
                              const struct fer_admit_job *jobs, uint32_t njobs, uint32_t check_from,
                              uint64_t nfe_ns, uint64_t reserve_ns, uint64_t *scratch)
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
        finish = fer_sat_finish(start, jobs[i].remaining_nfe, nfe_ns);
        scratch[best] = finish;
        /* Jobs ahead of check_from are placed (they delay later ones) but not judged: the caller
         * guarantees that accepting x cannot make them later than they already were. */
        if (i >= check_from && !fer_meets(fer_sat_add(finish, reserve_ns), jobs[i].deadline_ns))
            return i;
    }
    return njobs;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_cost.h - the cost model of docs/design.md §5.2: static or adaptive, and the observed tail.
 *
 * Private to the core (not part of the cdef). The estimator is a windowed tail of measured
 * durations (the core has two instances: NFEs from fer_core_step, prefix passes from
 * fer_core_prefix_done): a log-linear histogram (FER_COST_PER_OCTAVE
 * buckets per power of two, about 4% wide) per sub-window, FER_COST_SUBWINDOWS sub-windows of
 * window_ns / FER_COST_SUBWINDOWS rotating on the caller's `now`, plus their running sum. The
 * tail is the quantile_ppm quantile of the samples in the window, reported as the upper edge of
 * its bucket but never above the exact window maximum. A sample older than the window no longer
 * counts; with no sample in the window there is no estimate.
 *
 * Why a second statistic, the block mean: a per-NFE quantile cannot see what costs a queued
 * request its deadline under a bursty neighbour. A 50 ms burst that slows a tenth of the NFEs,
 * or the time a worker spends between steps (publishing, dispatching, waiting for the GIL or a
 * core), moves no p90, yet the work queued behind it runs later than admission planned. So the
 * NFE estimator also takes, once per worker step, the step's busy span: the wall time since
 * that worker's previous step ended (or since it had work again, when it was idle), less a
 * pacing pause it reported (priced apart, docs/design.md §5.3), and keeps
 * the p99 of the mean spans over blocks of the worker's steps in the window. The tail is the
 * larger of the two: a slowdown that lasts as long as a short queue counts at once, a single
 * preemption counts a block's share, or nothing when the reserve already covers it (the stall
 * rule above struct fer_cost). A block is a worker's run of whole requests: it closes at the end
 * of a request once it holds FER_COST_BLOCK spans (or at FER_COST_BLOCK_MAX spans), so a request
 * of 32-128 NFE is priced at what its own steps cost per NFE, not at its worst 16 steps. A
 * request's turnover (the gap before its first step) is paid by that request's steps
 * (struct fer_turnover): 1/NFE per NFE, not 1/16.
 *
 * Every function here is called with core->mu held. Nothing allocates (the struct is embedded in
 * struct fer_core); record costs O(buckets) at most, the admission read O(1).
 */
#ifndef FER_COST_H
#define FER_COST_H

/* Self-contained: struct fer_config (fer.h) is only pointed to. fer_internal.h includes this
 * header for struct fer_cost; fer_cost.c includes fer.h, fer_sat.h and this, never
 * fer_internal.h (the include graph is drawn there). */
#include <stdint.h>

struct fer_config;

#define FER_COST_SUBWINDOWS 4
#define FER_COST_PER_OCTAVE_LOG2 4
#define FER_COST_PER_OCTAVE (1u << FER_COST_PER_OCTAVE_LOG2)
#define FER_COST_MIN_LOG2 10   /* samples below 2^10 ns (1 us) share bucket 0 */
#define FER_COST_OCTAVES 26    /* up to 2^36 ns (~69 s); longer samples share the last bucket */
#define FER_COST_BUCKETS (1u + FER_COST_OCTAVES * FER_COST_PER_OCTAVE)
#define FER_COST_DEFAULT_WINDOW_NS 1000000000ull
#define FER_COST_DEFAULT_QUANTILE_PPM 900000u
#define FER_COST_BLOCK 16      /* fewest spans of a block: it closes at a request's end from here */
#define FER_COST_BLOCK_MAX 128 /* most spans of a block: one request's worth of long RTC work */
#define FER_COST_PPM 1000000u  /* quantile_ppm's whole */
#define FER_COST_STALL_DIV 2   /* a stall: a span's excess of at least reserve / this */
#define FER_COST_BLOCK_PPM 990000u /* the block mean: this quantile of the window's blocks */

/* Invariants: agg[b] = sum over sub-windows s of sub[s][b]; total = sum of agg; epoch = the
 * sub-window index (now / sub_ns) of the newest sample, stored in sub[epoch % SUBWINDOWS];
 * bsub[s] = the histogram of the means of the blocks completed in sub-window s (sub_blocks[s]
 * of them), bsub_max[s][b] the largest mean in bucket b; bsub_ex / bsub_max_ex the same of the
 * blocks' stall-free means (below); bagg / bagg_ex their sums over the window (`blocks` each),
 * btop / btop_ex their highest non-empty buckets; sub_stalls[s] the stalls of the blocks
 * completed in s. The block each worker is filling is its own (struct fer_turnover's run),
 * forgotten when a whole window passes without a span of that worker or when `resets` moves on.
 * block_mean is the FER_COST_BLOCK_PPM quantile of the window's block means, read exactly: the
 * largest mean in the bucket the quantile falls in (a bucket's upper edge would price every NFE
 * up to 6% above it). A block is whole requests, so that is what the p99 request of the window
 * costs per NFE: the figure static's calibration of whole requests takes (docs/design.md §5.2,
 * §11), so adaptive prices a host as that calibration would; the blocks above it are what the
 * calibration leaves to the promise's slack and the reserve. Below 1 / (1 - quantile) blocks
 * the quantile is the largest. qtail (the quantile), block_mean, tail = max(qtail, block_mean)
 * and window_max
 * describe the window that ends with sub-window `epoch`, and hold until valid_until_ns =
 * (epoch + SUBWINDOWS) * sub_ns, when every sample in it has aged out. adm_tail = tail and
 * adm_qtail = qtail when the model is adaptive, both 0 when static: the admission read is
 * max(configured nfe_ns, adm_tail) and the dispatch read max(configured nfe_ns, adm_qtail),
 * while now < valid_until_ns.
 *
 * The stall rule (docs/design.md §5.2). Admission promises a request it ends by now + (the work
 * ahead of it and its own) x the cost in use + reserve_ns (cfg.admission_reserve_ns, the
 * pacing pause aside), and the cost in use is at least block_mean: the block mean prices what
 * the steps of the promise's horizon (now .. its deadline) cost, the reserve one excess on top.
 * A completed block's typical span is the mean of its other spans (n - 1 of its n), and its
 * largest span's excess over that is a stall when it is at least reserve_ns /
 * FER_COST_STALL_DIV (never with reserve_ns 0). The block's stall-free mean leaves min(excess,
 * reserve_ns) out of its sum (the typical span itself when the excess is within the reserve).
 * block_mean is taken over the stall-free means (bagg_ex) while the window holds at most one
 * stall and no promise horizon longer than the window is open (long_until_ns <= epoch x sub_ns,
 * the newest sub-window's start), else over the full ones (bagg). Soundness, under the premise
 * every adaptive estimate rests on (the next window's steps look like the last window's), in
 * the terms static admission's is (a calibrated p99 request per NFE, the reserve on top): a
 * promise's horizon is whole requests, 99 in 100 of them at most block_mean per NFE, each
 * leaving its shortfall as slack; a request past the p99 is the excess the reserve and that
 * slack pay, as for static. A promise with a horizon of at most the window meets at most one
 * stall, whose excess up to reserve_ns the reserve pays and whose remainder the block mean still
 * prices (below 100 blocks, where the quantile is the largest, in full); so the sum of its
 * steps' spans stays within work x block_mean + reserve_ns. Two stalls in the window (repeated,
 * or a slowdown made of long preemptions) or an open promise longer than the window
 * (long_until_ns, the latest deadline of those: fer_cost_promise) price every stall again, and a
 * slowdown in more than 1 in 100 of the window's blocks is the p99 block's, in full. Each worker
 * fills its own blocks: a stall that stops W workers is W stalls (charged, on the safe side,
 * when W > 1). A change of reserve_ns forgets the stall-free means (they copy the full ones);
 * a change of window suspends the rule until every promise made before it has ended
 * (long_until_ns takes promised_until_ns, the latest deadline ever promised). */
struct fer_cost {
    uint32_t model;            /* FER_COST_STATIC / FER_COST_ADAPTIVE */
    uint32_t quantile_ppm;     /* 1..1000000 */
    uint64_t window_ns;
    uint64_t sub_ns;
    uint64_t epoch;
    uint64_t valid_until_ns;
    uint64_t total;
    uint64_t qtail;
    uint64_t block_mean;
    uint64_t tail;
    uint64_t window_max;
    uint64_t adm_tail;
    uint64_t adm_qtail;
    uint64_t samples;          /* every sample ever recorded */
    uint32_t top;              /* highest non-empty bucket of agg (0 when empty) */
    uint32_t sub_count[FER_COST_SUBWINDOWS];
    uint64_t sub_max[FER_COST_SUBWINDOWS];
    uint32_t sub_stalls[FER_COST_SUBWINDOWS];
    uint32_t sub_blocks[FER_COST_SUBWINDOWS]; /* blocks completed in each sub-window */
    uint64_t blocks;           /* blocks completed in the window: sum of sub_blocks */
    uint32_t btop;             /* highest non-empty bucket of bagg (0 when empty) */
    uint32_t btop_ex;          /* the same of bagg_ex */
    uint32_t block_dirty;      /* the block histograms changed since block_mean was read */
    uint32_t block_ex;         /* whether block_mean was read of the stall-free means */
    uint64_t reserve_ns;       /* cfg.admission_reserve_ns: the most of a stall left out */
    uint64_t long_until_ns;    /* latest deadline of a promise whose horizon exceeds the window */
    uint64_t promised_until_ns; /* latest deadline of any promise */
    uint64_t resets;           /* times every sample was forgotten (a worker's run with them) */
    uint32_t sub[FER_COST_SUBWINDOWS][FER_COST_BUCKETS];
    uint32_t agg[FER_COST_BUCKETS];
    /* The block means' histograms: full (bsub, bagg) and stall-free (bsub_ex, bagg_ex), one
     * count per completed block, in the sub-window it completed in. */
    uint32_t bsub[FER_COST_SUBWINDOWS][FER_COST_BUCKETS];
    uint32_t bsub_ex[FER_COST_SUBWINDOWS][FER_COST_BUCKETS];
    uint32_t bagg[FER_COST_BUCKETS];
    uint32_t bagg_ex[FER_COST_BUCKETS];
    uint64_t bsub_max[FER_COST_SUBWINDOWS][FER_COST_BUCKETS];    /* each bucket's largest mean */
    uint64_t bsub_max_ex[FER_COST_SUBWINDOWS][FER_COST_BUCKETS];
};

/* A worker's turnover (docs/design.md §5.2): the time between a request's dispatch and its first
 * step beyond that step's compute (the previous answer handed off, the dispatch, the join) is a
 * cost of that request, not of the 16 steps around it. The first step after a dispatch puts its
 * gap into `debt_ns` (unless the gap is stall-sized: the stall rule takes it as a span) and sets
 * `per_step_ns` = ceil(debt / the joiner's NFE); every step then pays min(per_step_ns, debt_ns)
 * of it on top of its own span, so the request's own steps carry its turnover, the block mean
 * prices it at 1/NFE per NFE, and the sum of the spans charged is the sum of the spans measured
 * (a debt left by work that stopped early rolls into the next request's). `nfe` is the
 * smallest remaining NFE of the work dispatched to the worker since its last step, 0 when
 * none. `paused_ns` is the pacing pause (docs/design.md §5.3) the worker took on purpose since
 * its last step, as asked: the next span leaves it out first (at most its gap), since the cost
 * in use prices the pauses on its own (fer_with_cede); what the pause overran stays in the span.
 * The worker's block of the block mean is its run: run_sum / run_top / run_n (< the block's
 * close) the sum, largest and count of the spans charged since its last block closed, run_epoch
 * the sub-window of the newest and run_resets the estimator's `resets` then (fer_cost_record).
 * One per worker, in the core; touched under core->mu, never allocated on the path. */
struct fer_turnover {
    uint64_t debt_ns;
    uint64_t per_step_ns;
    uint64_t paused_ns;
    uint32_t nfe;
    uint32_t run_n;
    uint64_t run_sum;
    uint64_t run_top;
    uint64_t run_epoch;
    uint64_t run_resets;
};

/* Whether cfg's cost fields are valid (cost_model <= 1, cost_quantile_ppm <= 1000000). */
int fer_cost_config_valid(const struct fer_config *cfg);
/* Set the model, window (0 = default), quantile (0 = default) and the reserve the stall rule
 * spends (admission_reserve_ns); forgets every sample when the window changes, the stall-free
 * block means when the reserve does. Writes the effective values back into cfg. */
void fer_cost_configure(struct fer_cost *k, struct fer_config *cfg);
/* One measured NFE (or prefix pass) of nfe_ns nanoseconds that ended at now; span_ns, when not
 * 0, is the busy span of the worker step this NFE ended (one per step, on its first row; the
 * caller passes 0 for the step's other rows and for prefix passes), added to the run of the
 * worker whose state is t (NULL for prefix passes); `ends` says this NFE ended its request (done
 * or stopped), which closes the run as a block once it holds FER_COST_BLOCK spans. */
void fer_cost_record(struct fer_cost *k, struct fer_turnover *t, uint64_t now, uint64_t nfe_ns,
                     uint64_t span_ns, int ends);
/* Work of nfe NFEs was dispatched to the worker whose turnover is t (its first step pays it). */
void fer_cost_dispatched(struct fer_turnover *t, uint32_t nfe);
/* The worker whose turnover is t paused on purpose for pause_ns (its next span leaves it out). */
void fer_cost_paused(struct fer_turnover *t, uint64_t pause_ns);
/* The span to charge for a worker step (fer_cost_record's span_ns) whose busy span was span_ns
 * and compute measured_ns: the pause left out, then the turnover rule above. span_ns 0 (a later
 * row of the same step) stays 0. */
uint64_t fer_cost_turnover(const struct fer_cost *k, struct fer_turnover *t, uint64_t span_ns,
                           uint64_t measured_ns);
/* Rotate to now without a sample: what is older than the window ages out (a stats read). */
void fer_cost_age(struct fer_cost *k, uint64_t now);
/* Admission promised at now that a request ends by deadline_ns (it accepted a tested request):
 * one whose horizon is longer than the window suspends the stall rule until that deadline.
 * O(1), or O(buckets) when it suspends the rule. */
void fer_cost_promise(struct fer_cost *k, uint64_t now, uint64_t deadline_ns);

/* The admission path's read (docs/design.md §5.2): the ns per unit (NFE or prefix pass) admission
 * assumes at `now`, given the configured value. */
static inline uint64_t fer_cost_in_use(const struct fer_cost *k, uint64_t configured, uint64_t now)
{
    return now < k->valid_until_ns && k->adm_tail > configured ? k->adm_tail : configured;
}

/* The dispatch path's read: the ns per unit the expiry check at dispatch assumes for one request
 * about to start, max(configured, quantile) in adaptive mode. Not the block mean: that prices a
 * queue's worth of work behind a burst, and charged to a request that starts after the burst it
 * expired work the admission plan still had room for (docs/design.md §5.2). */
static inline uint64_t fer_cost_at_dispatch(const struct fer_cost *k, uint64_t configured,
                                            uint64_t now)
{
    return now < k->valid_until_ns && k->adm_qtail > configured ? k->adm_qtail : configured;
}

#endif /* FER_COST_H */

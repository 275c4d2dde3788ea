/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_cost.c - docs/design.md §5.2: the measured NFE cost tail and the cost model admission uses.
 *
 * Why a tail over a sliding window: a static nfe_ns is calibrated once, usually on a quieter
 * host than the one under overload, and an NFE then costs more than admission assumes (the
 * relay's own request and publisher threads, the GIL, neighbours). The adaptive model admits with
 * max(nfe_ns, recent tail), so a loaded host is priced in within a fraction of a second and the
 * estimate decays once the load is gone; the configured value stays the floor. The static model
 * keeps ADR 0015 (docs/design.md#decision-record)'s operator-owned number, and the same tail feeds
 * the drift alarm.
 *
 * The core holds two instances of the same estimator: one for NFEs (fed by fer_core_step) and,
 * for two-phase models, one for prefix passes (fed by fer_core_prefix_done); both share the
 * model, window and quantile, and each is read with its own configured floor (nfe_ns, prefix_ns).
 *
 * Layout and invariants: fer_cost.h. Work: record O(FER_COST_BUCKETS) at most (a sub-window
 * rotation clears one histogram; the quantile scan walks down from the highest bucket), the
 * admission read O(1), nothing allocated. Every call runs under core->mu, which the callers take:
 * this file knows the estimator, not the core (fer_core.c sets the model, fer_stats.c reads it),
 * so it includes fer.h for struct fer_config and never fer_internal.h.
 */
#include <stdint.h>
#include <string.h>

#include "fer.h"
#include "fer_sat.h"
#include "fer_cost.h"

int fer_cost_config_valid(const struct fer_config *cfg)
{
    return cfg->cost_model <= FER_COST_ADAPTIVE && cfg->cost_quantile_ppm <= FER_COST_PPM;
}

/* Log-linear bucket of v ns: bucket 0 below 2^MIN_LOG2, then PER_OCTAVE per power of two. */
static uint32_t bucket_of(uint64_t v)
{
    uint32_t e, m;

    if (v < (1ull << FER_COST_MIN_LOG2))
        return 0;
    e = 63u - (uint32_t)__builtin_clzll(v);
    if (e >= FER_COST_MIN_LOG2 + FER_COST_OCTAVES)
        return FER_COST_BUCKETS - 1;
    m = (uint32_t)(v >> (e - FER_COST_PER_OCTAVE_LOG2)) & (FER_COST_PER_OCTAVE - 1);
    return 1 + (e - FER_COST_MIN_LOG2) * FER_COST_PER_OCTAVE + m;
}

/* Exclusive upper edge of bucket b (FER_SAT for the last, open-ended one). */
static uint64_t bucket_upper(uint32_t b)
{
    uint32_t e, m;

    if (b == 0)
        return 1ull << FER_COST_MIN_LOG2;
    if (b == FER_COST_BUCKETS - 1)
        return FER_SAT;
    e = FER_COST_MIN_LOG2 + (b - 1) / FER_COST_PER_OCTAVE;
    m = (b - 1) % FER_COST_PER_OCTAVE;
    return (uint64_t)(FER_COST_PER_OCTAVE + m + 1) << (e - FER_COST_PER_OCTAVE_LOG2);
}

static void forget_all(struct fer_cost *k)
{
    memset(k->sub, 0, sizeof(k->sub));
    memset(k->agg, 0, sizeof(k->agg));
    memset(k->sub_count, 0, sizeof(k->sub_count));
    memset(k->sub_max, 0, sizeof(k->sub_max));
    memset(k->sub_stalls, 0, sizeof(k->sub_stalls));
    memset(k->sub_blocks, 0, sizeof(k->sub_blocks));
    memset(k->bsub, 0, sizeof(k->bsub));
    memset(k->bsub_ex, 0, sizeof(k->bsub_ex));
    memset(k->bagg, 0, sizeof(k->bagg));
    memset(k->bagg_ex, 0, sizeof(k->bagg_ex));
    memset(k->bsub_max, 0, sizeof(k->bsub_max));
    memset(k->bsub_max_ex, 0, sizeof(k->bsub_max_ex));
    k->blocks = 0;
    k->btop = 0;
    k->btop_ex = 0;
    k->block_dirty = 1;
    /* A new window knows none of the stalls that the promises still open may have met. */
    if (k->promised_until_ns > k->long_until_ns)
        k->long_until_ns = k->promised_until_ns;
    k->resets++; /* every worker's run too (fer_cost_record) */
    k->epoch = 0;
    k->valid_until_ns = 0;
    k->total = 0;
    k->top = 0;
    k->qtail = 0;
    k->block_mean = 0;
    k->tail = 0;
    k->window_max = 0;
    k->adm_tail = 0;
    k->adm_qtail = 0;
}

/* The bucket of the ppm quantile of a histogram of total samples whose highest non-empty bucket
 * is top: the first bucket, from the top, below which fewer than (1 - q) x total samples lie
 * above. total < 2^34 and FER_COST_PPM < 2^20, so the product cannot overflow. */
static uint32_t quantile_bucket(const uint32_t *agg, uint32_t top, uint64_t total, uint32_t ppm)
{
    uint64_t allowed = total * (FER_COST_PPM - ppm) / FER_COST_PPM, cum = 0;
    uint32_t b;

    for (b = top;; b--) {
        cum += agg[b];
        if (cum > allowed || b == 0)
            break;
    }
    return b;
}

/* The block mean (fer_cost.h): the largest of the window's block means (stall-free ones when ex)
 * in the bucket their FER_COST_BLOCK_PPM quantile falls in; 0 without a block. */
static uint64_t block_quantile(const struct fer_cost *k, int ex)
{
    const uint64_t(*bmx)[FER_COST_BUCKETS] = ex ? k->bsub_max_ex : k->bsub_max;
    uint64_t v = 0;
    uint32_t b, s;

    if (k->blocks == 0)
        return 0;
    b = quantile_bucket(ex ? k->bagg_ex : k->bagg, ex ? k->btop_ex : k->btop, k->blocks,
                        FER_COST_BLOCK_PPM);
    for (s = 0; s < FER_COST_SUBWINDOWS; s++)
        if (bmx[s][b] > v)
            v = bmx[s][b];
    return v;
}

/* Tail, maximum, admission value and validity from the histogram (after any change). */
static void recompute(struct fer_cost *k)
{
    uint64_t wmax = 0, qt;
    uint32_t s, stalls = 0, ex;

    for (s = 0; s < FER_COST_SUBWINDOWS; s++) {
        stalls += k->sub_stalls[s];
        if (k->sub_max[s] > wmax)
            wmax = k->sub_max[s];
    }
    k->window_max = wmax;
    /* The window's p99 block (fer_cost.h), its largest below 100 blocks; under the stall rule
     * (one stall in the window, no promise longer than it open) of the stall-free means. */
    ex = stalls <= 1 && k->long_until_ns <= fer_sat_mul(k->epoch, k->sub_ns);
    if (k->block_dirty || ex != k->block_ex) { /* a step that closes no block reads no histogram */
        k->block_mean = block_quantile(k, (int)ex);
        k->block_ex = ex;
        k->block_dirty = 0;
    }
    if (k->total == 0) {
        k->qtail = 0;
        k->tail = 0;
        k->adm_tail = 0;
        k->adm_qtail = 0;
        k->valid_until_ns = 0;
        return;
    }
    qt = bucket_upper(quantile_bucket(k->agg, k->top, k->total, k->quantile_ppm));
    k->qtail = qt < wmax ? qt : wmax;
    k->tail = k->qtail > k->block_mean ? k->qtail : k->block_mean;
    k->adm_tail = k->model == FER_COST_ADAPTIVE ? k->tail : 0;
    k->adm_qtail = k->model == FER_COST_ADAPTIVE ? k->qtail : 0;
    k->valid_until_ns = fer_sat_mul(fer_sat_add(k->epoch, FER_COST_SUBWINDOWS), k->sub_ns);
}

static void clear_sub(struct fer_cost *k, uint32_t s)
{
    uint32_t b;

    if (k->sub_count[s] != 0) {
        for (b = 0; b < FER_COST_BUCKETS; b++) {
            k->agg[b] -= k->sub[s][b];
            k->sub[s][b] = 0;
        }
        k->total -= k->sub_count[s];
        k->sub_count[s] = 0;
        while (k->top > 0 && k->agg[k->top] == 0)
            k->top--;
    }
    if (k->sub_blocks[s] != 0) {
        for (b = 0; b < FER_COST_BUCKETS; b++) {
            k->bagg[b] -= k->bsub[s][b];
            k->bagg_ex[b] -= k->bsub_ex[s][b];
            k->bsub[s][b] = 0;
            k->bsub_ex[s][b] = 0;
            k->bsub_max[s][b] = 0;
            k->bsub_max_ex[s][b] = 0;
        }
        k->blocks -= k->sub_blocks[s];
        k->sub_blocks[s] = 0;
        k->block_dirty = 1;
        while (k->btop > 0 && k->bagg[k->btop] == 0)
            k->btop--;
        while (k->btop_ex > 0 && k->bagg_ex[k->btop_ex] == 0)
            k->btop_ex--;
    }
    k->sub_max[s] = 0;
    k->sub_stalls[s] = 0;
}

/* Rotate to the sub-window holding now; 1 if anything aged out or moved. A `now` older than
 * the newest sample's (another worker's clock read raced ahead) counts in the newest one. */
static int advance(struct fer_cost *k, uint64_t now)
{
    uint64_t e = now / k->sub_ns, n, i;

    if (e <= k->epoch)
        return 0;
    n = e - k->epoch < FER_COST_SUBWINDOWS ? e - k->epoch : FER_COST_SUBWINDOWS;
    for (i = 1; i <= n; i++)
        clear_sub(k, (uint32_t)((k->epoch + i) % FER_COST_SUBWINDOWS));
    k->epoch = e;
    return 1;
}

void fer_cost_configure(struct fer_cost *k, struct fer_config *cfg)
{
    uint64_t window = cfg->cost_window_ns ? cfg->cost_window_ns : FER_COST_DEFAULT_WINDOW_NS;

    k->model = cfg->cost_model;
    k->quantile_ppm = cfg->cost_quantile_ppm ? cfg->cost_quantile_ppm
                                             : FER_COST_DEFAULT_QUANTILE_PPM;
    if (window != k->window_ns) {
        k->window_ns = window;
        k->sub_ns = window / FER_COST_SUBWINDOWS ? window / FER_COST_SUBWINDOWS : 1;
        forget_all(k);
    }
    if (cfg->admission_reserve_ns != k->reserve_ns) {
        /* What was left out was bounded by the old reserve: charge it all until it ages out. */
        k->reserve_ns = cfg->admission_reserve_ns;
        memcpy(k->bsub_ex, k->bsub, sizeof(k->bsub_ex));
        memcpy(k->bagg_ex, k->bagg, sizeof(k->bagg_ex));
        memcpy(k->bsub_max_ex, k->bsub_max, sizeof(k->bsub_max_ex));
        k->btop_ex = k->btop;
        k->block_dirty = 1;
    }
    cfg->cost_window_ns = k->window_ns;
    cfg->cost_quantile_ppm = k->quantile_ppm;
    recompute(k);
}

/* Whether an excess of excess_ns over a typical span is a stall (fer_cost.h): at least
 * reserve_ns / FER_COST_STALL_DIV, never with reserve_ns 0. */
static int stall_sized(const struct fer_cost *k, uint64_t excess_ns)
{
    return k->reserve_ns != 0 && excess_ns != 0 &&
           excess_ns >= k->reserve_ns - k->reserve_ns / FER_COST_STALL_DIV;
}

/* A completed block of n >= FER_COST_BLOCK spans (sum, largest top) in sub-window s: its mean,
 * and its stall-free mean when its largest span is a stall (fer_cost.h). */
static void complete_block(struct fer_cost *k, uint32_t s, uint64_t sum, uint64_t top, uint32_t n)
{
    uint64_t mean = sum / n, mean_ex = mean, typical, excess;

    /* A saturated sum is no measure of anything: charged as it is. */
    if (k->reserve_ns != 0 && sum != FER_SAT) {
        typical = (sum - top) / (n - 1);
        excess = top > typical ? top - typical : 0;
        if (stall_sized(k, excess)) {
            mean_ex = (sum - (excess < k->reserve_ns ? excess : k->reserve_ns)) / n;
            k->sub_stalls[s]++;
        }
    }
    if (k->sub_blocks[s] != UINT32_MAX) { /* a saturated sub-window keeps its shape */
        uint32_t b = bucket_of(mean), b_ex = bucket_of(mean_ex);

        k->bsub[s][b]++;
        k->bagg[b]++;
        k->bsub_ex[s][b_ex]++;
        k->bagg_ex[b_ex]++;
        k->sub_blocks[s]++;
        k->blocks++;
        k->block_dirty = 1;
        if (b > k->btop)
            k->btop = b;
        if (b_ex > k->btop_ex)
            k->btop_ex = b_ex;
        if (mean > k->bsub_max[s][b])
            k->bsub_max[s][b] = mean;
        if (mean_ex > k->bsub_max_ex[s][b_ex])
            k->bsub_max_ex[s][b_ex] = mean_ex;
    }
}

void fer_cost_record(struct fer_cost *k, struct fer_turnover *t, uint64_t now, uint64_t nfe_ns,
                     uint64_t span_ns, int ends)
{
    uint32_t s, b;

    advance(k, now);
    s = (uint32_t)(k->epoch % FER_COST_SUBWINDOWS);
    b = bucket_of(nfe_ns);
    if (k->sub_count[s] != UINT32_MAX) { /* a saturated sub-window keeps its shape */
        k->sub[s][b]++;
        k->agg[b]++;
        k->sub_count[s]++;
        k->total++;
        if (b > k->top)
            k->top = b;
    }
    if (nfe_ns > k->sub_max[s])
        k->sub_max[s] = nfe_ns;
    if (t != NULL && t->run_n != 0 &&
        (t->run_resets != k->resets || k->epoch >= fer_sat_add(t->run_epoch, FER_COST_SUBWINDOWS))) {
        /* A whole window without a span of this worker: its run is as old as the rest. */
        t->run_sum = 0;
        t->run_top = 0;
        t->run_n = 0;
    }
    if (t != NULL && span_ns != 0) {
        /* run_sum: at most FER_COST_BLOCK_MAX spans; saturating, so a saturated span stays one */
        t->run_sum = fer_sat_add(t->run_sum, span_ns);
        if (span_ns > t->run_top)
            t->run_top = span_ns;
        t->run_n++;
        t->run_epoch = k->epoch;
        t->run_resets = k->resets;
    }
    if (t != NULL && (t->run_n >= FER_COST_BLOCK_MAX || (ends && t->run_n >= FER_COST_BLOCK))) {
        /* a block of whole requests (or of one long request's FER_COST_BLOCK_MAX steps) */
        complete_block(k, s, t->run_sum, t->run_top, t->run_n);
        t->run_sum = 0;
        t->run_top = 0;
        t->run_n = 0;
    }
    k->samples = fer_sat_add(k->samples, 1);
    recompute(k);
}

void fer_cost_dispatched(struct fer_turnover *t, uint32_t nfe)
{
    if (nfe != 0 && (t->nfe == 0 || nfe < t->nfe))
        t->nfe = nfe;
}

void fer_cost_paused(struct fer_turnover *t, uint64_t pause_ns)
{
    t->paused_ns = fer_sat_add(t->paused_ns, pause_ns);
}

uint64_t fer_cost_turnover(const struct fer_cost *k, struct fer_turnover *t, uint64_t span_ns,
                           uint64_t measured_ns)
{
    uint64_t base = measured_ns != 0 ? measured_ns : 1, gap, pay;

    if (span_ns == 0)
        return 0;
    if (t->paused_ns != 0) {
        /* the pause, as asked, is priced by the cost in use's pacing term, not by the span */
        gap = span_ns > base ? span_ns - base : 0;
        span_ns -= gap < t->paused_ns ? gap : t->paused_ns;
        t->paused_ns = 0;
    }
    if (t->nfe != 0) {
        gap = span_ns > base ? span_ns - base : 0;
        if (gap != 0 && !stall_sized(k, gap)) {
            t->debt_ns = fer_sat_add(t->debt_ns, gap);
            span_ns -= gap;
        }
        t->per_step_ns = t->debt_ns / t->nfe + (t->debt_ns % t->nfe != 0);
        t->nfe = 0;
    }
    pay = t->per_step_ns < t->debt_ns ? t->per_step_ns : t->debt_ns;
    t->debt_ns -= pay;
    return fer_sat_add(span_ns, pay);
}

void fer_cost_age(struct fer_cost *k, uint64_t now)
{
    if (advance(k, now))
        recompute(k);
}

void fer_cost_promise(struct fer_cost *k, uint64_t now, uint64_t deadline_ns)
{
    if (deadline_ns > k->promised_until_ns)
        k->promised_until_ns = deadline_ns;
    if (deadline_ns > now && deadline_ns - now > k->window_ns && deadline_ns > k->long_until_ns) {
        k->long_until_ns = deadline_ns;
        recompute(k);
    }
}

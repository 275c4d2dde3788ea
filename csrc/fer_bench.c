/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_bench.c - timing and stress drivers that must run in C, compiled into the extension
 * (declared in fer_bench.h, apart from the runtime contract fer.h).
 *
 * Why a fer_bench_ export rather than a separate C program compiled by the benchmark at run time:
 * the benchmark then works wherever the extension works (an installed package has no csrc/ and
 * possibly no compiler), measures the very object code the relay runs (same flags, same build),
 * and the timing loop stays free of any Python or CFFI overhead. The cost is a few hundred bytes
 * of code in the shipped module that nothing on the data path calls.
 */
#define _POSIX_C_SOURCE 200809L

#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fer_internal.h"
#include "fer_bench.h"

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void set_id(struct fer_request *r, const char *prefix, uint32_t n)
{
    int len = snprintf(r->session_id, sizeof(r->session_id), "%s-%u", prefix, n);
    r->session_id_len = (uint32_t)len;
}

/*
 * Workload (the Python benchmark replays the same shape through CFFI):
 *   nfe_ns = 1 us; every lane busy with 8 NFE; `depth` queued requests of 1..8 NFE, one session
 *   each, deadlines 1 ms + i * 10 us ahead (all feasible, all finite, so the simulation walks the
 *   whole queue); each sample submits x with a deadline between two queued ones (random
 *   position), a new generation of session "x" that prunes the previous x. Each sample is one
 *   accepted admission decision at queue depth `depth` + 1 with a full lane simulation behind x.
 */
int fer_bench_admission(uint32_t depth, uint32_t workers, uint32_t samples, uint64_t seed,
                        uint32_t fair_share, uint64_t *lat_ns)
{
    struct fer_config cfg;
    struct fer_core *c;
    struct fer_request r;
    struct fer_work w;
    struct fer_outcome o;
    float obs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint64_t now = 1000000000000ull, rng = seed | 1, t0, t1;
    uint32_t i;
    int rc;

    FER_CHECK_ARGS(lat_ns != NULL || samples == 0);
    memset(&cfg, 0, sizeof(cfg));
    cfg.workers = workers;
    cfg.queue_capacity = depth + 1;
    cfg.max_sessions = depth + workers + 1;
    cfg.max_nfe = 64;
    cfg.obs_dim = 4;
    cfg.action_len = 0;
    cfg.ring_capacity = 64;
    cfg.nfe_ns = 1000;
    cfg.reject_if_retry_count_gte = 1;
    cfg.age_gate = FER_AGE_GATE_RETRIES;
    cfg.fair_share = fair_share; /* §7.1: every session its own client, all tracked */
    cfg.max_clients = depth + workers + 2 < FER_MAX_CLIENTS ? depth + workers + 2 : FER_MAX_CLIENTS;
    rc = fer_core_create(&cfg, &c);
    if (rc != FER_OK)
        return rc;
    memset(&r, 0, sizeof(r));
    r.observation = obs;
    w.observation = obs;
    for (i = 0; i < workers; i++) {
        set_id(&r, "run", i);
        r.remaining_nfe = 8;
        r.deadline_ns = now + 500000u;
        r.origin_ns = now;
        if (fer_core_submit(c, &r, now) != FER_ACCEPTED || fer_core_dispatch(c, i, now, &w) != 1)
            goto broken;
    }
    for (i = 0; i < depth; i++) {
        set_id(&r, "q", i);
        r.remaining_nfe = 1 + (uint32_t)(xorshift(&rng) % 8);
        r.deadline_ns = now + 1000000u + (uint64_t)i * 10000u;
        if (fer_core_submit(c, &r, now) != FER_ACCEPTED)
            goto broken;
    }
    set_id(&r, "x", 0);
    for (i = 0; i < samples; i++) {
        r.generation = i + 1u;
        r.sequence = i;
        r.remaining_nfe = 1 + (uint32_t)(xorshift(&rng) % 8);
        r.deadline_ns = now + 1000000u + (xorshift(&rng) % (depth + 1u)) * 10000u + 5000u;
        t0 = mono_ns();
        rc = fer_core_submit(c, &r, now);
        t1 = mono_ns();
        if (rc != FER_ACCEPTED)
            goto broken;
        lat_ns[i] = t1 - t0;
        /* Untimed: drain the REJECTED_STALE of the previous x so ring 0 never fills. */
        while (fer_ring_pop(c->rings[0], &o, NULL))
            ;
    }
    fer_core_destroy(c);
    return FER_OK;
broken:
    fer_core_destroy(c);
    return FER_ESTATE;
}

static float payload(uint64_t seq, uint32_t k)
{
    return (float)((seq & 0xfffffu) + k); /* exact in float32 (< 2^24) */
}

uint64_t fer_bench_ring_produce(struct fer_ring *ring, uint64_t first, uint64_t n)
{
    struct fer_outcome rec;
    float act[256];
    uint64_t i, full = 0;
    uint32_t k, al = ring->action_len < 256 ? ring->action_len : 256;

    memset(&rec, 0, sizeof(rec));
    rec.has_actions = al > 0;
    for (i = 0; i < n; i++) {
        rec.sequence = first + i;
        rec.nfe_done = (uint32_t)i;
        for (k = 0; k < al; k++)
            act[k] = payload(rec.sequence, k);
        while (fer_ring_push(ring, &rec, act) == FER_EFULL) {
            full++;
            sched_yield(); /* a 2-core CI box: let the consumer run */
        }
    }
    return full;
}

uint64_t fer_bench_ring_consume(struct fer_ring *ring, uint64_t first, uint64_t n)
{
    struct fer_outcome rec;
    float act[256];
    uint64_t got = 0, errors = 0;
    uint32_t k, al = ring->action_len < 256 ? ring->action_len : 256;

    while (got < n) {
        if (ring->action_len > 256) /* payload check limited to the local buffer */
            return n;
        if (!fer_ring_pop(ring, &rec, act)) {
            /* 30 s without a record: the producer is gone (a test must fail, not hang). Not
             * shorter: on a loaded 2-core host a runnable producer can wait 100 ms and more. */
            if (!fer_ring_wait(ring, 30000000000ull))
                return errors + (n - got);
            continue;
        }
        if (rec.sequence != first + got)
            errors++;
        for (k = 0; k < al; k++)
            if (act[k] != payload(rec.sequence, k)) {
                errors++;
                break;
            }
        got++;
    }
    return errors;
}

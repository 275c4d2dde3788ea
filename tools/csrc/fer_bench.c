/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_bench.c - timing and stress drivers that must run in C (declared in fer_bench.h), compiled
 * into the tools package's own extension (flowedge_relay_tools._fer_bench), not into the relay's.
 *
 * Why C drivers rather than Python loops: the timing loop stays free of any Python or CFFI
 * overhead. Why through the runtime core's public calls only (fer.h, fer_intake.h), resolved at load from the
 * relay's own module (flowedge_relay_tools/native.py): the benchmark measures the very object code
 * the relay runs (same flags, same build), and the relay ships no bench code.
 */
#define _POSIX_C_SOURCE 200809L

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fer.h"
#include "fer_pool.h"
#include "fer_rcl.h"
#include "fer_wire.h"
#include "fer_intake.h"
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

    if (lat_ns == NULL && samples != 0)
        return FER_EINVAL;
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
        /* Untimed: drain the REJECTED_STALE of the previous x so its ring never fills. */
        while (fer_core_pop_outcomes(c, &o, NULL, 1) > 0)
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
    uint32_t k, al = fer_ring_action_len(ring) < 256 ? fer_ring_action_len(ring) : 256;

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
    uint32_t k, al = fer_ring_action_len(ring) < 256 ? fer_ring_action_len(ring) : 256;

    while (got < n) {
        if (fer_ring_action_len(ring) > 256) /* payload check limited to the local buffer */
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

int fer_bench_intake_decide(struct fer_intake *in, const uint8_t *buf, const uint64_t *offsets,
                            uint32_t n_msgs, uint32_t n, uint64_t now_mono, int64_t now_ros,
                            uint64_t *ns_out)
{
    uint32_t i;

    if ((in != NULL && (buf == NULL || offsets == NULL || n_msgs == 0)) || ns_out == NULL)
        return FER_EINVAL;
    for (i = 0; i < n; i++) {
        const uint64_t *o = in ? &offsets[i % n_msgs] : NULL;
        uint64_t t0, t1;
        int32_t decision;

        t0 = mono_ns();
        if (in != NULL)
            fer_intake_decide(in, buf + o[0], o[1] - o[0], now_mono, now_ros, &decision);
        t1 = mono_ns();
        ns_out[i] = t1 - t0;
    }
    return FER_OK;
}

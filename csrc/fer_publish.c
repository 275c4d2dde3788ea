/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_publish.c - the publisher thread's loop in C: outcome rings -> ActionMessage CDR -> rcl
 * (fer_publish.h says why). Allocates only in create.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fer_internal.h"
#include "fer_cdr.h"
#include "fer_rcl.h"
#include "fer_publish.h"
#include "fer_pool.h"

#define NS_PER_S FER_CDR_NS_PER_S

/* ActionMessage, field by field in msg/ActionMessage.msg order. */
static void write_action(struct fer_cdr_writer *w, const struct fer_publisher *p,
                         const struct fer_outcome *o, const float *actions, int64_t stamp_ns)
{
    uint32_t n_actions = o->has_actions ? p->action_len : 0;
    /* acquire: set_pool's pool is whole once seen */
    const struct fer_pool *pool = __atomic_load_n(&p->pool, __ATOMIC_ACQUIRE);
    uint32_t relay_id_len = 0;
    const char *relay_id = pool ? fer_pool_relay_id(pool, &relay_id_len) : "";

    fer_cdr_begin(w);
    fer_cdr_time(w, stamp_ns);                               /* header.stamp */
    fer_cdr_string(w, "", 0);                                /* header.frame_id */
    fer_cdr_u8(w, (uint8_t)o->code);
    fer_cdr_string(w, o->session_id, o->session_id_len);
    fer_cdr_u64(w, o->sequence);
    fer_cdr_u64(w, o->generation);
    fer_cdr_u32(w, o->retry_count);
    fer_cdr_string(w, p->digest, p->digest_len);             /* model_digest */
    fer_cdr_u32(w, p->observation_dim);
    fer_cdr_u32(w, p->action_dim);
    fer_cdr_u32(w, p->action_horizon);
    fer_cdr_time(w, (int64_t)(o->deadline_ros_ns > INT64_MAX ? INT64_MAX : o->deadline_ros_ns));
    fer_cdr_u32(w, o->remaining_nfe);
    fer_cdr_u32(w, n_actions);                               /* float32[] actions */
    fer_cdr_put(w, actions, (uint64_t)n_actions * sizeof(float), 4);
    fer_cdr_u32(w, o->nfe_done);
    fer_cdr_u64(w, o->queue_ns);
    fer_cdr_u64(w, o->compute_ns);
    fer_cdr_u8(w, (uint8_t)o->retry_reason);
    fer_cdr_u32(w, o->frozen_rows);
    fer_cdr_time(w, (int64_t)(o->chunk_start_ros_ns > INT64_MAX ? INT64_MAX
                                                               : o->chunk_start_ros_ns));
    fer_cdr_string(w, o->client_id, o->client_id_len);      /* §7.1 */
    fer_cdr_u8(w, (uint8_t)o->reject_reason);
    fer_cdr_string(w, relay_id, relay_id_len);               /* a pool's (docs/design.md §13) */
    fer_cdr_u32(w, pool ? fer_pool_epoch(pool) : 0);
}

uint64_t fer_action_cdr(const struct fer_publisher *p, const struct fer_outcome *o,
                        const float *actions, int64_t stamp_ns, uint8_t *buf, uint64_t cap)
{
    struct fer_cdr_writer w = {buf, 0, cap};

    if (p == NULL || o == NULL || buf == NULL || o->session_id_len > FER_SESSION_ID_MAX ||
        o->client_id_len > FER_SESSION_ID_MAX || (o->has_actions && actions == NULL))
        return 0;
    write_action(&w, p, o, actions, stamp_ns);
    return w.n <= cap ? w.n : 0;
}

uint64_t fer_action_cdr_max(const struct fer_publisher *p)
{
    return p ? p->cdr_cap : 0;
}

int fer_publisher_set_pool(struct fer_publisher *p, struct fer_pool *pool)
{
    if (p == NULL)
        return FER_EINVAL;
    __atomic_store_n(&p->pool, pool, __ATOMIC_RELEASE);
    return FER_OK;
}

/* ---- create / destroy -------------------------------------------------------------------------- */

int fer_publisher_create(struct fer_core *core, const char *digest, uint32_t digest_len,
                         uint32_t observation_dim, uint32_t action_dim, uint32_t action_horizon,
                         struct fer_publisher **out)
{
    struct fer_publisher *p;
    struct fer_outcome o;
    struct fer_cdr_writer w;

    if (out == NULL)
        return FER_EINVAL;
    *out = NULL;
    if (core == NULL || digest_len > FER_DIGEST_MAX || (digest == NULL && digest_len > 0))
        return FER_EINVAL;
    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return FER_ENOMEM;
    p->core = core;
    p->action_len = core->cfg.action_len; /* fixed at create */
    p->observation_dim = observation_dim;
    p->action_dim = action_dim;
    p->action_horizon = action_horizon;
    p->digest_len = digest_len;
    if (digest_len)
        memcpy(p->digest, digest, digest_len);
    /* The largest message: full session and client ids and every action float (a sizing
     * pass). */
    memset(&o, 0, sizeof(o));
    o.session_id_len = FER_SESSION_ID_MAX;
    o.client_id_len = FER_SESSION_ID_MAX;
    o.has_actions = 1;
    w = (struct fer_cdr_writer){NULL, 0, 0};
    write_action(&w, p, &o, NULL, 0); /* cap 0: sizes only, reads and writes nothing */
    p->cdr_cap = w.n + FER_POOL_RELAY_ID_MAX; /* a pool's relay_id, set later */
    p->outcomes = calloc(FER_PUBLISH_BATCH, sizeof(*p->outcomes));
    p->actions = calloc((size_t)FER_PUBLISH_BATCH * p->action_len, sizeof(float));
    p->buf = calloc(1, p->cdr_cap);
    if (p->outcomes == NULL || p->actions == NULL || p->buf == NULL) {
        fer_publisher_destroy(p);
        return FER_ENOMEM;
    }
    *out = p;
    return FER_OK;
}

void fer_publisher_destroy(struct fer_publisher *p)
{
    if (p == NULL)
        return;
    free(p->outcomes);
    free(p->actions);
    free(p->buf);
    free(p);
}

/* ---- the loop ---------------------------------------------------------------------------------- */

static int64_t realtime_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * (int64_t)NS_PER_S + ts.tv_nsec;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

/* Publish one popped outcome; an INFERENCE answer adds its latency to the window. */
static void publish_one(struct fer_publisher *p, const struct fer_outcome *o, const float *act,
                        fer_rcl_publish_fn publish, const void *rcl_publisher,
                        fer_rcl_reset_error_fn reset_error)
{
    struct fer_rcl_serialized msg;
    int32_t rc;

    memset(&msg, 0, sizeof(msg));
    msg.buffer = p->buf;
    msg.buffer_length = fer_action_cdr(p, o, act, realtime_ns(), p->buf, p->cdr_cap);
    msg.buffer_capacity = p->cdr_cap;
    rc = publish(rcl_publisher, &msg, NULL);
    if (rc != 0) {
        /* relaxed: counters for readers that only report them */
        __atomic_store_n(&p->last_error, rc, __ATOMIC_RELAXED);
        __atomic_store_n(&p->failed, p->failed + 1, __ATOMIC_RELAXED);
        if (reset_error)
            reset_error();
    } else {
        __atomic_store_n(&p->published, p->published + 1, __ATOMIC_RELAXED);
    }
    if (o->code == FER_INFERENCE && o->has_actions) {
        uint64_t k = p->latency_count;
        uint64_t d = fer_sat_sub(o->finish_ns, o->arrival_ns);

        p->latency_ms[k % FER_LATENCY_WINDOW] = (double)d / 1e6;
        /* release: a reader that sees the new count sees the sample it covers */
        __atomic_store_n(&p->latency_count, k + 1, __ATOMIC_RELEASE);
    }
}

int fer_publish_run(struct fer_publisher *p, fer_rcl_publish_fn publish,
                    const void *rcl_publisher, fer_rcl_reset_error_fn reset_error,
                    uint64_t wait_ns)
{
    if (p == NULL || publish == NULL || rcl_publisher == NULL)
        return FER_EINVAL;
    for (;;) {
        /* relaxed: flags set by other threads; a pass late to see one is harmless */
        int stopping = __atomic_load_n(&p->stop, __ATOMIC_RELAXED) != 0;
        int n, i;

        if (__atomic_load_n(&p->pause, __ATOMIC_RELAXED) && !stopping) {
            struct timespec ms10 = {0, 10000000};
            nanosleep(&ms10, NULL);
            continue;
        }
        fer_core_wait_outputs(p->core, wait_ns);
        while ((n = fer_core_pop_outcomes(p->core, p->outcomes, p->actions,
                                          FER_PUBLISH_BATCH)) > 0) {
            /* a pool member's own stall, found here if this thread runs first after it */
            struct fer_pool *pool = __atomic_load_n(&p->pool, __ATOMIC_ACQUIRE);
            uint64_t mark = pool ? fer_pool_stall_check(pool, mono_ns()) : 0;

            for (i = 0; i < n; i++) {
                if (pool && fer_pool_surrenders(pool, p->outcomes[i].arrival_ns, mark)) {
                    __atomic_store_n(&p->surrendered, p->surrendered + 1, __ATOMIC_RELAXED);
                    continue; /* taken over: the others answer it */
                }
                publish_one(p, &p->outcomes[i], &p->actions[(size_t)i * p->action_len],
                            publish, rcl_publisher, reset_error);
            }
        }
        if (stopping)
            return FER_OK;
        if (atomic_load_explicit(&p->core->shutdown, memory_order_relaxed)) {
            /* After shutdown the doorbell no longer blocks, and stop comes only once the
             * workers are joined: poll for it instead of spinning. A SCHED_FIFO publisher
             * spinning here kept every lower thread of its CPU off it, the workers stop()
             * joins among them (and a worker holding the GIL, the thread that sets stop). */
            struct timespec ms1 = {0, 1000000};
            nanosleep(&ms1, NULL);
        }
    }
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_publish.c - the publisher thread's loop in C: outcome rings -> ActionMessage CDR -> rcl
 * (fer_publish.h says why). Allocates only in create (and a pool
 * member's hold buffers in the first fer_publisher_set_pool).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <flowedge_relay_msgs/msg/detail/action_message__struct.h>

#include "fer_internal.h"
#include "fer_rcl.h"
#include "fer_publish.h"
#include "fer_pool.h"

#define NS_PER_S 1000000000ull
/* timebase.ROS_TIME_MAX_NS: the latest stamp a builtin_interfaces/Time (int32 sec) can hold */
#define ROS_TIME_MAX_NS ((uint64_t)INT32_MAX * NS_PER_S + NS_PER_S - 1)

typedef flowedge_relay_msgs__msg__ActionMessage action_msg;

/* The strings an ActionMessage points at: rosidl's C strings end with a NUL inside capacity. */
struct action_strings {
    char session_id[FER_SESSION_ID_MAX + 1];
    char client_id[FER_SESSION_ID_MAX + 1];
    char digest[FER_DIGEST_MAX + 1];
    char relay_id[FER_POOL_RELAY_ID_MAX + 1];
    char empty[1];
};

/* What the publisher fills in place for each answer: the generated struct and its strings. */
struct action_out {
    action_msg m;
    struct action_strings s;
};

static void set_string(rosidl_runtime_c__String *str, char *buf, const char *src, size_t len)
{
    if (len && src != buf)
        memcpy(buf, src, len);
    buf[len] = '\0';
    str->data = buf;
    str->size = len;
    str->capacity = len + 1;
}

/* builtin_interfaces/Time from ns, saturated as timebase.ros_time. */
static builtin_interfaces__msg__Time ros_time(int64_t ns)
{
    uint64_t t = ns <= 0 ? 0 : (uint64_t)ns;
    builtin_interfaces__msg__Time out;

    if (t > ROS_TIME_MAX_NS)
        t = ROS_TIME_MAX_NS;
    out.sec = (int32_t)(t / NS_PER_S); /* t / 1e9 <= INT32_MAX */
    out.nanosec = (uint32_t)(t % NS_PER_S);
    return out;
}

static int64_t ros_ns(uint64_t ns)
{
    return (int64_t)(ns > INT64_MAX ? INT64_MAX : ns);
}

/* One outcome as the generated ActionMessage, pointing at x->s and at `actions` (no copy of the
 * actions, no allocation). Every member is set here or left zero by the memset: the round-trip
 * test (test/test_wire.py) checks each .msg field against rclpy's own message. */
static void fill_action(const struct fer_publisher *p, const struct fer_outcome *o,
                        const float *actions, int64_t stamp_ns, struct action_out *x)
{
    action_msg *m = &x->m;
    /* acquire: set_pool's pool is whole once seen */
    const struct fer_pool *pool = __atomic_load_n(&p->pool, __ATOMIC_ACQUIRE);
    uint32_t relay_id_len = 0;
    const char *relay_id = pool ? fer_pool_relay_id(pool, &relay_id_len) : "";

    memset(m, 0, sizeof(*m));
    m->header.stamp = ros_time(stamp_ns);
    set_string(&m->header.frame_id, x->s.empty, "", 0);
    m->code = (uint8_t)o->code;
    set_string(&m->session_id, x->s.session_id, o->session_id, o->session_id_len);
    m->sequence = o->sequence;
    m->generation = o->generation;
    m->retry_count = o->retry_count;
    set_string(&m->model_digest, x->s.digest, p->digest, p->digest_len);
    m->observation_dim = p->observation_dim;
    m->action_dim = p->action_dim;
    m->action_horizon = p->action_horizon;
    m->deadline = ros_time(ros_ns(o->deadline_ros_ns));
    m->remaining_nfe = o->remaining_nfe;
    m->actions.data = o->has_actions ? (float *)(uintptr_t)actions : NULL;
    m->actions.size = o->has_actions ? p->action_len : 0;
    m->actions.capacity = m->actions.size;
    m->nfe_done = o->nfe_done;
    m->queue_ns = o->queue_ns;
    m->compute_ns = o->compute_ns;
    m->retry_reason = (uint8_t)o->retry_reason;
    m->frozen_rows = o->frozen_rows;
    m->chunk_start = ros_time(ros_ns(o->chunk_start_ros_ns));
    set_string(&m->client_id, x->s.client_id, o->client_id, o->client_id_len); /* §7.1 */
    m->reject_reason = (uint8_t)o->reject_reason;
    /* a pool's (docs/design.md §13) */
    set_string(&m->relay_id, x->s.relay_id, relay_id,
               relay_id_len > FER_POOL_RELAY_ID_MAX ? FER_POOL_RELAY_ID_MAX : relay_id_len);
    m->pool_epoch = pool ? fer_pool_epoch(pool) : 0;
}

uint64_t fer_action_cdr(const struct fer_publisher *p, const struct fer_outcome *o,
                        const float *actions, int64_t stamp_ns, uint8_t *buf, uint64_t cap)
{
    struct action_out x;

    if (p == NULL || o == NULL || buf == NULL || o->session_id_len > FER_SESSION_ID_MAX ||
        o->client_id_len > FER_SESSION_ID_MAX || (o->has_actions && actions == NULL))
        return 0;
    fill_action(p, o, actions, stamp_ns, &x);
    return fer_wire_serialize_action(&x.m, buf, cap);
}

uint64_t fer_action_cdr_max(const struct fer_publisher *p)
{
    return p ? p->cdr_cap : 0;
}

int fer_publisher_set_pool(struct fer_publisher *p, struct fer_pool *pool)
{
    if (p == NULL)
        return FER_EINVAL;
    if (pool != NULL && p->held == NULL) { /* the hold's buffers: a pool member's only */
        p->held = calloc(FER_POOL_HOLD_MAX, sizeof(*p->held));
        p->held_actions = calloc((size_t)FER_POOL_HOLD_MAX * p->action_len + 1, sizeof(float));
        p->mine = calloc(FER_POOL_HOLD_MAX, 1);
        if (p->held == NULL || p->held_actions == NULL || p->mine == NULL) {
            free(p->held);
            free(p->held_actions);
            free(p->mine);
            p->held = NULL;
            p->held_actions = NULL;
            p->mine = NULL;
            return FER_ENOMEM;
        }
    }
    __atomic_store_n(&p->pool, pool, __ATOMIC_RELEASE);
    return FER_OK;
}

/* ---- create / destroy -------------------------------------------------------------------------- */

int fer_publisher_create(struct fer_core *core, const char *digest, uint32_t digest_len,
                         uint32_t observation_dim, uint32_t action_dim, uint32_t action_horizon,
                         struct fer_publisher **out)
{
    struct fer_publisher *p;
    struct action_out *x;

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
    /* The largest message's CDR bound: fixed members with their padding (under 160 bytes), the
     * five strings at their longest (length word and NUL each), every action float. */
    p->cdr_cap = 256 + 2ull * (FER_SESSION_ID_MAX + 8) + FER_DIGEST_MAX + FER_POOL_RELAY_ID_MAX +
                 5 * 8 + (uint64_t)p->action_len * sizeof(float);
    p->outcomes = calloc(FER_PUBLISH_BATCH, sizeof(*p->outcomes));
    p->actions = calloc((size_t)FER_PUBLISH_BATCH * p->action_len, sizeof(float));
    x = calloc(1, sizeof(*x));
    p->msg = x;
    if (p->outcomes == NULL || p->actions == NULL || x == NULL) {
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
    free(p->msg);
    free(p->held);
    free(p->held_actions);
    free(p->mine);
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
    struct action_out *x = p->msg;
    int32_t rc;

    fill_action(p, o, act, realtime_ns(), x);
    rc = publish(rcl_publisher, &x->m, NULL); /* rcl_publish: the middleware serializes it */
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

/* An outcome of a request that arrived before the own-stall watermark: held, or dropped
 * (answered by another member already, or no slot left; counted surrendered). */
static void hold_one(struct fer_publisher *p, struct fer_pool *pool, const struct fer_outcome *o,
                     const float *act, uint64_t mark)
{
    int32_t slot;

    if (fer_pool_hold(pool, (const uint8_t *)o->session_id, o->session_id_len, o->sequence,
                      o->deadline_ros_ns, mark, mono_ns(), &slot) != FER_POOL_HOLD_WAIT) {
        __atomic_store_n(&p->surrendered, p->surrendered + 1, __ATOMIC_RELAXED);
        return;
    }
    p->held[slot] = *o;
    if (o->has_actions)
        memcpy(&p->held_actions[(size_t)slot * p->action_len], act,
               (size_t)p->action_len * sizeof(float));
    p->mine[slot] = 1;
    p->n_held++;
}

/* The held outcomes: an answered one is dropped, a due one published, as EXPIRED when its
 * deadline has passed (never a late INFERENCE). At stop (now UINT64_MAX) every one is due but
 * an answered one: nothing held outlives the loop unanswered (docs/design.md §13.2). */
static void release_held(struct fer_publisher *p, struct fer_pool *pool,
                         fer_rcl_publish_fn publish, const void *rcl_publisher,
                         fer_rcl_reset_error_fn reset_error, uint64_t now)
{
    int32_t s;

    for (s = 0; s < FER_POOL_HOLD_MAX && p->n_held > 0; s++) {
        struct fer_outcome *o = &p->held[s];
        int st;

        if (!p->mine[s])
            continue;
        st = fer_pool_held(pool, s, now);
        if (st == FER_POOL_HOLD_WAIT)
            continue;
        p->mine[s] = 0;
        p->n_held--;
        if (st != FER_POOL_HOLD_DUE) {
            __atomic_store_n(&p->surrendered, p->surrendered + 1, __ATOMIC_RELAXED);
            continue; /* another member answered it */
        }
        if (o->code == FER_INFERENCE && o->deadline_ros_ns != 0 &&
            (uint64_t)realtime_ns() >= o->deadline_ros_ns) {
            o->code = FER_EXPIRED;
            o->has_actions = 0;
        }
        publish_one(p, o, &p->held_actions[(size_t)s * p->action_len], publish, rcl_publisher,
                    reset_error);
        __atomic_store_n(&p->held_published, p->held_published + 1, __ATOMIC_RELAXED);
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
        if (p->n_held > 0) {
            struct fer_pool *pool = __atomic_load_n(&p->pool, __ATOMIC_ACQUIRE);

            if (pool)
                release_held(p, pool, publish, rcl_publisher, reset_error, mono_ns());
        }
        while ((n = fer_core_pop_outcomes(p->core, p->outcomes, p->actions,
                                          FER_PUBLISH_BATCH)) > 0) {
            /* a pool member's own stall, found here if this thread runs first after it */
            struct fer_pool *pool = __atomic_load_n(&p->pool, __ATOMIC_ACQUIRE);
            uint64_t mark = pool ? fer_pool_stall_check(pool, mono_ns()) : 0;

            for (i = 0; i < n; i++) {
                if (pool && p->outcomes[i].arrival_ns < mark) {
                    /* the others may have taken it over: held until an answer or due */
                    hold_one(p, pool, &p->outcomes[i], &p->actions[(size_t)i * p->action_len],
                             mark);
                    continue;
                }
                publish_one(p, &p->outcomes[i], &p->actions[(size_t)i * p->action_len],
                            publish, rcl_publisher, reset_error);
            }
        }
        if (stopping) {
            /* the last pass: what is still held is answered now, or dropped if answered */
            struct fer_pool *pool = __atomic_load_n(&p->pool, __ATOMIC_ACQUIRE);

            if (pool && p->n_held > 0)
                release_held(p, pool, publish, rcl_publisher, reset_error, UINT64_MAX);
            return FER_OK;
        }
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

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_publish.h - the publisher thread's loop in C: outcome rings -> ActionMessage (the struct
 * generated from msg/ActionMessage.msg) -> rcl_publish, without the Python interpreter.
 *
 * Why: with the loop in Python, every answer waited for the GIL after its doorbell woke the
 * publisher thread, behind the request thread and the 10 Hz stats timer. A light-load trace
 * (1,000 sequential requests, relay in its own process) put the slowest 1% of requests' median
 * wait from finish to publish at 1.16 ms (0.15 ms with the stats timer at 0.1 Hz): most of what
 * the relay added on top of the echo floor at p99. Here the answer is out before the thread
 * would ever need the GIL.
 *
 * The message: flowedge_relay_msgs__msg__ActionMessage, the generated C struct, filled in place for
 * each answer: its strings point at the publisher's own NUL-terminated copies and its actions at
 * the popped outcome's floats, so nothing is allocated; rcl_publish hands it to the middleware,
 * which serializes it with the message's own type support (docs/design.md, "The wire format";
 * test/test_wire.py compares every field with rclpy's serialization of the Python publisher's
 * message). The relay's own fields (model digest and dims) are fixed at create; header.stamp is
 * CLOCK_REALTIME at publish (the node's clock when use_sim_time is off; the relay keeps the
 * Python loop when it is on); frame_id is empty, as the Python publisher leaves it.
 *
 * Same rules as fer.h: read verbatim into the cdef (after fer.h and fer_rcl.h), so declarations
 * and plain integer #defines only.
 * Threads: a publisher belongs to the core's one publisher thread (the consumer of every outcome
 * ring). pause / stop may be set by any thread (relaxed atomic loads here); latency_ms and
 * latency_count are written only by fer_publish_run and may be read by any thread.
 */

#define FER_LATENCY_WINDOW 4096      /* INFERENCE latencies kept (finish - arrival, ms) */
#define FER_PUBLISH_BATCH 64         /* outcomes popped per ring pass */

/* The rcl functions it calls (fer_rcl_publish_fn: rcl_publish; fer_rcl_reset_error_fn) are in
 * fer_rcl.h. */

/*
 * Invariants: core outlives the publisher; digest_len <= FER_DIGEST_MAX; latency_ms[k] for
 * k < min(latency_count, FER_LATENCY_WINDOW) are samples (slot latency_count % window is written
 * next); published + failed = outcomes handed to rcl; outcomes / actions hold FER_PUBLISH_BATCH
 * records and msg the generated message with its strings, allocated at create. The fields from `core` on are the
 * publisher's own: only fer_publish_run and fer_action_cdr read them.
 */
#define FER_DIGEST_MAX 256
struct fer_publisher {
    uint32_t pause;                      /* DRILLS: nonzero = leave the rings alone */
    uint32_t stop;                       /* nonzero = drain once more, then return */
    uint64_t published;
    uint64_t failed;                     /* rcl refused (e.g. the context was shut down) */
    int32_t last_error;                  /* rcl's return code of the last failure */
    uint64_t latency_count;
    double latency_ms[FER_LATENCY_WINDOW];
    struct fer_core *core;
    uint32_t action_len;                 /* the core's, fixed at create */
    uint32_t observation_dim, action_dim, action_horizon;
    uint32_t digest_len;
    char digest[FER_DIGEST_MAX];
    struct fer_outcome *outcomes;
    float *actions;
    void *msg;                           /* the ActionMessage filled per answer (fer_publish.c) */
    uint64_t cdr_cap;                    /* a bound on one answer's CDR (fer_action_cdr_max) */
    struct fer_pool *pool;               /* relay_id and pool_epoch of answers, and the own-stall
                                          * watermark (fer_pool_stall_check); NULL: "" and 0 */
    uint64_t surrendered;                /* outcomes held by the watermark and then dropped
                                          * (answered by another member, or no slot left) */
    /* Outcomes held after an own stall (fer_pool_hold), by the pool's slot: held[slot] and its
     * actions (action_len floats from held_actions + slot x action_len) while mine[slot]; made
     * by the first fer_publisher_set_pool with a pool (NULL outside a pool). */
    struct fer_outcome *held;
    float *held_actions;
    uint8_t *mine;
    uint32_t n_held;
    uint64_t held_published;             /* held outcomes published when due (EXPIRED if late) */
};

/* create: the relay's fixed message fields and every buffer (one batch of outcomes and their
 *   actions, one serialized message). FER_OK and *out, FER_EINVAL (NULL core or out, digest_len
 *   > FER_DIGEST_MAX, digest NULL with digest_len > 0), or FER_ENOMEM.
 * destroy: frees what create allocated; accepts NULL. */
int fer_publisher_create(struct fer_core *core, const char *digest, uint32_t digest_len,
                         uint32_t observation_dim, uint32_t action_dim, uint32_t action_horizon,
                         struct fer_publisher **out);
void fer_publisher_destroy(struct fer_publisher *p);

/*
 * The publisher thread's loop. Repeats until stop was set when a pass began: unless paused,
 * wait up to wait_ns for an outcome (fer_core_wait_outputs), then pop every outcome there is and
 * publish each (the generated ActionMessage filled, stamped now, then publish(rcl_publisher,
 * &message, NULL): rcl_publish); an INFERENCE
 * answer adds its latency to the window. A failed publish is counted (failed, last_error),
 * reset_error (if not NULL) clears rcl's error state, and the loop goes on: the next outcome is
 * still published. Returns FER_OK, or FER_EINVAL (NULL argument). Allocates nothing.
 */
int fer_publish_run(struct fer_publisher *p, fer_rcl_publish_fn publish,
                    const void *rcl_publisher, fer_rcl_reset_error_fn reset_error,
                    uint64_t wait_ns);

/*
 * One outcome as the ActionMessage's CDR bytes into buf[0..cap): the message the loop publishes,
 * serialized by rmw_serialize (fer_wire_set_serializer; for tests and tools),
 * header.stamp = stamp_ns (ROS time, saturated as timebase.ros_time: <= 0 is the zero stamp, past
 * int32 seconds the latest); actions = action_len floats if o->has_actions, else none. Returns the
 * byte count, or 0 if cap is too small (fer_action_cdr_max says how much is enough), no
 * serializer is set or an argument is NULL.
 */
uint64_t fer_action_cdr(const struct fer_publisher *p, const struct fer_outcome *o,
                        const float *actions, int64_t stamp_ns, uint8_t *buf, uint64_t cap);
uint64_t fer_action_cdr_max(const struct fer_publisher *p);

/* A relay pool's member (fer_pool.h): from the next answer on, ActionMessage.relay_id and
 * pool_epoch are the pool's (NULL: "" and 0, a relay outside a pool), and before each batch of
 * outcomes the loop runs the pool's stall check: an outcome of a request that arrived before
 * the own-stall watermark is held (fer_pool_hold), not published: dropped when another
 * member's answer names it, counted surrendered (in the pool, and in `surrendered` here: the
 * others took it over), published when due with no such answer (the others did not: they
 * stalled too), as EXPIRED if its deadline has passed (held_published); with every hold slot
 * used it is dropped (hold_full). Each pass looks at the held ones (docs/design.md §13.2).
 * The first pool set makes the hold's buffers (FER_POOL_HOLD_MAX outcomes and their actions;
 * FER_ENOMEM), so set it before fer_publish_run; a relay outside a pool never has them. Any
 * thread; the pool outlives the publisher. FER_OK, FER_EINVAL, FER_ENOMEM. */
int fer_publisher_set_pool(struct fer_publisher *p, struct fer_pool *pool);

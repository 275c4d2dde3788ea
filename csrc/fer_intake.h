/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_intake.h - the request intake in C: take each InferenceRequest's CDR bytes from the rcl
 * subscription, parse them, validate, convert the clocks and submit to the core, all without the
 * Python interpreter.
 *
 * Why: with the intake in rclpy, the GIL sat on the path of every admission decision (about 31 us
 * for rclpy's take and 30-34 us for the callback per message), it inherits no priority, and a
 * producer's full publish rate outran it. Here a real-time intake thread decides in C; Python
 * keeps parameters, diagnostics and setup (flowedge_relay/intake.py).
 *
 * What it decides is exactly what flowedge_relay/validation.py and policy intake decide, in the
 * same order (docs/design.md §3, §4): test/test_intake.py checks the two give the same decision
 * for every message of the stress campaign's corpus, invalid ones included. Tensors of a policy
 * package are checked and copied, normalized, straight into the core's staging slot, as
 * policy intake does (same float32 arithmetic: scale, then offset, each rounded).
 *
 * The wait and the take are fer_take.c's: the middleware rings an eventfd from one of its threads
 * (rcl's on-new-message callback), the intake thread polls it and takes each message's CDR
 * bytes; no lock is shared with the middleware's threads.
 *
 * Same rules as fer.h: read verbatim into the cdef (after fer_rcl.h), so declarations and plain
 * integer #defines only. Threads: one intake thread runs fer_intake_loop_run and decides through
 * the intake it is routed to (that intake's core's one submit producer while it runs);
 * fer_intake_decide is for a thread that holds that role instead (tests, the bench); routing,
 * stop, pause and the counters are for any thread.
 */

#define FER_INTAKE_INPUTS_MAX 16      /* declared inputs of a package the C intake serves */
#define FER_INTAKE_NAME_MAX 64        /* bytes of an input name */
#define FER_INTAKE_NDIM_MAX 8         /* dimensions of an input (without batch) */
#define FER_INTAKE_DIGEST_MAX 80      /* validation.MODEL_DIGEST_MAX_CHARS */
#define FER_INTAKE_OBSERVATION_MAX 65536 /* validation.OBSERVATION_MAX_LEN */
/* The serialized buffer holds max_request_bytes plus this much for everything else (the strings,
 * an observation of FER_INTAKE_OBSERVATION_MAX floats): a larger message is request_too_large
 * before it is parsed. */
#define FER_INTAKE_SLACK_BYTES 2097152

/* Why a request was discarded: validation.Reason, in this order (fer_intake_reason_name gives the
 * diagnostics key). FER_REASON_NONE: valid. */
#define FER_REASON_NONE 0
#define FER_REASON_MODEL_UNAVAILABLE 1
#define FER_REASON_SESSION_ID_EMPTY 2
#define FER_REASON_SESSION_ID_TOO_LONG 3
#define FER_REASON_DIGEST_MISMATCH 4
#define FER_REASON_DIMS_MISMATCH 5
#define FER_REASON_OBSERVATION_LENGTH 6
#define FER_REASON_OBSERVATION_NOT_FINITE 7
#define FER_REASON_NFE_ZERO 8
#define FER_REASON_NFE_ABOVE_MAX 9
#define FER_REASON_RETRY_REASON_UNKNOWN 10
#define FER_REASON_TIME_INVALID 11
#define FER_REASON_CORE_REFUSED 12
#define FER_REASON_INPUT_MISSING 13
#define FER_REASON_INPUT_UNEXPECTED 14
#define FER_REASON_INPUT_DUPLICATE 15
#define FER_REASON_INPUT_DTYPE 16
#define FER_REASON_INPUT_SHAPE 17
#define FER_REASON_INPUT_BYTES 18
#define FER_REASON_INPUT_NOT_FINITE 19
#define FER_REASON_INPUT_BOOL_VALUE 20
#define FER_REASON_REQUEST_TOO_LARGE 21
#define FER_REASON_REQUEST_MALFORMED 22 /* CDR bytes that are not an InferenceRequest */
/* real-time chunking's prefix (docs/design.md §5.4) */
#define FER_REASON_PREFIX_UNSUPPORTED 23 /* a prefix, and the model's rtc_mode resolves to off */
#define FER_REASON_PREFIX_SHAPE 24       /* not whole rows of action_dim, or above the horizon */
#define FER_REASON_ACTION_PERIOD 25      /* a prefix without a positive, valid action_period */
#define FER_REASON_PREFIX_NOT_FINITE 26
#define FER_REASON_CLIENT_ID_TOO_LONG 27 /* §7.1: client_id over FER_SESSION_ID_MAX bytes */
#define FER_REASONS 28

/* Tensor.dtype codes (msg/Tensor.msg) */
#define FER_DTYPE_FLOAT32 0
#define FER_DTYPE_UINT8 1
#define FER_DTYPE_INT64 2
#define FER_DTYPE_INT32 3
#define FER_DTYPE_FLOAT16 4
#define FER_DTYPE_BOOL 5

/* One declared input of a policy package: what a request's tensor must be, and where its
 * (normalized) values go in the slot payload. scale / shift are count floats each (the
 * normalization broadcast to the input's shape), or both NULL for a copy of the wire bytes. They
 * are the caller's and must outlive the intake. */
struct fer_input_spec {
    char name[FER_INTAKE_NAME_MAX];
    uint32_t name_len;
    uint32_t dtype;
    uint32_t ndim;
    uint32_t shape[FER_INTAKE_NDIM_MAX];
    uint64_t count;                      /* prod(shape) elements */
    uint64_t offset;                     /* bytes into the slot payload */
    const float *scale;
    const float *shift;
};

/* What a request must match (validation.ModelContract and the limits). n_inputs 0: a
 * single-vector model (the observation field); else a package served through `inputs`. */
struct fer_intake_config {
    uint32_t model_ok;                   /* 0: every request is model_unavailable */
    uint32_t digest_len;
    char digest[FER_INTAKE_DIGEST_MAX];
    uint32_t observation_dim;
    uint32_t action_dim;
    uint32_t action_horizon;
    uint32_t max_nfe;
    uint64_t max_request_bytes;
    uint32_t n_inputs;
    struct fer_input_spec inputs[FER_INTAKE_INPUTS_MAX];
    uint32_t rtc;                        /* 1: a prefix is taken (rtc_mode not off) */
    uint32_t _pad;
    uint64_t prefix_offset;              /* bytes into the slot payload: action_horizon x
                                          * action_dim floats, the prefix's rows */
};

/* Counted by the intake thread (the one writer); any thread may read them (relaxed, each field
 * one aligned word: a reader sees a value that was current, never a torn one). */
struct fer_intake_counters {
    uint64_t received;                   /* messages taken (or handed to decide) */
    uint64_t deadlines_seen;             /* of those, valid ones that carried a deadline */
    uint64_t discarded[FER_REASONS];     /* by reason ([0] unused) */
    uint64_t decided[8];                 /* valid ones by fer_core_submit's decision */
};

struct fer_intake;
struct fer_pool;                      /* fer_pool.h */

/* fer_intake_decide's *decision for a request a pool member does not decide (fer_pool.h): after
 * the core's decisions (0..FER_COALESCED), never counted in decided[]. */
#define FER_INTAKE_NOT_OWNER 8        /* another member owns it: dropped before any copy */
#define FER_INTAKE_STANDBY 9          /* another member owns it, this one is its successor: kept
                                       * (or, after its own stall, held: fer_pool_standby_hold) */

/* create: checks cfg (digest_len <= FER_INTAKE_DIGEST_MAX, n_inputs <= FER_INTAKE_INPUTS_MAX,
 *   each spec's name_len, ndim, dtype, and offset + count x model itemsize within the core's
 *   payload_bytes) and allocates everything the intake will use. FER_OK and *out, FER_EINVAL,
 *   or FER_ENOMEM.
 * destroy: frees it; accepts NULL. Not while a loop is routed to it. */
int fer_intake_create(struct fer_core *core, const struct fer_intake_config *cfg,
                      struct fer_intake **out);
void fer_intake_destroy(struct fer_intake *in);

/*
 * One message: parse the CDR bytes, validate them against the config in validation.py's order,
 * copy a package's tensors into the core's staging slot, convert the stamps with (now_mono,
 * now_ros) as timebase.py does, and submit. Returns the discard reason (FER_REASON_*, counted),
 * FER_REASON_NONE with *decision = fer_core_submit's decision, or FER_EINVAL for a NULL
 * argument. Call it only from the thread that is the core's submit producer.
 */
int fer_intake_decide(struct fer_intake *in, const uint8_t *cdr, uint64_t len,
                      uint64_t now_mono, int64_t now_ros, int32_t *decision);

/*
 * The intake thread's loop (fer_take_run over n_subscriptions, at most 16, rcl subscriptions),
 * apart from the intakes that decide: it takes every waiting message into its buffer
 * (max_request_bytes + FER_INTAKE_SLACK_BYTES; a larger message is request_too_large) and hands
 * it, stamped with the clocks at take (CLOCK_MONOTONIC; CLOCK_REALTIME, the ROS clock with
 * use_sim_time off), to the intake `route` names: a model swap (docs/design.md §9) switches the
 * core requests go to between two messages, on the one thread that takes them.
 * create: FER_OK and *out, FER_EINVAL, FER_ENOMEM or FER_ESYS. destroy: not while run runs.
 * route: any thread; NULL drops what is taken (counted, unrouted). An intake routed to must live
 *   until routed away and one more message's decision, or the loop stopped.
 * run: until stop. FER_OK; FER_EINVAL; FER_ENOTSUP if the middleware refuses the on-new-message
 *   callback (nothing was taken: use the rclpy intake). Allocates nothing (rmw does, for a
 *   message over the buffer, given back at once).
 * stop, pause (drills and tests: take nothing while paused), rearm (clear a stop): any thread.
 */
struct fer_intake_loop;
int fer_intake_loop_create(uint64_t max_request_bytes, struct fer_intake_loop **out);
void fer_intake_loop_destroy(struct fer_intake_loop *loop);
int fer_intake_loop_route(struct fer_intake_loop *loop, struct fer_intake *in);
int fer_intake_loop_run(struct fer_intake_loop *loop, const struct fer_rcl_take *rcl,
                        void *const *subscriptions, uint32_t n_subscriptions, uint64_t wait_ns);
void fer_intake_loop_stop(struct fer_intake_loop *loop);
void fer_intake_loop_pause(struct fer_intake_loop *loop, uint32_t paused);
void fer_intake_loop_rearm(struct fer_intake_loop *loop);
const struct fer_take_counters *fer_intake_loop_counters(const struct fer_intake_loop *loop);
uint64_t fer_intake_loop_unrouted(const struct fer_intake_loop *loop);

struct fer_intake_counters *fer_intake_counters(struct fer_intake *in);
/* The diagnostics key of reason r (validation.Reason's value), or "" outside 1..FER_REASONS-1. */
const char *fer_intake_reason_name(uint32_t r);

/* The request as the intake reads it (struct fer_request_view, fer_request_parse) is in
 * fer_wire.h. */

/*
 * A relay pool (fer_pool.h; docs/design.md §13). set_pool: every request decide takes from then
 *   on is first checked for ownership, right after the header fields are parsed and before any
 *   copy: FER_REASON_NONE with *decision FER_INTAKE_NOT_OWNER or FER_INTAKE_STANDBY when another
 *   member owns it; with spill on (fer_pool_set_spill), *decision FER_SPILLED when this owner
 *   handed it to its successor (fer_pool_spill_out) instead of answering REJECTED_CAPACITY.
 *   NULL (the default) is today's intake. Set it before the intake is routed to; the pool
 *   outlives the intake.
 * pool_service: the deciding thread: run the takeovers posted with fer_pool_takeover (every
 *   standby entry of a dead owner decided as an arrival, its arrival time kept: an unset
 *   origin_stamp ages from it; a request past its deadline is answered EXPIRED), then the
 *   handovers to this member (fer_pool_spill_in: each request decided as an arrival, never
 *   spilled again), then drop expired standby entries. Returns the requests re-decided (>= 0), FER_EINVAL. The intake loop
 *   calls it on every pass with a pool set; tests and the bench call it themselves.
 * loop_set_pool: the loop's pool, before run: subscriptions at index >= answers_from carry
 *   flowedge/actions (fer_pool_answer), the rest requests; the loop is woken by
 *   fer_pool_takeover and fer_pool_spill_in and serves the pool through the intake it is routed to. NULL: none.
 */
int fer_intake_set_pool(struct fer_intake *in, struct fer_pool *pool);
int fer_intake_pool_service(struct fer_intake *in, uint64_t now_mono, int64_t now_ros);
int fer_intake_loop_set_pool(struct fer_intake_loop *loop, struct fer_pool *pool,
                             uint32_t answers_from);


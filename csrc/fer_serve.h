/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_serve.h - a worker's whole request cycle in C: wait for work, take it
 * into a free batch row (its noise, time grid and inputs), the two-phase prefix pass, the steps
 * (fer_exec_run), and the answer (actions into the outcome ring), without the Python interpreter.
 *
 * Why: fer_exec_run already runs the NFEs without the GIL, but each request still crossed into
 * Python four times (wake-up, dispatch and row set-up with numpy's noise draw, finish, leave).
 * Each crossing waited for the GIL behind the request thread and the publisher (the queue
 * wake-up p99 of bench overhead, 0.4-0.9 ms), and at B = 8 under overload the worker's Python per
 * request competed with the request thread for the same two cores. fer_serve_run returns to
 * Python only to stop, after an idle wait, or on an error.
 *
 * What a row is (the layout of batch.BatchRows): rows 0..n-1 hold the worker's requests, in
 * join order until a leave moves the last row into the freed one. The caller owns every row
 * buffer (x, state, the step graph's static inputs, the prefix inputs) and the fer_exec_row table;
 * fer_serve only knows where they are (its config) and fills / compacts them as BatchRows.join /
 * leave do, so the Python loop and this one produce bit-identical rows:
 *   x(0)   fer_noise_fill(noise_seed) into the state row, copied to the x row;
 *   plan   fer_plan_fill (model.integrator_plan in C, the same float32 values);
 *   inputs a single .onnx model's observation is dispatched straight into its row of the
 *          observation buffer; a policy package's tensors are copied from the dispatched slot's
 *          payload (the request thread normalized them there) into their rows;
 *   RTC    frozen rows (fer_work.frozen_rows) point the row at the slot payload's prefix, which
 *          stays valid until the lane finishes; inpaint keeps x(0) and the landing times;
 *   actions state values picked by action_index and, for a normalized action, (v - offset) /
 *          scale in float32 (policy.Normalization.invert's two operations).
 *
 * Same rules as fer.h: read verbatim into the cdef (after fer.h, fer_exec.h and fer_pass.h, which
 * it uses), so declarations and plain integer #defines only.
 * Threads: a serve belongs to one worker thread, with the exec (and pass) it was made over;
 * nothing else may call those while fer_serve_run runs. It writes the counters its config names
 * with relaxed atomic stores, so other threads may read them at any time.
 */

#define FER_SERVE_MAX_MOVES 40      /* per-row buffers a leave compacts */
#define FER_SERVE_MAX_COPIES 32     /* payload tensors copied into rows at a join */

/* ---- solvers (flowedge_relay/model.py SOLVERS) ------------------------------------------------ */
#define FER_SERVE_EULER 0
#define FER_SERVE_MIDPOINT 1

/* ---- why fer_serve_run returned (>= 0; fer_exec_run's FER_EXEC_STOPPED too) ------------------ */
#define FER_SERVE_IDLE 5            /* no row held and no work came within wait_timeout_ns */

/* A [max_rows, ...] buffer: row r at data + r x row_bytes. */
struct fer_serve_rowbuf {
    void *data;
    uint64_t row_bytes;
};

/* At a join, payload bytes [payload_offset, payload_offset + row_bytes) of the dispatched slot go
 * to row r of `to`. */
struct fer_serve_copy {
    struct fer_serve_rowbuf to;
    uint64_t payload_offset;
};

/*
 * Invariants (checked by fer_serve_create): worker < the core's workers and max_rows = the
 * exec's max_rows = the core's batch_slots (checked at run); 1 <= max_nfe; solver a
 * FER_SERVE_*; sign +1 or -1; x and state hold max_rows x x_len floats (the exec's); observation
 * is NULL or holds max_rows x obs_dim floats; n_moves <= FER_SERVE_MAX_MOVES, n_copies <=
 * FER_SERVE_MAX_COPIES; every action_index < x_len; action_offset and action_scale both NULL or
 * both n_actions floats; n_actions = the core's action_len; every counter pointer non-NULL,
 * prefix_ring of prefix_ring_len >= 1 entries. Buffers outlive the serve.
 */
struct fer_serve_config {
    uint32_t worker;
    uint32_t max_rows;
    uint32_t max_nfe;                    /* the core's max_nfe: the longest plan */
    uint32_t solver;
    int32_t sign;                        /* +1: t from 0 to 1; -1: t from 1 to 0 */
    uint32_t x_len;                      /* floats of x and of the state, per row */
    uint32_t obs_dim;                    /* the core's obs_dim (what dispatch copies out) */
    uint32_t n_moves;
    uint32_t n_copies;
    uint32_t n_actions;
    float *x;
    float *state;
    float *observation;                  /* rows of the observation input, or NULL (packages) */
    struct fer_serve_rowbuf moves[FER_SERVE_MAX_MOVES]; /* x, state, static inputs */
    struct fer_serve_copy copies[FER_SERVE_MAX_COPIES];
    const uint32_t *action_index;        /* n_actions state indices */
    const float *action_offset;          /* n_actions, or NULL: no de-normalization */
    const float *action_scale;
    uint64_t output_wait_ns;             /* how long a finish waits for ring space */
    uint64_t wait_timeout_ns;            /* an idle wait this long returns FER_SERVE_IDLE */
    uint64_t *rows_held;                 /* n, after every change */
    int64_t *prefix_ring;                /* one entry per prefix pass: its duration */
    uint64_t prefix_ring_len;
    uint64_t *prefix_count;              /* prefix passes measured */
    /* Real-time chunking (docs/design.md §5.4), the exec's rtc_mode (FER_EXEC_RTC_OFF: none): a
     * joiner with frozen rows gets its prefix from the dispatched slot's payload at
     * prefix_offset, its initial noise kept (inpaint) and its update's landing times. */
    uint32_t rtc_mode;
    float clean_time;                    /* the exec's: 1 (time 0_to_1) or 0 */
    uint64_t prefix_offset;
};

struct fer_serve;

/* create: validates cfg and allocates every plan buffer (max_rows x max_nfe times and kinds) and
 *   scratch the serve will use; rows is the caller's fer_exec_row[max_rows] table (fer_serve owns
 *   its contents from now on), pass NULL for a single-graph model. FER_OK and *out, or FER_EINVAL
 *   (bad cfg, *out = NULL) or FER_ENOMEM.
 * destroy: frees what create allocated; accepts NULL. */
int fer_serve_create(const struct fer_serve_config *cfg, struct fer_exec *exec,
                     struct fer_pass *pass, struct fer_exec_row *rows, struct fer_serve **out);
void fer_serve_destroy(struct fer_serve *serve);

/*
 * The worker loop. Repeats, until it returns:
 *   if *stop_flag: return FER_EXEC_STOPPED (rows stay held: the caller disables their lanes);
 *   no row held: fer_core_worker_wait(wait_timeout_ns); nothing came: return FER_SERVE_IDLE;
 *   a step boundary: while a row is free and fer_core_dispatch_worker gives work, join it into
 *     row n (x(0), plan, inputs; last_progress_ns = now); two-phase: fer_pass_run_done over the
 *     joiners (prefix_ring, prefix_count), joiners the core stopped leave;
 *   fer_exec_run(FER_EXEC_JOIN) over the rows; then, last row first, a row whose result is
 *     FER_STEP_DONE is answered (its actions, after waiting up to output_wait_ns for ring space,
 *     fer_core_finish, or fer_core_fail(FER_FAIL_NON_FINITE) when a float is not finite: a full
 *     ring is a counted drop) and leaves; STOP_* rows leave (the core emitted their outcome).
 * A model call that fails (FER_EXEC_EORT: see fer_exec_last_error / fer_pass_last_error) ends
 * the rows of that call (a step: every row; a prefix pass: its joiners) with
 * fer_core_fail(FER_FAIL_RUNTIME_ERROR), lets them go, and returns FER_EXEC_EORT.
 * Other errors (< 0) return at once with the rows as they are: a core call's.
 * Allocates nothing; sleeps only in the core's wait, the ring-space wait and the fault delay.
 */
int fer_serve_run(struct fer_serve *serve, struct fer_core *core, const uint32_t *stop_flag,
                  const uint64_t *fault_delay_ns, const struct fer_exec_report *report);

/* Rows held now (0..max_rows); 0 for NULL. */
uint32_t fer_serve_rows(const struct fer_serve *serve);

/*
 * model.integrator_plan in C: for total NFE `total` (>= 1) of `solver` (FER_SERVE_*) in
 * direction sign (+1 / -1), times[0..total) (float32), kinds[0..total) (FER_EXEC_EULER /
 * MID_HALF / MID_FULL), dt_out = float32(1 / K) x sign and half_dt_out = float32(dt / 2), where
 * K = total (euler) or ceil(total / 2) (midpoint), each value rounded exactly as numpy rounds it
 * (float64 times j / K then float32; for sign -1, float32(1) - time in float32). FER_OK or
 * FER_EINVAL (NULL pointer, total 0, bad solver or sign).
 */
int fer_plan_fill(uint32_t solver, int32_t sign, uint32_t total, float *times, int8_t *kinds,
                  float *dt_out, float *half_dt_out);

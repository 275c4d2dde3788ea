/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_exec.h - the native NFE loop: a worker's solver steps run in C, calling ONNX
 * Runtime's C API and fer_core_step, so an NFE never waits for the Python GIL.
 *
 * What it is for: between two Python calls a worker can run every NFE of its work; CFFI releases
 * the GIL for the whole fer_exec_run call, so the request thread, the publisher and the timers
 * cannot delay a step, and a step cannot delay them. The prefix pass of a two-phase policy runs
 * natively too (fer_pass.h: one ORT Run over the joining rows, GIL released); the rest of a
 * request's cycle (wait, dispatch, noise, finish) is fer_serve.h's, over an exec and a pass.
 *
 * ONNX Runtime is not linked: fer_exec_create dlopen()s the shared library it is given (the
 * onnxruntime wheel's libonnxruntime.so.*, RTLD_LOCAL) and takes the C API table from
 * OrtGetApiBase (csrc/fer_ort.c, which the pass shares). Without that library the core builds and
 * runs as before; only fer_exec_create fails (FER_EXEC_ELIB), and the worker keeps its Python
 * loop.
 *
 * Rows (for step-level batching): one exec runs up to max_rows requests at once, row r
 * being row r of every tensor ([n_rows, ...] on the batch axis). Each step is one ORT Run over
 * n_rows rows, then per row the solver update and one fer_core_step on the row's lane.
 *
 * Buffers: the caller owns every tensor buffer (x, t, v, the static inputs, the solver state) and
 * passes them to fer_exec_create; the OrtValues over them are made there, one set per row count
 * 1..max_rows, so fer_exec_run allocates nothing. The caller writes a row's state, x, static
 * inputs and plan before the run that uses them (row setup, once per request) and reads the state
 * after it; fer_exec_run reads and writes them only while it runs.
 *
 * Same rules as fer.h: read verbatim into the cdef by flowedge_relay/_build_core.py (after fer.h
 * and fer_tensor.h, which it uses), so cdef-parsable: declarations and plain integer #defines only.
 * Threads: one exec belongs to one worker thread; fer_exec_run on it is never concurrent with
 * another call on the same exec. Different execs are independent.
 */

#define FER_EXEC_MAX_STATIC 16      /* static inputs (observation, declared inputs, context) */
#define FER_EXEC_MAX_ROWS 256

/* ---- per-NFE solver kinds (flowedge_relay/model.py solver_plan) ------------------------------ */
#define FER_EXEC_EULER 0            /* state += dt * v; x = state */
#define FER_EXEC_MID_HALF 1         /* x = state + half_dt * v; state unchanged */
#define FER_EXEC_MID_FULL 2         /* state += dt * v; x = state (the midpoint's second NFE) */

/* ---- real-time chunking (docs/design.md §5.4): how a row's frozen rows condition its solver --- */
#define FER_EXEC_RTC_OFF 0
#define FER_EXEC_RTC_TRAINING_TIME 1 /* before each NFE: frozen rows = prefix, their time clean */
#define FER_EXEC_RTC_INPAINT 2       /* after each update: frozen rows = (1-t) x0 + t prefix */

/* ---- why fer_exec_run returned (>= 0) --------------------------------------------------------- */
#define FER_EXEC_ROWS_ENDED 1       /* some row's step result is not CONTINUE (see rows[].result) */
#define FER_EXEC_STOPPED 2          /* *stop_flag was non-zero at a step boundary */
#define FER_EXEC_YIELDED 3          /* FER_EXEC_ONE_STEP: one step ran, every row continues */
#define FER_EXEC_JOINABLE 4         /* FER_EXEC_JOIN: a step ran, a free row could take queued work */

/* ---- fer_exec_run flags --------------------------------------------------------------------- */
#define FER_EXEC_ONE_STEP 1         /* return after every step (the caller decides what next) */
#define FER_EXEC_JOIN 2             /* return at a step boundary where a free row could take work */

/*
 * What fer_exec_create builds. Invariants: 1 <= max_rows <= FER_EXEC_MAX_ROWS; n_static <=
 * FER_EXEC_MAX_STATIC; x and v float32 with the same dims (x_len = prod(dims) floats a row);
 * t float32 with one element a row, or one per action row (t_cols = x_len / action_dim: a graph
 * trained for training-time real-time chunking; each row's time is written to all of them);
 * state float32, max_rows x x_len (the ODE state, which the midpoint's first NFE leaves
 * unchanged while x moves); intra_op_threads >= 1; rtc_mode a FER_EXEC_RTC_*, and with a mode
 * or a per-action-row t, action_dim >= 1 dividing x_len and clean_time 1 (time 0_to_1) or 0.
 * Session options are the Python path's (model._session_options): intra_op_threads, inter-op 1,
 * sequential, ORT_ENABLE_ALL, log severity 3, and with intra_op_threads > 1 no pool spinning and,
 * where intra_op_affinities is not NULL or "", that string as session.intra_op_thread_affinities
 * (realtime.intra_op_affinities: one CPU per pool thread); CPU execution provider only. Same
 * options, same library version: bit-identical velocities.
 */
struct fer_exec_config {
    uint32_t max_rows;
    uint32_t intra_op_threads;
    uint32_t n_static;
    uint32_t _pad;
    struct fer_exec_tensor x;            /* model input: the solver's x */
    struct fer_exec_tensor t;            /* model input: the evaluation time of each row */
    struct fer_exec_tensor v;            /* model output: the velocity */
    struct fer_exec_tensor statics[FER_EXEC_MAX_STATIC]; /* other inputs, fixed per request */
    float *state;                        /* max_rows x x_len floats */
    const char *intra_op_affinities;     /* NULL or "": the pool threads inherit the caller's */
    uint32_t rtc_mode;                   /* FER_EXEC_RTC_*: how frozen rows condition a row */
    uint32_t action_dim;                 /* floats per action row (RTC, per-action-row t) */
    float clean_time;                    /* the flow time of a clean action: 1 or 0 */
    uint32_t _pad2;
};

/*
 * One row of a run: which lane it steps and where it is in its time grid.
 * Invariants while it runs: next < total; times and kinds hold total entries (the plan of
 * model.solver_plan for the request's total NFE, time convention applied); dt and half_dt are
 * the float32 values the Python integrator uses (dt signed, half_dt = float32(dt / 2)).
 * fer_exec_run advances next by one per step and sets result to the row's last fer_core_step
 * result (FER_STEP_*; FER_STEP_CONTINUE before its first step).
 * Real-time chunking (docs/design.md §5.4): frozen = d > 0 only on an exec with an rtc_mode, with
 * d x action_dim < x_len; prefix then holds d x action_dim floats, and for inpaint x0 the row's
 * initial noise (x_len floats) and land the flow time each NFE's update lands at (total floats,
 * rtc.landing_times). The conditioning is rtc.py's, operation for operation (-ffp-contract=off):
 *   training_time, before each NFE: state and x's first d rows = prefix; the row's t is clean on
 *     its first d action rows, the solver's time on the others;
 *   inpaint, after each update landing at time t: w = 1 - t; each frozen element of the state =
 *     (w x x0) + (t x prefix) for time 0_to_1, (t x x0) + (w x prefix) for 1_to_0; x = state;
 *   both, after the last NFE: the state's first d rows = prefix (the answer's rows bit for bit).
 * The pointers are the caller's and must stay valid while the row is stepped.
 */
struct fer_exec_row {
    uint32_t lane;
    uint32_t next;
    uint32_t total;
    int32_t result;
    float dt;
    float half_dt;
    const float *times;
    const int8_t *kinds;
    uint32_t frozen;
    uint32_t _pad;
    const float *prefix;
    const float *x0;
    const float *land;
};

/*
 * Where fer_exec_run reports what it measured, all caller-owned.
 * nfe_ring: ring_len int64 slots, one per step: the k-th step measured (counting *step_count
 *   before the call as k = 0, 1, ...) writes its wall time to nfe_ring[(*step_count) % ring_len]
 *   (each of its rows' NFEs took that long) and, if step_rows is not NULL, its row count to
 *   step_rows[(*step_count) % ring_len]; then *step_count += 1 and *nfe_count += n_rows (one NFE
 *   per row). With one row a step is one NFE, so the ring is the per-NFE ring.
 * last_progress_ns: the monotonic time of the last step's end, written after every step.
 * probe (bench only, may be NULL): probe_rows x 5 x 3 int64, the layout of flowedge_relay_tools/bench/nfe_probe.NfeProbe
 *   (instants nfe_start, run_start, run_end, nfe_end, step_end x clocks monotonic, thread CPU,
 *   run-queue wait read from probe_fd = an open /proc/thread-self/schedstat of the calling
 *   thread, or -1 for 0); row (*probe_count) % probe_rows per step, then *probe_count += 1.
 * Stores to *nfe_count, *step_count and *last_progress_ns are atomic (relaxed), so another thread
 * may read them while the run goes on.
 * cede_ns, cede_every_ns (docs/design.md §5.3; 0 = never): before a step, once cede_every_ns of
 *   compute have passed since the worker last paused (or last was idle for cede_ns), it sleeps
 *   cede_ns, outside the step's timing. cede_state (NULL when it never cedes) is uint64[2]:
 *   [when the current stretch of compute began, lane time ceded: ns x rows held (atomic
 *   store)], kept across runs.
 */
struct fer_exec_report {
    int64_t *nfe_ring;
    uint64_t ring_len;
    uint64_t *nfe_count;
    uint64_t *last_progress_ns;
    uint64_t *step_count;
    int32_t *step_rows;                  /* ring_len entries, or NULL */
    int64_t *probe;
    uint64_t probe_rows;
    uint64_t *probe_count;
    int32_t probe_fd;
    uint32_t _pad;
    uint64_t cede_ns;
    uint64_t cede_every_ns;
    uint64_t *cede_state;
};

struct fer_exec;

/* ---- lifetime --------------------------------------------------------------------------------
 * create: dlopen(lib_path, RTLD_NOW | RTLD_LOCAL), the OrtApi table (API version 13 or later),
 *   an OrtEnv, the session from model[0..model_len) with the options above, and the OrtValues of
 *   cfg's tensors for every row count. FER_OK and *out set; else *out = NULL and FER_EINVAL (bad
 *   cfg), FER_ENOMEM, FER_EXEC_ELIB (no library, no OrtGetApiBase, API too old) or FER_EXEC_EORT
 *   (ORT refused: bad model bytes, unknown input name, ...), with the reason copied into
 *   err[0..err_len) (NUL-terminated, err may be NULL).
 * destroy: releases everything ORT made for the exec (values, session, env reference). The
 *   library stays loaded for the life of the process (no dlclose: ONNX Runtime keeps
 *   thread-local state that must not outlive its code). Accepts NULL.
 * last_error: the message of the exec's last FER_EXEC_EORT ("" if none); valid until the next
 *   call on the exec. */
int fer_exec_create(const char *lib_path, const void *model, uint64_t model_len,
                    const struct fer_exec_config *cfg, struct fer_exec **out, char *err,
                    uint64_t err_len);
void fer_exec_destroy(struct fer_exec *exec);
const char *fer_exec_last_error(const struct fer_exec *exec);
/* The ONNX Runtime version string the exec runs ("1.32.0"); "" for NULL. */
const char *fer_exec_ort_version(const struct fer_exec *exec);

/* ---- the step loop -----------------------------------------------------------------------------
 * Runs steps over rows[0..n_rows) (n_rows <= max_rows), each one:
 *   if *stop_flag != 0: return FER_EXEC_STOPPED (checked before every step, the first included);
 *   t[r] = times[next] for every row (training_time: the frozen rows conditioned, see struct
 *   fer_exec_row); start = now; one ORT Run over n_rows rows (x, t, statics -> v); per row the
 *   solver update of kinds[next] in float32, the operations in the order of
 *   model.FlowIntegrator._advance (compiled with -ffp-contract=off: bit-identical to numpy),
 *   inpaint's projection, and after the last NFE the frozen rows' hold; next += 1; then, if fault_delay_ns is not NULL and *fault_delay_ns is not 0 (read at every
 *   step, so a drill can change it mid-run), sleep that long (counted in the NFE); end = now;
 *   the report's ring entry (end - start, one per step) and per row fer_core_step(core, lane,
 *   end, end - start) -> result; *last_progress_ns = end.
 * It returns FER_EXEC_ROWS_ENDED after the first step where any row's result is not
 * FER_STEP_CONTINUE (rows that continue stay valid for another run), FER_EXEC_YIELDED after
 * one step with FER_EXEC_ONE_STEP in flags, FER_EXEC_JOINABLE after a step (never before the
 * first, so every call makes progress) with FER_EXEC_JOIN in flags when n_rows < max_rows and
 * fer_core_queued(core) > 0 (the queue length read without the core mutex: a hint, so the
 * caller's dispatch may find nothing, or another worker's may take it first; a request queued
 * just after the check joins at a later boundary), or an error: FER_EINVAL (bad arguments, a
 * row with no NFE left, a lane twice), FER_EXEC_EORT (the Run failed; last_error says why; no
 * row advanced), or the negative status fer_core_step returned (FER_ESTATE: the lane had no
 * such work), with that row's result set to it. Never allocates; sleeps only in the fault delay.
 */
int fer_exec_run(struct fer_exec *exec, struct fer_core *core, struct fer_exec_row *rows,
                 uint32_t n_rows, const uint32_t *stop_flag, const uint64_t *fault_delay_ns,
                 uint32_t flags, const struct fer_exec_report *report);

/* BENCH ONLY (flowedge_relay_bench batching: what ONNX Runtime's own batched call allows, the
 * ceiling of any step-level batching around it): `runs` back-to-back ORT Runs over the first
 * n_rows rows of the exec's buffers as they are (x, t and the statics untouched between runs;
 * no solver update, no core), each one timed with CLOCK_MONOTONIC into ns[i]. Same session, same
 * OrtValues as fer_exec_run, so a run here is exactly the call a step makes. FER_OK, FER_EINVAL
 * (exec or ns NULL, n_rows not in 1..max_rows) or FER_EXEC_EORT (a Run failed; last_error says
 * why; ns[i..runs) unset). Allocates nothing itself; never call it while a fer_exec_run on the
 * same exec is in progress. */
int fer_exec_time_runs(struct fer_exec *exec, uint32_t n_rows, uint32_t runs, uint64_t *ns);

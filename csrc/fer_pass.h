/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_pass.h - the native prefix pass of a two-phase package (csrc/fer_pass.c).
 *
 * A graph run once per request, before its steps: a pass is made from a graph with named inputs
 * (the package's request tensors, as row buffers) and named outputs (the context tensors, whose
 * row buffers are the step loop's static inputs), and fer_pass_run runs it over rows
 * [first, first + n) in one ORT Run, the outputs written straight into those rows.
 * Same library loading, session options and results as fer_exec (both are made by fer_ort.c's
 * one create scaffold, so bit-identical to the Python session); the OrtValues of every (first, n)
 * with first + n <= max_rows are made at create (max_rows <= FER_PASS_MAX_ROWS: at most 2080
 * sets), so fer_pass_run allocates nothing on its side.
 *
 * Same rules as fer.h: read verbatim into the cdef by flowedge_relay/_build_core.py (after fer.h
 * and fer_tensor.h, which it uses), so cdef-parsable: declarations and plain integer #defines only.
 * Threads: like an exec, one pass belongs to one worker thread; never two calls on it at once.
 */
#define FER_PASS_MAX_ROWS 64
#define FER_PASS_MAX_TENSORS 16     /* inputs, and outputs, each */

/* Invariants (checked by fer_pass_create): 1 <= max_rows <= FER_PASS_MAX_ROWS;
 * intra_op_threads >= 1; 1 <= n_inputs, n_outputs <= FER_PASS_MAX_TENSORS; every tensor as
 * struct fer_exec_tensor says (max_rows rows in its buffer, which outlives the pass);
 * intra_op_affinities as fer_exec_config's. */
struct fer_pass_config {
    uint32_t max_rows;
    uint32_t intra_op_threads;
    uint32_t n_inputs;
    uint32_t n_outputs;
    struct fer_exec_tensor inputs[FER_PASS_MAX_TENSORS];
    struct fer_exec_tensor outputs[FER_PASS_MAX_TENSORS];
    const char *intra_op_affinities;
};

struct fer_pass;

/* create: as fer_exec_create (same statuses, same err) for a pass; it runs the graph once over
 *   rows [0, 1) and once over [0, max_rows) (proving names and shapes now, taking ORT's first-run
 *   cost here), which writes those rows' outputs.
 * destroy: releases what ORT made for the pass; accepts NULL.
 * last_error: the message of the pass's last FER_EXEC_EORT ("" if none). */
int fer_pass_create(const char *lib_path, const void *model, uint64_t model_len,
                    const struct fer_pass_config *cfg, struct fer_pass **out, char *err,
                    uint64_t err_len);
void fer_pass_destroy(struct fer_pass *pass);
const char *fer_pass_last_error(const struct fer_pass *pass);

/* One ORT Run of the graph over rows [first, first + n_rows): reads those rows of the inputs,
 * writes those rows of the outputs, no other row. FER_OK, FER_EINVAL (pass NULL, n_rows 0,
 * first + n_rows > max_rows) or FER_EXEC_EORT (last_error says why). Allocates nothing itself
 * (ONNX Runtime may, inside Run). */
int fer_pass_run(struct fer_pass *pass, uint32_t first, uint32_t n_rows);

/* The joiners' step boundary in one call (the worker makes it with the GIL released, so the
 * pass's time is the pass's, not a wait for the GIL, and the joiners cost one release, not
 * 1 + n_rows): start = now; fer_pass_run(pass, first, n_rows); end = now; then for each joiner
 * r in [0, n_rows): results[r] = fer_core_prefix_done(core, lanes[r], end, end - start)
 * (FER_STEP_CONTINUE, or STOP_* with the outcome emitted and the lane freed; a negative status
 * if the lane had no such work, the later joiners still reported). times[0] = end,
 * times[1] = end - start. FER_OK; FER_EINVAL (NULL arguments, rows as fer_pass_run) or
 * FER_EXEC_EORT with nothing reported to the core (the caller decides what the joiners get).
 * Allocates nothing. */
int fer_pass_run_done(struct fer_pass *pass, struct fer_core *core, const uint32_t *lanes,
                      uint32_t first, uint32_t n_rows, int32_t *results, uint64_t *times);

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_pass.c - the native prefix pass of a two-phase package (fer_pass.h): one ORT Run over a
 * range of rows, the outputs written straight into the step loop's static inputs, and the
 * joiners' prefix_done in the same call.
 *
 * ONNX Runtime is fer_ort.c's: a pass is a struct fer_ort plus the graph's names and the values
 * of every row range, made by the create scaffold the exec (fer_exec.c) shares, so the library,
 * the session options and the error reporting are the step loop's.
 */
#include <string.h>
#include <time.h>

#include "fer_internal.h"
#include "fer_tensor.h"
#include "fer_pass.h"
#include "fer_ort.h"

/* ---- the pass -----------------------------------------------------------------------------------
 * Invariants after a successful create: ort is fer_ort.h's (first member); n_values = n_inputs +
 * n_outputs; ort.vals[k * n_values + i] is tensor i (inputs first, then outputs) over rows
 * [first, first + n) for the k-th (first, n) in the order first = 0..max_rows-1,
 * n = 1..max_rows-first (pair_index); in_names / out_names point into names.
 */
struct fer_pass {
    struct fer_ort ort;
    uint32_t max_rows;
    uint32_t n_inputs;
    uint32_t n_outputs;
    uint32_t n_values;
    const char *in_names[FER_PASS_MAX_TENSORS];
    const char *out_names[FER_PASS_MAX_TENSORS];
    char names[2 * FER_PASS_MAX_TENSORS][FER_EXEC_NAME_MAX];
};

_Static_assert(offsetof(struct fer_pass, ort) == 0, "struct fer_ort first (fer_ort.h)");

/* Rows (first, n) in max_rows: sum over f < first of (max_rows - f), plus n - 1. */
static size_t pair_index(uint32_t max_rows, uint32_t first, uint32_t n)
{
    return (size_t)first * max_rows - (size_t)first * (first - 1u) / 2u + n - 1u;
}

static int config_ok(const void *arg)
{
    const struct fer_pass_config *cfg = arg;
    uint32_t i;

    if (cfg->max_rows < 1 || cfg->max_rows > FER_PASS_MAX_ROWS || cfg->intra_op_threads < 1 ||
        cfg->n_inputs < 1 || cfg->n_inputs > FER_PASS_MAX_TENSORS || cfg->n_outputs < 1 ||
        cfg->n_outputs > FER_PASS_MAX_TENSORS)
        return 0;
    for (i = 0; i < cfg->n_inputs; i++)
        if (fer_ort_tensor_elems(&cfg->inputs[i]) == 0)
            return 0;
    for (i = 0; i < cfg->n_outputs; i++)
        if (fer_ort_tensor_elems(&cfg->outputs[i]) == 0)
            return 0;
    return 1;
}

static uint32_t intra_op_threads(const void *cfg)
{
    return ((const struct fer_pass_config *)cfg)->intra_op_threads;
}

static const char *intra_op_affinities(const void *cfg)
{
    return ((const struct fer_pass_config *)cfg)->intra_op_affinities;
}

/* Tensor i of cfg: inputs first, then outputs. */
static const struct fer_exec_tensor *tensor(const struct fer_pass_config *cfg, uint32_t i)
{
    return i < cfg->n_inputs ? &cfg->inputs[i] : &cfg->outputs[i - cfg->n_inputs];
}

/* fer_ort_kind.build: the pass over a session that exists. */
static int build(struct fer_ort *o, const void *arg)
{
    const struct fer_pass_config *cfg = arg;
    struct fer_pass *p = (struct fer_pass *)o;
    uint32_t i, first, n, m = cfg->max_rows;
    size_t pairs = (size_t)m * (m + 1u) / 2u;
    int rc;

    p->max_rows = m;
    p->n_inputs = cfg->n_inputs;
    p->n_outputs = cfg->n_outputs;
    p->n_values = cfg->n_inputs + cfg->n_outputs;
    for (i = 0; i < p->n_values; i++) {
        memcpy(p->names[i], tensor(cfg, i)->name, FER_EXEC_NAME_MAX);
        if (i < p->n_inputs)
            p->in_names[i] = p->names[i];
        else
            p->out_names[i - p->n_inputs] = p->names[i];
    }
    if ((rc = fer_ort_values(o, pairs * p->n_values)) != FER_OK)
        return rc;
    for (first = 0; first < m; first++)
        for (n = 1; n <= m - first; n++) {
            fer_ort_value **v = &o->vals[pair_index(m, first, n) * p->n_values];
            for (i = 0; i < p->n_values; i++)
                if ((rc = fer_ort_rows_value(o, tensor(cfg, i), first, n, &v[i])) != FER_OK)
                    return rc;
        }
    if ((rc = fer_pass_run(p, 0, 1)) != FER_OK)
        return rc;
    return m > 1 ? fer_pass_run(p, 0, m) : FER_OK;
}

static const struct fer_ort_kind pass_kind = {sizeof(struct fer_pass), config_ok,
                                              intra_op_threads, intra_op_affinities,
                                              build};

int fer_pass_create(const char *lib_path, const void *model, uint64_t model_len,
                    const struct fer_pass_config *cfg, struct fer_pass **out, char *err,
                    uint64_t err_len)
{
    void *p = NULL;
    int rc = fer_ort_create(&pass_kind, lib_path, model, model_len, cfg, out != NULL ? &p : NULL,
                            err, err_len);

    if (out != NULL)
        *out = p;
    return rc;
}

void fer_pass_destroy(struct fer_pass *p)
{
    fer_ort_destroy(p != NULL ? &p->ort : NULL);
}

const char *fer_pass_last_error(const struct fer_pass *p)
{
    return p != NULL ? p->ort.err : "";
}

int fer_pass_run(struct fer_pass *p, uint32_t first, uint32_t n_rows)
{
    fer_ort_value **v;

    FER_CHECK_ARGS(p != NULL && n_rows >= 1 && n_rows <= p->max_rows &&
                   first <= p->max_rows - n_rows);
    v = &p->ort.vals[pair_index(p->max_rows, first, n_rows) * p->n_values];
    return fer_ort_run(&p->ort, p->in_names, (const fer_ort_value *const *)v, p->n_inputs,
                       p->out_names, p->n_outputs, &v[p->n_inputs]);
}

static uint64_t mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int fer_pass_run_done(struct fer_pass *p, struct fer_core *core, const uint32_t *lanes,
                      uint32_t first, uint32_t n_rows, int32_t *results, uint64_t *times)
{
    uint64_t start, end;
    uint32_t r;
    int rc;

    FER_CHECK_ARGS(core != NULL && lanes != NULL && results != NULL && times != NULL);
    start = mono_ns();
    if ((rc = fer_pass_run(p, first, n_rows)) != FER_OK)
        return rc;
    end = mono_ns();
    times[0] = end;
    times[1] = end - start;
    for (r = 0; r < n_rows; r++)
        results[r] = (int32_t)fer_core_prefix_done(core, lanes[r], end, end - start);
    return FER_OK;
}

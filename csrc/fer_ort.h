/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_ort.h - ONNX Runtime for the core's two users, the exec (fer_exec.c) and the prefix pass
 * (fer_pass.c): the library, the session with the Python path's options, OrtValues over
 * caller-owned rows, Run, and the one create / destroy scaffold both objects go through.
 * The OrtApi slice itself (which members, at which indices) is fer_ort.c's alone.
 *
 * Private to the core (not part of the cdef). Needs only <stddef.h> and <stdint.h>: the tensor
 * type (fer_tensor.h) is declared here as a tag, so this header includes nothing of the core and
 * nothing includes back (csrc/fer_internal.h draws the include graph).
 *
 * Threads: an object over a struct fer_ort belongs to one thread at a time (its owner's rules,
 * fer_exec.h and fer_pass.h); nothing here is shared between objects except the loaded library.
 * Allocation: only at create (the object, its value table); Run may allocate inside ONNX Runtime.
 */
#ifndef FER_ORT_H
#define FER_ORT_H

#include <stddef.h>
#include <stdint.h>

#define FER_ORT_ERROR_MAX 512       /* = FER_EXEC_ERROR_MAX (fer_tensor.h); fer_ort.c checks it */

struct fer_ort_api;                 /* OrtApi: its slice is declared in fer_ort.c */
struct fer_exec_tensor;             /* fer_tensor.h */
typedef struct fer_ort_opaque fer_ort_value;  /* OrtValue */

/*
 * The ONNX Runtime part of an exec or a pass, always its first member (the scaffold allocates
 * and frees the whole object through it).
 * Invariants after a successful create: api, env, session and mem are live until destroy; the
 * library stays loaded for the process (ONNX Runtime keeps thread-local state that outlives a
 * dlclose); vals[0..n_vals) are the object's OrtValues (the owner's layout; NULL until made);
 * version is the library's version string; err is "" or the message of the last
 * FER_EXEC_ELIB / FER_EXEC_EORT.
 */
struct fer_ort {
    const struct fer_ort_api *api;  /* NULL until the library passed the status round trip */
    struct fer_ort_opaque *env;
    struct fer_ort_opaque *session;
    struct fer_ort_opaque *mem;
    fer_ort_value **vals;
    size_t n_vals;
    const char *version;
    char err[FER_ORT_ERROR_MAX];
};

/*
 * What an object over a struct fer_ort is, for fer_ort_create: its size (the struct fer_ort at
 * offset 0), whether a config is valid, the config's intra-op thread count, and build, which
 * completes an object whose session exists (names, fer_ort_values, the first runs).
 */
struct fer_ort_kind {
    size_t size;
    int (*config_ok)(const void *cfg);
    uint32_t (*intra_op_threads)(const void *cfg);
    const char *(*intra_op_affinities)(const void *cfg); /* NULL or "": pool threads inherit */
    int (*build)(struct fer_ort *o, const void *cfg);
};

/* ---- the create scaffold -----------------------------------------------------------------------
 * create: *out = NULL and err = "" first (each when not NULL); FER_EINVAL unless lib_path, model,
 *   model_len, cfg and out are set and kind->config_ok(cfg); then the zeroed object, the library
 *   (dlopen(lib_path, RTLD_NOW | RTLD_LOCAL), the OrtApi table of API version 13 or later, checked
 *   by a status round trip), an OrtEnv and the session from model[0..model_len) with the options
 *   of model._session_options (intra_op_threads(cfg), inter-op 1, sequential, ORT_ENABLE_ALL, log
 *   severity 3, no pool spinning when threads > 1 and then intra_op_affinities(cfg), where set, as
 *   session.intra_op_thread_affinities; CPU provider only), then kind->build. FER_OK
 *   and *out set; else the object is destroyed, *out stays NULL and the status is FER_ENOMEM,
 *   FER_EXEC_ELIB, FER_EXEC_EORT or build's, with the reason copied into err[0..err_len)
 *   ("out of memory" for FER_ENOMEM; NUL-terminated).
 * destroy: releases every OrtValue in vals, the memory info, the session and the env reference,
 *   and frees the object o begins (not the library). Accepts NULL. */
int fer_ort_create(const struct fer_ort_kind *kind, const char *lib_path, const void *model,
                   uint64_t model_len, const void *cfg, void **out, char *err, uint64_t err_len);
void fer_ort_destroy(struct fer_ort *o);

/* ---- what build and the loops use --------------------------------------------------------------
 * values: o->vals = n NULL entries (FER_ENOMEM if not); once per object, from build.
 * tensor_elems: elements of one row of t, or 0 if t breaks fer_tensor.h's invariants.
 * rows_value: the OrtValue of tensor t over its rows [first, first + n) (shape [n, dims...]).
 * run: one Run of the session (inputs in, outputs written into out's tensors' buffers).
 * The last two return FER_OK or FER_EXEC_EORT with o->err set ("<tensor>: why", "Run: why"). */
int fer_ort_values(struct fer_ort *o, size_t n);
uint64_t fer_ort_tensor_elems(const struct fer_exec_tensor *t);
int fer_ort_rows_value(struct fer_ort *o, const struct fer_exec_tensor *t, uint32_t first,
                       uint32_t n, fer_ort_value **out);
int fer_ort_run(struct fer_ort *o, const char *const *in_names, const fer_ort_value *const *in,
                size_t n_in, const char *const *out_names, size_t n_out, fer_ort_value **out);

#endif /* FER_ORT_H */

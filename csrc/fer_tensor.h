/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_tensor.h - what the core's ONNX Runtime users share: a graph tensor over caller-owned row
 * buffers, the element types it may have, and the two statuses ONNX Runtime adds to fer.h's.
 *
 * A leaf of the include graph (csrc/fer_internal.h draws it): fer_ort.c (the ONNX Runtime ABI
 * slice) takes the tensor from here, and the exec (fer_exec.c) and the pass (fer_pass.c) take
 * fer_ort.h, so no include leads back from the slice to its users. The names keep their
 * FER_EXEC_ prefix: Python reads them as lib.FER_EXEC_* (flowedge_relay/native.py).
 *
 * Same rules as fer.h: read verbatim into the cdef by flowedge_relay/_build_core.py (after fer.h,
 * before fer_exec.h and fer_pass.h, which use it), so cdef-parsable: declarations and plain
 * integer #defines only, no #include, no include guard; C users include <stdint.h> first and this
 * header once per translation unit.
 */

#define FER_EXEC_MAX_DIMS 8         /* per-row dims of one tensor (the batch axis excluded) */
#define FER_EXEC_NAME_MAX 128       /* graph input / output names, NUL included */
#define FER_EXEC_ERROR_MAX 512      /* fer_exec_last_error, fer_pass_last_error, NUL included */

/* ---- status codes beyond fer.h's (negative) ------------------------------------------------- */
#define FER_EXEC_ELIB -16           /* the ONNX Runtime library did not load / lacks the C API */
#define FER_EXEC_EORT -17           /* an ONNX Runtime call failed; the last_error says why */

/* ONNX tensor element types (the values of onnx TensorProto.DataType) a tensor may have. */
#define FER_EXEC_FLOAT 1
#define FER_EXEC_UINT8 2
#define FER_EXEC_INT8 3
#define FER_EXEC_INT32 6
#define FER_EXEC_INT64 7
#define FER_EXEC_BOOL 9
#define FER_EXEC_DOUBLE 11

/*
 * One graph tensor over a caller-owned buffer of max_rows rows.
 * Invariants (checked by fer_exec_create and fer_pass_create): name is NUL-terminated and
 * non-empty; ndim <= FER_EXEC_MAX_DIMS; every dims[i] >= 1; row_bytes == prod(dims) x the element
 * size of dtype; data holds max_rows x row_bytes bytes, row r at data + r x row_bytes, and
 * outlives the exec or pass made over it.
 */
struct fer_exec_tensor {
    char name[FER_EXEC_NAME_MAX];
    uint32_t dtype;                      /* FER_EXEC_FLOAT, ... */
    uint32_t ndim;                       /* dims after the batch axis */
    int64_t dims[FER_EXEC_MAX_DIMS];
    uint64_t row_bytes;
    void *data;
};

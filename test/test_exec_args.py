# SPDX-License-Identifier: Apache-2.0
"""fer_exec's argument contract (csrc/fer_exec.h) without ONNX Runtime: what create and run
refuse before they touch a library. Part of `make sanitize` (scripts/sanitize_core.sh), where
ONNX Runtime itself is never loaded; test/test_native.py runs the loop for real."""

from __future__ import annotations

import numpy as np

from flowedge_relay.core import Core, CoreConfig, ffi, lib


def _tensor(c, name: bytes, dims: tuple[int, ...], buf: np.ndarray) -> None:
    ffi.memmove(c.name, name, len(name))
    c.dtype, c.ndim = lib.FER_EXEC_FLOAT, len(dims)
    for i, d in enumerate(dims):
        c.dims[i] = d
    c.row_bytes = buf[0].nbytes
    c.data = ffi.cast("void *", buf.ctypes.data)


def _config(bufs: dict[str, np.ndarray]):
    cfg = ffi.new("struct fer_exec_config *")
    cfg.max_rows, cfg.intra_op_threads, cfg.n_static = 2, 1, 1
    _tensor(cfg.x, b"x", (8, 2), bufs["x"])
    _tensor(cfg.t, b"t", (1,), bufs["t"])
    _tensor(cfg.v, b"velocity", (8, 2), bufs["v"])
    _tensor(cfg.statics[0], b"observation", (4,), bufs["obs"])
    cfg.state = ffi.cast("float *", bufs["state"].ctypes.data)
    return cfg


def _bufs() -> dict[str, np.ndarray]:
    return {"x": np.zeros((2, 8, 2), np.float32), "t": np.zeros((2, 1), np.float32),
            "v": np.zeros((2, 8, 2), np.float32), "obs": np.zeros((2, 4), np.float32),
            "state": np.zeros((2, 16), np.float32)}


def _create(cfg, path: bytes = b"/nonexistent/libonnxruntime.so"):
    out = ffi.new("struct fer_exec **")
    err = ffi.new("char[]", lib.FER_EXEC_ERROR_MAX)
    model = ffi.new("char[]", b"model")
    rc = lib.fer_exec_create(path, model, 5, cfg, out, err, lib.FER_EXEC_ERROR_MAX)
    return rc, out[0], ffi.string(err).decode()


def test_create_refuses_a_bad_config_before_loading_anything():
    bufs = _bufs()
    good = _config(bufs)
    rc, exec_, _ = _create(good)
    assert rc == lib.FER_EXEC_ELIB and exec_ == ffi.NULL  # valid config, no library
    broken = [
        ("max_rows", 0), ("max_rows", lib.FER_EXEC_MAX_ROWS + 1), ("intra_op_threads", 0),
        ("n_static", lib.FER_EXEC_MAX_STATIC + 1),
    ]
    for field, value in broken:
        cfg = _config(bufs)
        setattr(cfg, field, value)
        assert _create(cfg)[0] == lib.FER_EINVAL, field
    def set_(obj, name, value):
        return lambda: setattr(obj, name, value)

    for why, change in (
        ("x row_bytes is not prod(dims) x 4", lambda c: set_(c.x, "row_bytes", 4)),
        ("v shaped unlike x", lambda c: lambda: c.v.dims.__setitem__(0, 7)),
        ("two times a row", lambda c: lambda: c.t.dims.__setitem__(0, 2)),
        ("x not float32", lambda c: set_(c.x, "dtype", lib.FER_EXEC_UINT8)),
        ("unknown element type", lambda c: set_(c.statics[0], "dtype", 99)),
        ("a zero dim", lambda c: lambda: c.statics[0].dims.__setitem__(0, 0)),
        ("rank too large", lambda c: set_(c.statics[0], "ndim", lib.FER_EXEC_MAX_DIMS + 1)),
        ("empty name", lambda c: lambda: c.x.name.__setitem__(0, b"\0")),
        ("no state buffer", lambda c: set_(c, "state", ffi.NULL)),
        ("no t buffer", lambda c: set_(c.t, "data", ffi.NULL)),
    ):
        cfg = _config(bufs)
        change(cfg)()
        assert _create(cfg)[0] == lib.FER_EINVAL, why
    out = ffi.new("struct fer_exec **")
    assert lib.fer_exec_create(ffi.NULL, b"m", 1, good, out, ffi.NULL, 0) == lib.FER_EINVAL
    assert lib.fer_exec_create(b"x", ffi.NULL, 1, good, out, ffi.NULL, 0) == lib.FER_EINVAL
    assert lib.fer_exec_create(b"x", b"m", 0, good, out, ffi.NULL, 0) == lib.FER_EINVAL
    assert lib.fer_exec_create(b"x", b"m", 1, ffi.NULL, out, ffi.NULL, 0) == lib.FER_EINVAL
    assert lib.fer_exec_create(b"x", b"m", 1, good, ffi.NULL, ffi.NULL, 0) == lib.FER_EINVAL


def test_a_missing_library_is_named_in_the_error():
    rc, exec_, why = _create(_config(_bufs()), b"/nonexistent/libonnxruntime.so")
    assert rc == lib.FER_EXEC_ELIB and exec_ == ffi.NULL
    assert "/nonexistent/libonnxruntime.so" in why
    rc, _, why = _create(_config(_bufs()), b"libm.so.6")  # a library, but not ONNX Runtime
    assert rc == lib.FER_EXEC_ELIB and "OrtGetApiBase" in why


def test_run_and_the_accessors_refuse_null():
    lib.fer_exec_destroy(ffi.NULL)
    assert ffi.string(lib.fer_exec_last_error(ffi.NULL)) == b""
    assert ffi.string(lib.fer_exec_ort_version(ffi.NULL)) == b""
    flag = ffi.new("uint32_t *")
    rows = ffi.new("struct fer_exec_row[]", 1)
    report = ffi.new("struct fer_exec_report *")
    with Core(CoreConfig()) as core:
        assert lib.fer_exec_run(ffi.NULL, core.ptr, rows, 1, flag, ffi.NULL, 0,
                                report) == lib.FER_EINVAL
    assert lib.fer_exec_time_runs(ffi.NULL, 1, 1, ffi.new("uint64_t[]", 1)) == lib.FER_EINVAL


# ---- fer_pass (the native prefix pass) --------------------------------------------------------

def _pass_config(bufs: dict[str, np.ndarray]):
    cfg = ffi.new("struct fer_pass_config *")
    cfg.max_rows, cfg.intra_op_threads, cfg.n_inputs, cfg.n_outputs = 2, 1, 1, 1
    _tensor(cfg.inputs[0], b"observation", (4,), bufs["obs"])
    _tensor(cfg.outputs[0], b"ctx", (8, 2), bufs["v"])
    return cfg


def _pass_create(cfg, path: bytes = b"/nonexistent/libonnxruntime.so"):
    out = ffi.new("struct fer_pass **")
    err = ffi.new("char[]", lib.FER_EXEC_ERROR_MAX)
    rc = lib.fer_pass_create(path, ffi.new("char[]", b"model"), 5, cfg, out, err,
                             lib.FER_EXEC_ERROR_MAX)  # fmt: skip
    return rc, out[0], ffi.string(err).decode()


def test_pass_create_refuses_a_bad_config_before_loading_anything():
    bufs = _bufs()
    rc, pass_, why = _pass_create(_pass_config(bufs))
    assert rc == lib.FER_EXEC_ELIB and pass_ == ffi.NULL and "/nonexistent" in why
    for field, value in (("max_rows", 0), ("max_rows", lib.FER_PASS_MAX_ROWS + 1),
                         ("intra_op_threads", 0), ("n_inputs", 0), ("n_outputs", 0),
                         ("n_inputs", lib.FER_PASS_MAX_TENSORS + 1),
                         ("n_outputs", lib.FER_PASS_MAX_TENSORS + 1)):
        cfg = _pass_config(bufs)
        setattr(cfg, field, value)
        assert _pass_create(cfg)[0] == lib.FER_EINVAL, field
    cfg = _pass_config(bufs)
    cfg.outputs[0].row_bytes = 4
    assert _pass_create(cfg)[0] == lib.FER_EINVAL
    cfg = _pass_config(bufs)
    cfg.inputs[0].data = ffi.NULL
    assert _pass_create(cfg)[0] == lib.FER_EINVAL
    out = ffi.new("struct fer_pass **")
    good = _pass_config(bufs)
    assert lib.fer_pass_create(ffi.NULL, b"m", 1, good, out, ffi.NULL, 0) == lib.FER_EINVAL
    assert lib.fer_pass_create(b"x", b"m", 0, good, out, ffi.NULL, 0) == lib.FER_EINVAL
    assert lib.fer_pass_create(b"x", b"m", 1, ffi.NULL, out, ffi.NULL, 0) == lib.FER_EINVAL
    assert lib.fer_pass_create(b"x", b"m", 1, good, ffi.NULL, ffi.NULL, 0) == lib.FER_EINVAL


def test_pass_run_and_the_accessors_refuse_null():
    lib.fer_pass_destroy(ffi.NULL)
    assert ffi.string(lib.fer_pass_last_error(ffi.NULL)) == b""
    assert lib.fer_pass_run(ffi.NULL, 0, 1) == lib.FER_EINVAL

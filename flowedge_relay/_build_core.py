# SPDX-License-Identifier: Apache-2.0
"""CFFI builder of the C scheduling core (out-of-line API mode).

Used two ways:

* by ``setup.py`` (``cffi_modules=["flowedge_relay/_build_core.py:ffibuilder"]``), so pip and
  colcon build ``flowedge_relay._fer_core`` like any extension;
* as ``python -m flowedge_relay._build_core`` (or as a script), which compiles the extension in
  place next to this file, using a temporary directory under ``build/``. ``FER_SANITIZE=1`` adds
  AddressSanitizer and UndefinedBehaviorSanitizer to compile and link (see
  ``scripts/sanitize_core.sh``); ``FER_BUILD_DIR`` and ``FER_OUTPUT_DIR`` redirect the temporary and
  output directories (the sanitizer build keeps its .so apart from the normal one).

The cdef is ``csrc/fer.h`` (the runtime contract) followed by ``csrc/fer_pool.h`` (a relay pool's
ownership, standby and takeover), ``csrc/fer_rtprobe.h`` (the priority-inversion probe the
real-time tests run on the core's own locks), ``csrc/fer_tensor.h`` (the tensor over row buffers
both ONNX Runtime users take), ``csrc/fer_exec.h`` (the native NFE loop), ``csrc/fer_pass.h`` (the
native prefix pass), ``csrc/fer_noise.h`` (a request's initial noise, numpy's float32
standard_normal in C), ``csrc/fer_serve.h`` (a worker's whole request cycle in C),
``csrc/fer_publish.h`` (the publisher thread's loop in C) and ``csrc/fer_rt.h`` (a thread's own
real-time settings), read verbatim: the headers are written to be cdef-parsable, so the Python
declarations can never drift from the C ones.

The benchmark drivers and the intake bench's client are not here: they are the tools package's own
extension (tools/flowedge_relay_tools/_build_bench.py), which includes this cdef, compiles with
``compile_args()`` and ``compile_in_place``, and calls this module's functions.
"""

import os
import pathlib
import shutil
import sys
import tempfile

from cffi import FFI

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
CSRC = ROOT / "csrc"
# One concern per file (csrc/fer_internal.h lists them).
SOURCES = ["fer_core.c", "fer_session.c", "fer_queue.c", "fer_submit.c", "fer_admit.c",
           "fer_lane.c", "fer_output.c", "fer_stats.c", "fer_cost.c", "fer_ring.c", "fer_exec.c",
           "fer_noise.c", "fer_serve.c", "fer_publish.c", "fer_rt.c",
           "fer_ort.c", "fer_pass.c", "fer_lock.c", "fer_rtprobe.c", "fer_wire.c",
           "fer_take.c", "fer_intake.c", "fer_share.c", "fer_pool.c"]
# The runtime contract, the real-time probe, the native NFE loop (which dlopens ONNX Runtime at
# run time: no link-time dependency), the initial noise, the worker's request cycle over them,
# then rcl's ABI slice and the threads that call it (the publisher's loop, the request intake;
# through function pointers of the rcl that rclpy loaded: no link-time dependency either), and a
# thread's real-time settings: one cdef, one module.
HEADERS = ["fer.h", "fer_pool.h", "fer_rtprobe.h", "fer_tensor.h", "fer_exec.h", "fer_pass.h",
           "fer_noise.h", "fer_serve.h", "fer_rcl.h", "fer_publish.h", "fer_wire.h",
           "fer_intake.h", "fer_rt.h"]
MODULE = "flowedge_relay._fer_core"
# The wire format comes from the messages' generated C type support (csrc/fer_wire.h): the
# headers of flowedge_relay_msgs (colcon builds it first) and of the ROS 2 C packages they include,
# from the venv's pinned wheels. Headers only: the libraries are resolved at run time in the
# process rclpy runs in (flowedge_relay/rcl_abi.py), so there is still no link-time dependency.
ROS_INCLUDE_PACKAGES = ("rosidl_runtime_c", "rosidl_typesupport_interface",
                        "rosidl_typesupport_introspection_c", "rosidl_dynamic_typesupport",
                        "rcutils", "builtin_interfaces", "std_msgs", "service_msgs",
                        "type_description_interfaces")
MSGS = "flowedge_relay_msgs"

SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                  "-fno-sanitize-recover=undefined"]


def _sanitize() -> bool:
    return os.environ.get("FER_SANITIZE", "") not in ("", "0")


def _msgs_include() -> str:
    """flowedge_relay_msgs' include directory: from the environment colcon or scripts/env.sh set
    up, else this checkout's install tree of ROS_DISTRO (scripts/distro.sh's default, jazzy)."""
    prefixes = [p for var in ("AMENT_PREFIX_PATH", "CMAKE_PREFIX_PATH")
                for p in os.environ.get(var, "").split(os.pathsep) if p]
    distro = os.environ.get("FER_DISTRO") or os.environ.get("ROS_DISTRO") or "jazzy"
    prefixes.append(str(ROOT / "install" / distro / MSGS))
    for prefix in prefixes:
        include = pathlib.Path(prefix) / "include" / MSGS
        if (include / MSGS / "msg" / "detail" / "action_message__struct.h").is_file():
            return str(include)
    raise RuntimeError(f"{MSGS} is not built (no include/{MSGS} under {prefixes}): run "
                       "`make setup`, which builds the messages before the C core")


def _ros_prefix() -> pathlib.Path:
    """Where the ROS 2 C headers are: the venv of the pinned wheels (the interpreter's, as its
    path says: colcon's build overrides sys.prefix with the install tree), or a prefix of the
    environment (a sourced ROS 2 install)."""
    candidates = [os.environ.get("VIRTUAL_ENV", ""),
                  str(pathlib.Path(sys.executable).parent.parent), sys.prefix]
    candidates += [p for var in ("AMENT_PREFIX_PATH", "CMAKE_PREFIX_PATH")
                   for p in os.environ.get(var, "").split(os.pathsep)]
    for prefix in filter(None, candidates):
        if (pathlib.Path(prefix) / "include" / "rosidl_runtime_c").is_dir():
            return pathlib.Path(prefix)
    raise RuntimeError(f"no ROS 2 C headers (include/rosidl_runtime_c) under {candidates}: run "
                       "`make setup`")


def _ros_includes() -> list[str]:
    """The include directories of the messages and the ROS 2 C headers they need."""
    include = _ros_prefix() / "include"
    return [_msgs_include()] + [str(include / p) for p in ROS_INCLUDE_PACKAGES
                                if (include / p).is_dir()]


def compile_args() -> list[str]:
    """The C flags of the core, and of the tools' extension that calls into it (FER_SANITIZE read
    at call time)."""
    args = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wshadow", "-Wconversion",
            "-Wno-unused-parameter", "-D_POSIX_C_SOURCE=200809L",
            # fer_exec.c's solver update must round like numpy's separate float32 ufuncs,
            # fer_noise.c's wedge test like numpy's C: no contraction of a * b + c into an FMA
            "-ffp-contract=off"]
    return args + SANITIZE_FLAGS + ["-O1", "-g"] if _sanitize() else args


def link_args() -> list[str]:
    """The link flags that go with compile_args()."""
    return list(SANITIZE_FLAGS) if _sanitize() else []


def _make_builder(absolute: bool) -> FFI:
    builder = FFI()
    builder.cdef("\n".join((CSRC / h).read_text() for h in HEADERS))
    # setup.py runs with the repository root as cwd and prefers paths relative to it; the
    # in-place build compiles from a temporary directory and needs absolute ones. Both are
    # resolved from this file's location, never guessed from the cwd.
    if not absolute and pathlib.Path.cwd().resolve() == ROOT:
        sources = [os.path.join("csrc", s) for s in SOURCES]
        include = ["csrc"]
    else:
        sources = [str(CSRC / s) for s in SOURCES]
        include = [str(CSRC)]
    builder.set_source(
        MODULE,
        "#include <stdint.h>\n" + "".join(f'#include "{h}"\n' for h in HEADERS),
        sources=sources,
        include_dirs=include + _ros_includes(),
        extra_compile_args=compile_args(),
        extra_link_args=link_args(),
        libraries=["pthread", "dl", "m"],  # libm: fer_noise.c's log1pf and exp
    )
    return builder


ffibuilder = _make_builder(absolute=False)


def build_in_place(verbose: bool = False) -> pathlib.Path:
    """Compile the extension and copy it next to this file (or into FER_OUTPUT_DIR)."""
    out_dir = pathlib.Path(os.environ.get("FER_OUTPUT_DIR", HERE)).resolve()
    build_root = pathlib.Path(os.environ.get("FER_BUILD_DIR", ROOT / "build" / "fer_core"))
    # re-reads FER_SANITIZE at call time
    return compile_in_place(_make_builder(absolute=True), out_dir, build_root, verbose)


def compile_in_place(builder: FFI, out_dir: pathlib.Path, build_root: pathlib.Path,
                     verbose: bool = False) -> pathlib.Path:
    """Compile `builder`'s extension in a temporary directory under build_root and copy it into
    out_dir (the core's, and the tools' extension)."""
    build_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=build_root) as tmp:
        built = pathlib.Path(builder.compile(tmpdir=tmp, verbose=verbose))
        if not built.is_absolute():
            built = pathlib.Path(tmp) / built
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / built.name
        # Copy to a temporary name and rename: a concurrent importer sees the old or new module,
        # never a half-written one.
        partial = target.with_name(target.name + ".partial")
        shutil.copy2(built, partial)
        os.replace(partial, target)
    return target


def main() -> int:
    target = build_in_place(verbose="-v" in sys.argv)
    print(f"built {target}{' (sanitizers)' if _sanitize() else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

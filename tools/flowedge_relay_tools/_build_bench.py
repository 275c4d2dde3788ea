# SPDX-License-Identifier: Apache-2.0
"""CFFI builder of the tools' C drivers (out-of-line API mode): ``tools/csrc/fer_bench.c`` (timed
admission decisions, ring producer and consumer loops) and ``tools/csrc/fer_loadgen.c`` (the
intake bench's client), as ``flowedge_relay_tools._fer_bench``.

Why a module of its own: the relay a robot installs carries no bench code. Why it stays small:
the drivers call the runtime core's functions (fer.h, the take loop of fer_take.h, the answer
reader of fer_wire.h) without compiling them again; the loader binds those calls to the relay's
own core module (``flowedge_relay_tools.native``), so a bench times the very object code the relay
runs. The cdef includes the core's (``ffi.include``), so a ``struct fer_ring *`` or an rcl
function pointer from the runtime passes to the drivers as it is.

Used by ``tools/setup.py`` (``cffi_modules``) for colcon and pip, and as
``python -m flowedge_relay_tools._build_bench`` (``make core``, ``make setup``), which compiles the
extension in place next to this file; ``FER_SANITIZE``, ``FER_BUILD_DIR`` and ``FER_OUTPUT_DIR`` as
for the core (flowedge_relay/_build_core.py).
"""

from __future__ import annotations

import os
import pathlib
import sys

from cffi import FFI

# The core's builder, for its cdef, flags and in-place compile: a build step, not a use of the
# runtime's internals at run time (test/test_layout.py allows this one import, with that reason).
import flowedge_relay._build_core as core_build

HERE = pathlib.Path(__file__).resolve().parent
TOOLS = HERE.parent
CSRC = TOOLS / "csrc"
SOURCES = ["fer_bench.c", "fer_loadgen.c"]
HEADERS = ["fer_bench.h", "fer_loadgen.h"]
MODULE = "flowedge_relay_tools._fer_bench"


def _make_builder(absolute: bool) -> FFI:
    builder = FFI()
    builder.include(core_build.ffibuilder)
    builder.cdef("\n".join((CSRC / h).read_text() for h in HEADERS))
    # setup.py runs with tools/ as cwd and wants source paths relative to it (as the core's)
    if not absolute and pathlib.Path.cwd().resolve() == TOOLS:
        sources = [os.path.join("csrc", s) for s in SOURCES]
    else:
        sources = [str(CSRC / s) for s in SOURCES]
    builder.set_source(
        MODULE,
        # the core's cdef headers first: CFFI checks the layout of the included types here too
        "#include <stdint.h>\n"
        + "".join(f'#include "{h}"\n' for h in [*core_build.HEADERS, *HEADERS]),
        sources=sources,
        include_dirs=[str(CSRC), str(core_build.CSRC)],  # the core's headers: declarations only
        extra_compile_args=core_build.compile_args(),
        extra_link_args=core_build.link_args(),
        libraries=["pthread"],
    )
    return builder


ffibuilder = _make_builder(absolute=False)


def build_in_place(verbose: bool = False) -> pathlib.Path:
    """Compile the extension and copy it next to this file (or into FER_OUTPUT_DIR)."""
    out_dir = pathlib.Path(os.environ.get("FER_OUTPUT_DIR", HERE)).resolve()
    build_root = pathlib.Path(os.environ.get("FER_BUILD_DIR",
                                             core_build.ROOT / "build" / "fer_bench"))
    return core_build.compile_in_place(_make_builder(absolute=True), out_dir, build_root, verbose)


def main() -> int:
    target = build_in_place(verbose="-v" in sys.argv)
    print(f"built {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

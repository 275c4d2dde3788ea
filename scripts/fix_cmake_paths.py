# SPDX-License-Identifier: Apache-2.0
"""Rewrite the build container's Python paths baked into the ROS 2 wheels' CMake files.

The PyPI ROS 2 wheels export CMake config files that name /opt/python/cp311-cp311/... (the
machine they were built on). CMake refuses non-existent include paths, so point them at this
venv's Python include dir and numpy's include dir. Touches files under the venv only; idempotent.
"""

import pathlib
import sys
import sysconfig

import numpy

OLD_NUMPY = "/opt/python/cp311-cp311/lib/python3.11/site-packages/numpy/_core/include"
OLD_PYTHON = "/opt/python/cp311-cp311/include/python3.11"


def main() -> int:
    venv = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else sys.prefix)
    new_python = sysconfig.get_paths()["include"]
    new_numpy = numpy.get_include()
    changed = 0
    for path in (venv / "share").rglob("*.cmake"):
        text = path.read_text(errors="surrogateescape")
        if OLD_NUMPY not in text and OLD_PYTHON not in text:
            continue
        # numpy first: its old path does not contain the old python include path, but be explicit.
        text = text.replace(OLD_NUMPY, new_numpy).replace(OLD_PYTHON, new_python)
        path.write_text(text, errors="surrogateescape")
        changed += 1
    print(f"fixed {changed} CMake files (python include -> {new_python}, numpy -> {new_numpy})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

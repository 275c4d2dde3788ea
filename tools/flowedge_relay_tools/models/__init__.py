# SPDX-License-Identifier: Apache-2.0
"""The benchmarks' heavier policy (package data) and the toy detour task every bundled policy
was trained on, which the demos, the benchmarks and the tests draw scenes from."""

from __future__ import annotations

from pathlib import Path

_MODELS_DIR = Path(__file__).resolve().parent


def bench_model_path() -> str:
    """The bundled heavier policy (about 1 ms per NFE on one core) used by the benchmarks."""
    return str(_MODELS_DIR / "policy_bench.onnx")

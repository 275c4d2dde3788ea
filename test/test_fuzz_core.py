# SPDX-License-Identifier: Apache-2.0
"""A short fuzz run of the C core in CI (tools/fuzz_core.py): random operation sequences with
hostile arguments, invariants after every call, the exactly-once ledger after every case; once on
the normal build and once on an ASan + UBSan build of csrc/ in a child process.

Longer runs: `python tools/fuzz_core.py --seconds 600 [--sanitize]` (or `make fuzz`).
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import fuzz_core  # noqa: E402

SECONDS = float(os.environ.get("FER_FUZZ_SECONDS", "6"))


def test_fuzz_core_short_run():
    result = fuzz_core.fuzz(seconds=SECONDS, seed=20240601)
    assert result["cases"] > 20
    cov = result["coverage"]
    # the run reached every decision and every outcome, not only error paths
    for key in ("submit=0", "submit=1", "submit=2", "submit=3", "submit=4", "submit=6",
                "outcome=0", "outcome=1", "outcome=2", "outcome=3", "outcome=4", "outcome=5",
                "step=1", "step=2", "step=3", "fail=5"):
        assert cov.get(key, 0) > 0, key


def test_fuzz_findings_replay_from_their_seed():
    """A failing case names its seed; one case replays deterministically."""
    a = fuzz_core.fuzz(cases=1, seed=77, ops=200)
    b = fuzz_core.fuzz(cases=1, seed=77, ops=200)
    assert a["coverage"] == b["coverage"] and a["core_calls"] == b["core_calls"]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc's ASan/UBSan runtimes")
def test_fuzz_core_under_asan_and_ubsan():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "fuzz_core.py"), "--sanitize",
         "--seconds", str(SECONDS), "--seed", "20240602"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["build"] == "asan+ubsan" and result["sanitizer_runtime_loaded"]
    assert result["cases"] > 5

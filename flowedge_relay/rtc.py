# SPDX-License-Identifier: Apache-2.0
"""Real-time chunking (RTC): the arithmetic the relay, the producers and the evaluation share.

Why: a robot that runs a chunked flow policy asynchronously keeps executing its current chunk
while the next one is computed. The first d rows of the new chunk, the ones due while inference
runs, are executed from the old chunk anyway; RTC freezes them to the old chunk's values and
generates the rest consistent with them, so the switch at row d is smooth and does not change
the plan's mode (PI's real-time chunking; Black et al., training-time action conditioning).

The contract (one request):
  - `prefix_actions`: the robot's not yet executed rows of its current chunk, row-major
    [rows, dim], rows <= horizon, in the space of the answer's actions; row i is due at
    `prefix_start + i * action_period`. The new chunk uses the same time grid.
  - `frozen_rows` d (`frozen_rows()` below): rows 0..d-1 of the answer are prefix rows 0..d-1,
    bit for bit; the robot switches to the new chunk at row d.
  - how the solver is conditioned, declared by the policy (`parse_rtc`, the manifest's `rtc:`):
      training_time  the graph takes the flow time per action row, [batch, horizon]: frozen rows
                     are held at the prefix with the clean time, the others get the solver's.
      inpaint        any flow policy: after every solver step each frozen row is set to the flow
                     interpolation between the request's initial noise and its target.

Float32 arithmetic throughout, in the operation order each function's docstring states, so a C
loop compiled with -ffp-contract=off (no fused multiply-add) reproduces it bit for bit. Every
function works on one request's flat row-major arrays of horizon x dim float32 and writes in
place (no allocation on the solver's path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from flowedge_relay.model import ModelError

MODES = ("training_time", "inpaint")
TIME_CONVENTIONS = ("0_to_1", "1_to_0")  # the manifest's flow.time values

_ONE = np.float32(1.0)


class RtcManifestError(ModelError):
    """A malformed `rtc:` block; the message names the field, what was expected and found."""


# ---------------------------------------------------------------- timing


def frozen_rows(
    finish_bound_ns: int,
    prefix_start_ns: int,
    action_period_ns: int,
    prefix_rows: int,
    max_delay: int,
) -> int:
    """d: how many prefix rows are due before the answer can be there (and so are frozen).

    d = ceil((finish_bound - prefix_start) / action_period), in integer arithmetic: row i is due
    at prefix_start + i * period and is executed from the old chunk when that is before the
    finish bound (a row due exactly at the finish bound is the new chunk's). Clamped:
      - at least 0: a finish bound at or before prefix_start freezes nothing;
      - at most prefix_rows: there is nothing older to hold (the robot would have run dry);
      - at most max_delay: the policy holds no more (the largest d trained, for training_time).
    The relay keeps the finish bound at or before `deadline_of(...)`, so the clamps at
    prefix_rows and max_delay are reached only by answers that meet that deadline exactly.
    """
    if action_period_ns <= 0:
        raise ValueError(f"action_period_ns must be > 0, got {action_period_ns}")
    if prefix_rows < 0 or max_delay < 0:
        raise ValueError(f"prefix_rows and max_delay must be >= 0, got {prefix_rows}, {max_delay}")
    span = int(finish_bound_ns) - int(prefix_start_ns)
    if span <= 0:
        return 0
    d = -(-span // int(action_period_ns))  # ceil for integers of any size
    return min(d, int(prefix_rows), int(max_delay))


def deadline_of(
    prefix_start_ns: int, prefix_rows: int, max_delay: int, action_period_ns: int
) -> int:
    """The deadline a chunk conditioned on this prefix must meet: prefix_start +
    min(prefix_rows, max_delay) x action_period, when the first row that cannot be frozen is due.

    An answer finishing by then has frozen_rows() <= min(prefix_rows, max_delay). An empty
    prefix (or max_delay 0) gives prefix_start itself: nothing can be held, the chunk is due
    when the robot would need its first row.
    """
    if action_period_ns <= 0:
        raise ValueError(f"action_period_ns must be > 0, got {action_period_ns}")
    if prefix_rows < 0 or max_delay < 0:
        raise ValueError(f"prefix_rows and max_delay must be >= 0, got {prefix_rows}, {max_delay}")
    return int(prefix_start_ns) + min(int(prefix_rows), int(max_delay)) * int(action_period_ns)


# ---------------------------------------------------------------- conditioning (one request)


def clean_time(time_convention: str) -> np.float32:
    """The flow time of a clean action: 1 for 0_to_1, 0 for 1_to_0."""
    if time_convention not in TIME_CONVENTIONS:
        raise ValueError(
            f"time convention must be one of {TIME_CONVENTIONS}, got {time_convention!r}"
        )
    return np.float32(1.0 if time_convention == "0_to_1" else 0.0)


def hold_prefix(x: np.ndarray, prefix: np.ndarray, d: int, dim: int) -> None:
    """x[:d * dim] = prefix[:d * dim], a plain copy: the frozen rows become the prefix bit for
    bit. The final step of both modes (after the last NFE), and training_time's state before
    every NFE. x and prefix are flat row-major float32."""
    n = d * dim
    if n:
        np.copyto(x[:n], prefix[:n])


def row_times(t: np.float32, d: int, time_convention: str, out: np.ndarray) -> np.ndarray:
    """training_time's per-row flow time for the next NFE: rows 0..d-1 clean (clean_time), the
    others the solver's time t; out is the float32 [horizon] row of the graph's time input.
    No arithmetic: each element is one of two float32 values."""
    out[:d] = clean_time(time_convention)
    out[d:] = np.float32(t)
    return out


def condition_training_time(
    x: np.ndarray,
    t_rows: np.ndarray,
    t: np.float32,
    prefix: np.ndarray,
    d: int,
    dim: int,
    time_convention: str,
) -> None:
    """Before every NFE of a training_time policy: the frozen rows of the model input x are the
    prefix (hold_prefix) and the per-row time is clean on them, t elsewhere (row_times). With
    d = 0 only the time row is written, every element t: the unconditioned solver."""
    hold_prefix(x, prefix, d, dim)
    row_times(t, d, time_convention, t_rows)


def inpaint(
    x: np.ndarray,
    t: np.float32,
    x0: np.ndarray,
    target: np.ndarray,
    d: int,
    dim: int,
    time_convention: str,
    tmp: np.ndarray,
) -> None:
    """After a solver step that landed at flow time t: the frozen rows of x are set to the flow
    interpolation of their target at t, using the request's own initial noise x0.

    Per element e < d * dim, in float32 with w = 1 - t computed once:
      0_to_1:  x[e] = (w * x0[e]) + (t * target[e])
      1_to_0:  x[e] = (t * x0[e]) + (w * target[e])
    two products rounded separately (no fused multiply-add), then one sum. At the clean time
    (t = 1, resp. 0) this is 0 * x0[e] + 1 * target[e]: the target exactly (a signed zero
    aside, which the final hold_prefix settles). tmp is scratch of at least d * dim floats.
    """
    n = d * dim
    if not n:
        return
    clean_time(time_convention)  # checks the convention
    t = np.float32(t)
    w = np.float32(_ONE - t)
    a, b = (w, t) if time_convention == "0_to_1" else (t, w)
    np.multiply(x0[:n], a, out=x[:n])
    np.multiply(target[:n], b, out=tmp[:n])
    np.add(x[:n], tmp[:n], out=x[:n])


def landing_times(times: np.ndarray, time_convention: str) -> np.ndarray:
    """The flow time each NFE's solver update lands at, float32 [N], from the evaluation times
    of the grid (model.integrator_plan): NFE j lands where NFE j + 1 evaluates, the last one at
    the clean time. For the midpoint solver a half step lands at the midpoint (the model input
    there is the array to project), a full step at the next interval's start (the state)."""
    land = np.empty(len(times), np.float32)
    land[:-1] = times[1:]
    land[-1] = clean_time(time_convention)
    return land


# ---------------------------------------------------------------- the manifest's rtc: block


@dataclass(frozen=True)
class RtcSpec:
    """A policy's declared RTC support (policy.yaml `rtc:`)."""

    mode: str  # training_time | inpaint
    max_delay: int  # the largest d the policy holds (trained, for training_time)
    time_input: str | None = None  # training_time: the step graph's per-row time input


def _expect(cond: bool, where: str, expected: str, found: Any) -> None:
    if not cond:
        raise RtcManifestError(f"{where}: expected {expected}, found {found!r}")


def parse_rtc(raw: dict, where: str, horizon: int | None = None) -> RtcSpec:
    """The `rtc:` block: `{mode: training_time, time_input: <graph input>, max_delay: <int>}` or
    `{mode: inpaint, max_delay: <int>}`. `where` prefixes every error's field (`rtc`, or
    `pkg: rtc`). With the action horizon known (the loader's), max_delay must leave at least one
    row to generate: max_delay < horizon. The loader checks the graph side: the time_input is a
    float input of shape [batch, horizon] (it may be flow.t itself, the usual export: a graph
    with one, per-row, time input)."""
    _expect(isinstance(raw, dict), where, "a mapping with mode and max_delay", raw)
    unknown = sorted(set(raw) - {"mode", "time_input", "max_delay"})
    _expect(not unknown, where, "only the keys mode, time_input, max_delay", unknown)
    mode = raw.get("mode")
    _expect(mode in MODES, f"{where}.mode", f"one of {list(MODES)}", mode)
    max_delay = raw.get("max_delay")
    _expect(
        isinstance(max_delay, int) and not isinstance(max_delay, bool) and max_delay > 0,
        f"{where}.max_delay",
        "a positive integer",
        max_delay,
    )
    if horizon is not None:
        _expect(
            max_delay < horizon,
            f"{where}.max_delay",
            f"< action.horizon ({horizon}), one row at least left to generate",
            max_delay,
        )
    time_input = raw.get("time_input")
    if mode == "training_time":
        _expect(
            isinstance(time_input, str) and bool(time_input),
            f"{where}.time_input",
            "the name of the graph's per-row time input (training_time)",
            time_input,
        )
    else:
        _expect(time_input is None, f"{where}.time_input", "none for inpaint", time_input)
    return RtcSpec(mode=mode, max_delay=max_delay, time_input=time_input)


#: the relay's rtc_mode parameter
RTC_MODES = ("auto", "training_time", "inpaint", "off")


def resolve(declared: RtcSpec | None, requested: str, *, package: bool, solver: str,
            horizon: int) -> RtcSpec | None:
    """What the relay serves for rtc_mode `requested` on a policy that declares `declared`
    (its manifest's rtc: block, or None): None = real-time chunking off (a request with a prefix
    is discarded, prefix_unsupported).
      auto           the declared mode, or off when nothing is declared;
      training_time  needs a policy trained for it (declared training_time);
      inpaint        any flow policy, a package or a single .onnx file (no retraining);
                     max_delay the declared one, else horizon - 1 (one row at least left to
                     generate);
      off            off.
    `solver` is what the policy is served on: a package's flow.solver, a single file's `solver`
    parameter. A mode that cannot be served raises RtcManifestError (the model's ERROR, never a
    silent off) whose message says what to change: the conditioning follows the Euler solver's
    states (flowedge_relay_tools.rtc_rollout evaluates it), and training_time needs a graph
    trained with a per-row time input, which only a package's manifest can declare."""
    if requested not in RTC_MODES:
        raise RtcManifestError(f"rtc_mode: expected one of {list(RTC_MODES)}, found {requested!r}")
    if requested == "off" or (requested == "auto" and declared is None):
        return None
    mode = declared.mode if requested == "auto" else requested  # type: ignore[union-attr]
    if mode == "training_time" and (declared is None or declared.mode != "training_time"):
        where = "the policy package declares" if package else "a single .onnx file declares"
        raise RtcManifestError(
            f"rtc_mode training_time: {where} no training-time conditioning; serve a package "
            "whose policy.yaml has rtc: {mode: training_time, time_input: ..., max_delay: ...}, "
            "or set rtc_mode to inpaint (any flow policy, no retraining)")
    if solver != "euler":
        fix = ("export the package with flow.solver: euler in its policy.yaml" if package
               else "set the solver parameter to euler")
        raise RtcManifestError(f"rtc_mode {mode}: real-time chunking conditions the euler "
                               f"solver's states, found solver {solver}; {fix}, or set "
                               "rtc_mode to off")
    if declared is not None and declared.mode == mode:
        return declared
    max_delay = declared.max_delay if declared is not None else horizon - 1
    if max_delay < 1:
        raise RtcManifestError(f"rtc_mode {mode}: an action horizon of {horizon} row leaves no "
                               "row to freeze and one to generate; set rtc_mode to off")
    return RtcSpec(mode=mode, max_delay=max_delay)


# ---------------------------------------------------------------- producer side


class ChunkSplicer:
    """The robot's side of RTC: which action is due when, the prefix of the next request, and
    the switch to an answer at its row d.

    Keeps the current chunk (rows x dim float32) and the time its row 0 is due; row i is due at
    start + i * period. Pure numpy and integer nanoseconds, no ROS: a node wraps it."""

    def __init__(self, action_dim: int, action_period_ns: int) -> None:
        if action_dim < 1 or action_period_ns <= 0:
            raise ValueError(
                f"need action_dim >= 1 and action_period_ns > 0, got "
                f"{action_dim}, {action_period_ns}"
            )
        self.dim = int(action_dim)
        self.period_ns = int(action_period_ns)
        self.chunk = np.zeros((0, self.dim), np.float32)
        self.start_ns = 0
        # the old chunk's row in progress when a splice's chunk starts later (its prefix began
        # at the next row): executed until start_ns
        self._bridge: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return len(self.chunk)

    def start(self, actions: np.ndarray, start_ns: int) -> None:
        """A chunk with nothing to splice (the first, or after a stop): row 0 due at start_ns."""
        self.chunk = np.array(actions, np.float32).reshape(-1, self.dim)
        self.start_ns = int(start_ns)
        self._bridge = None

    def row_due(self, now_ns: int) -> int:
        """Index of the row being executed at now_ns: floor((now - start) / period); < 0 before
        the chunk starts, >= rows after it ran out."""
        return (int(now_ns) - self.start_ns) // self.period_ns

    def action_at(self, now_ns: int) -> np.ndarray | None:
        """The action the robot executes at now_ns (a view), None before the start or after the
        last row (nothing to execute: the robot holds). In the period before a spliced chunk's
        start, the old chunk's row that was in progress when its request was sent."""
        i = self.row_due(now_ns)
        if i == -1 and self._bridge is not None:
            return self._bridge
        return self.chunk[i] if 0 <= i < self.rows else None

    def prefix(self, now_ns: int) -> tuple[np.ndarray, int]:
        """(prefix_actions, prefix_start_ns) for a request sent at now_ns: the rows due at or
        after now (row-major float32 copy, possibly empty) and the time the first of them is
        due (on the chunk's grid)."""
        first = max(0, -(-(int(now_ns) - self.start_ns) // self.period_ns))
        first = min(first, self.rows)
        return self.chunk[first:].reshape(-1).copy(), self.start_ns + first * self.period_ns

    def splice(self, actions: np.ndarray, frozen_rows: int, prefix_start_ns: int) -> None:
        """Switch to an answer whose request carried prefix_start_ns: its row i is due at
        prefix_start + i * period; rows before frozen_rows are executed from the old chunk (for
        a conditioned answer they are the same bits), the answer's own rows from there on."""
        new = np.array(actions, np.float32).reshape(-1, self.dim)
        offset = int(prefix_start_ns) - self.start_ns
        if offset < 0 or offset % self.period_ns:
            raise ValueError(
                f"prefix_start_ns {prefix_start_ns} is not on the chunk's grid at or "
                f"after {self.start_ns} (period {self.period_ns})"
            )
        first = offset // self.period_ns
        if not 0 <= frozen_rows <= min(len(new), self.rows - first):
            raise ValueError(
                f"frozen_rows {frozen_rows}: the old chunk has {max(0, self.rows - first)} rows "
                f"from prefix_start on, the answer {len(new)}"
            )
        new[:frozen_rows] = self.chunk[first : first + frozen_rows]
        bridge = self.chunk[first - 1].copy() if 0 < first <= self.rows else None
        self.chunk, self.start_ns, self._bridge = new, int(prefix_start_ns), bridge

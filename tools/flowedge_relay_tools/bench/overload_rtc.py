# SPDX-License-Identifier: Apache-2.0
"""`bench overload --rtc`: is real-time chunking's delay right over real DDS, past capacity?

Under overload, every INFERENCE answer must reach the producer by
`chunk_start + frozen_rows x action_period` (the robot runs out of frozen rows there and switches
to the new chunk), and frozen_rows (d) must be tight: no more rows frozen than had run when the
answer arrived, give or take one. The relay fixes d at dispatch from admission's finish bound
(docs/design.md §5.4) and expires work still running when row d starts, so an answer is late
only if what follows the relay's finish (publishing, DDS delivery to this client) outlasts the
rest of the row. --rtc therefore admits with the calibration's real-time chunking values
(recommended_rtc_nfe_ns, the p99 request's compute per NFE rather than the p99 step, and
recommended_rtc_reserve_ns, the answer's way out: the p99 fixed part or the longest publish ->
callback trip under load) unless --nfe-ns / --admission-reserve-ns are given, and in the
real-time mode it does not raise the reserve to the latency probe's longest stall: work past its
bound is an EXPIRED answer (the overload table counts them), where a bound as long as the stall
would freeze that many more rows of every chunk.

Every request of the trace carries a prefix (`RtcTrace`): `rows` rows of the served policy's
action_dim (8, or seeded in [lo, hi] with --rtc-rows), seeded values; prefix_start is the first
row boundary at or after the send time on a grid of `action_period` ns of ROS time (set by
`BenchClient.send` from its own clock reading); the trace's deadline (send + slack) stays on the
request; its NFE range defaults to 32-128 (`NFE`: why, there). The period defaults to
slack_min / rtc_max_delay (10 ms for the default trace and policy_rtc): the window then ends
min(rows, max_delay) periods after a boundary at most one period past the send, 40-50 ms after
it at 4 rows, before the trace's deadline (40-160 ms) for all but the requests with under ~50 ms
of slack, so the window is the deadline that binds for most requests (`window_binding_share`
counts it per point). With --rtc the overload bench's on-time figures use the earlier of the
two deadlines, as the relay does.

The bound d comes from is pessimistic by remaining NFE x (nfe_ns - the NFE's real cost) +
admission_reserve_ns, so d - k is about that over the period: tight only where the calibration
is close to the host's real costs.

Per point, over the INFERENCE answers (`measure`):

  in_time_ratio       received (client callback, ROS time) no later than chunk_start +
                      frozen_rows x action_period; late_published_in_time: of the late ones,
                      those the relay published in time (the DDS trip lost it)
  spare_rows_p50/p90  d - k, k = the prefix rows executed at receipt = ceil((received -
                      chunk_start) / period), at least 0, at most rows (percentiles as an
                      element of the values, so whole rows); negative = late
  frozen_rows_hist    how many answers froze d rows, d = 0..max_delay
  margin_ms_*         chunk_start + d x period - received
  dds_trip_ns_*       relay publish (header.stamp) -> client callback
  margin_parts_ms     with the admission values the point ran with (`bound`): the mean margin
                      taken apart, per answer exactly margin = reserve + cost_slack +
                      to_row_end - trip: cost_slack = nfe_done x nfe_ns - compute_ns (what the
                      configured cost adds over the request's own compute), to_row_end =
                      chunk_start + d x period - (the bound at nfe_ns, dispatch read as publish
                      - compute_ns): the rounding up to a row, plus what adaptive's cost in use
                      added over nfe_ns, less the publisher's lag; trip as above. d - k is
                      floor(margin / period) (k between 0 and rows), so the median d - k is 1
                      only while the median margin is under two periods: with a reserve of
                      about a period and a half that holds for no cost model at all, since the
                      rounding alone adds half a period on average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from flowedge_relay.core import Code
from flowedge_relay_tools.bench import targets
from flowedge_relay_tools.bench.trace import TraceSpec

DEFAULT_ROWS = (8, 8)
#: --rtc's default NFE range: policy_rtc takes ~70 us per NFE, so the plain trace's 4-16 NFE
#: would offer ~3,000 requests/s at 2x, past the per-request path (intake, DDS both ways, the
#: client: about 1 ms of CPU per request on a 2-core host), and the overload would be the
#: messaging's, not the workers'; 32-128 (mean 80, ~6 ms) keeps 3x near 550 requests/s
NFE = (32, 128)
#: printed, never asserted: at 2x load, both EDF admission policies
TARGETS = targets.RTC
ROW_METRICS = ("rtc_spare_rows_p50",)  # targets counted in rows, not as a ratio


def default_period_ns(spec: TraceSpec, max_delay: int) -> int:
    """slack_min / max_delay (whole microseconds): the window of a full prefix ends at most
    (max_delay + 1) periods after the send, so at or before ~1.25 x slack_min; the trace's own
    deadline binds only for the requests with less slack than that."""
    return int(spec.slack_min_ms * 1000 / max(max_delay, 1)) * 1000


@dataclass(frozen=True)
class RtcTrace:
    """The prefix every request of the trace carries: rows per base-trace index (seeded, so
    every policy and load sees the same), values, period and the served policy's max_delay."""

    period_ns: int
    rows_min: int
    rows_max: int
    max_delay: int
    action_dim: int
    rows: np.ndarray  # per base-trace index
    chunks: np.ndarray  # [16, rows_max, action_dim] float32, cycled by index
    period_rule: str

    @classmethod
    def build(cls, spec: TraceSpec, served, n: int, rows: tuple[int, int] = DEFAULT_ROWS,
              period_ms: float | None = None) -> RtcTrace:  # fmt: skip
        if served.rtc_mode == "off" or served.rtc_max_delay <= 0:
            raise SystemExit("--rtc: the model is served without real-time chunking; use "
                             "--model rtc (models/policy_rtc) or another RTC package")
        lo, hi = rows
        if not 1 <= lo <= hi <= served.action_horizon:
            raise SystemExit(f"--rtc-rows: need 1 <= LO <= HI <= action_horizon "
                             f"{served.action_horizon}, got {lo} {hi}")
        rng = np.random.default_rng([spec.seed, 30])  # its own stream: the base trace unchanged
        if period_ms is None:
            period = default_period_ns(spec, served.rtc_max_delay)
            rule = (f"slack_min {spec.slack_min_ms:g} ms / rtc_max_delay "
                    f"{served.rtc_max_delay}")
        else:
            period, rule = int(period_ms * 1e6), "--rtc-period-ms"
        chunks = rng.uniform(-1.0, 1.0, (16, hi, served.action_dim)).astype(np.float32)
        return cls(period, lo, hi, served.rtc_max_delay, served.action_dim,
                   rng.integers(lo, hi + 1, n), chunks, rule)  # fmt: skip

    def prefix(self, i: int) -> np.ndarray:
        """Request i's prefix: its rows of the seeded chunk, [rows, action_dim]."""
        return self.chunks[i % len(self.chunks), : int(self.rows[i])]

    def window_ns(self, start_ns: int, rows: int) -> int:
        """When the robot has run min(rows, max_delay) prefix rows: the RTC deadline."""
        return start_ns + min(rows, self.max_delay) * self.period_ns

    def describe(self) -> dict:
        rows = (f"{self.rows_min}" if self.rows_min == self.rows_max
                else f"uniform integer in [{self.rows_min}, {self.rows_max}] (seeded)")
        return {
            "action_period_ns": self.period_ns,
            "period_rule": self.period_rule,
            "rows": rows,
            "rows_min": self.rows_min,
            "rows_max": self.rows_max,
            "rtc_max_delay": self.max_delay,
            "prefix_start": "the first multiple of action_period (ROS time) at or after the "
                            "send time: the robot's next row boundary",
            "deadline": "the trace's (send + slack) and the window, chunk_start + "
                        "min(rows, rtc_max_delay) x action_period; on time = by the earlier",
        }  # fmt: skip


def _pct(values: list[float] | np.ndarray, q: float) -> float | None:
    """The q-th percentile as an element of values (numpy's "higher": never between two, so
    the median of whole rows is a whole row, rounded against the relay), None without values."""
    arr = np.asarray(values)
    return float(np.percentile(arr, q, method="higher")) if arr.size else None


def _hist(values: list[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in sorted(values):
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def rows_executed(received_ns: int, start_ns: int, period_ns: int, rows: int) -> int:
    """k: prefix rows i with start + i x period before the receipt, 0..rows."""
    return min(max(0, math.ceil((received_ns - start_ns) / period_ns)), rows)


def measure(client, keys: list, sent: list[tuple[int, int, int]], rtc: RtcTrace,
            bound: tuple[int, int] | None = None) -> dict:  # fmt: skip
    """The RTC figures of one point. `sent`: per key, (prefix_start ns as sent, rows, the
    trace's own deadline ns); `bound`: (nfe_ns, admission_reserve_ns) the point admitted with,
    which takes the margin apart (margin_parts_ms), None without admission."""
    p = rtc.period_ns
    frozen, spare, margin, trip = [], [], [], []
    parts: list[tuple[float, float]] = []  # per answer: cost_slack, to_row_end (ms)
    inference = in_time = late_published_in_time = 0
    over_window = start_mismatch = binding = 0
    for key, (start, rows, deadline) in zip(keys, sent, strict=True):
        binding += rtc.window_ns(start, rows) < deadline
        ans = client.answers.get(key)
        if ans is None or ans.code != Code.INFERENCE:  # INFERENCE only: the others freeze nothing
            continue
        inference += 1
        d = ans.frozen_rows
        over_window += d > min(rows, rtc.max_delay)
        start_mismatch += ans.chunk_start_ns != start
        due = ans.chunk_start_ns + d * p
        ok = ans.received_ns <= due
        in_time += ok
        late_published_in_time += (not ok) and ans.published_ns <= due
        frozen.append(d)
        spare.append(d - rows_executed(ans.received_ns, ans.chunk_start_ns, p, rows))
        margin.append((due - ans.received_ns) / 1e6)
        trip.append(ans.received_ns - ans.published_ns)
        if bound is not None and bound[0] > 0:
            parts.append(_margin_parts(ans, due, *bound))
    offered = len(keys)
    return {
        "inference": inference,
        "in_time": in_time,
        "late": inference - in_time,
        "in_time_ratio": in_time / inference if inference else None,
        "late_published_in_time": late_published_in_time,
        "spare_rows_p50": _pct(spare, 50),
        "spare_rows_p90": _pct(spare, 90),
        "spare_rows_min": min(spare) if spare else None,
        "spare_rows_hist": _hist(spare),
        "frozen_rows_hist": _hist(frozen),
        "frozen_rows_mean": float(np.mean(frozen)) if frozen else None,
        "frozen_over_window": over_window,
        "chunk_start_mismatch": start_mismatch,
        "margin_ms_p50": _pct(margin, 50),
        "margin_ms_p1": float(np.percentile(margin, 1)) if margin else None,
        "margin_ms_min": min(margin) if margin else None,
        "dds_trip_ns_p50": _pct(trip, 50),
        "dds_trip_ns_p99": _pct(trip, 99),
        "dds_trip_ns_max": max(trip) if trip else None,
        "window_binding": binding,
        "window_binding_share": binding / offered if offered else None,
        "margin_parts_ms": _parts_mean(parts, bound, trip),
    }


def _margin_parts(ans, due: int, nfe_ns: int, reserve_ns: int) -> tuple[float, float]:
    """(cost_slack, to_row_end) of one answer in ms: margin = reserve + both - trip."""
    cost_slack = ans.nfe_done * nfe_ns - ans.compute_ns
    floor_bound = ans.published_ns - ans.compute_ns + ans.nfe_done * nfe_ns + reserve_ns
    return cost_slack / 1e6, (due - floor_bound) / 1e6


def _parts_mean(parts: list[tuple[float, float]], bound: tuple[int, int] | None,
                trip: list[int]) -> dict | None:  # fmt: skip
    """The mean margin's parts (means add up, medians need not), None without them."""
    if not parts or bound is None:
        return None
    cost, row = np.asarray(parts).mean(axis=0)
    reserve, trip_ms = bound[1] / 1e6, float(np.mean(trip)) / 1e6
    return {"margin": reserve + cost + row - trip_ms, "reserve": reserve,
            "cost_slack": float(cost), "to_row_end": float(row), "trip": trip_ms}  # fmt: skip


def row_cells(m: dict) -> dict:
    """The RTC columns of one point in the overload table."""
    r = m.get("rtc")
    if r is None:
        return {}
    cell = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    return {
        "rtc_in_time": "-" if r["in_time_ratio"] is None else f"{100 * r['in_time_ratio']:.2f}%",
        "d-k p50/p90": f"{cell(r['spare_rows_p50'])}/{cell(r['spare_rows_p90'])}",
        "d hist": " ".join(f"{k}:{v}" for k, v in r["frozen_rows_hist"].items()) or "-",
        "margin_ms p50/min": (f"{cell(_round(r['margin_ms_p50']))}/"
                              f"{cell(_round(r['margin_ms_min']))}"),  # fmt: skip
        "win_binds": "-" if r["window_binding_share"] is None
        else f"{100 * r['window_binding_share']:.0f}%",
    }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


def fit(report: dict) -> dict:
    """Whether admission can fit a request of the trace's mean NFE into the window at all: its
    bound (mean NFE x nfe_ns + admission_reserve_ns, from an idle lane) against the latest the
    window of the widest prefix ends after the send. When it cannot, all but the shortest
    requests are REJECTED_DEADLINE and the RTC figures are thin or empty: said, not hidden."""
    r, t = report["rtc"], report["trace"]
    mean_nfe = (t["nfe_min"] + t["nfe_max"]) / 2
    bound_ms = (mean_nfe * report["nfe_ns"] + report["admission_reserve_ns"]) / 1e6
    window_ms = (min(r["rows_max"], r["rtc_max_delay"]) + 1) * r["action_period_ns"] / 1e6
    return {"mean_request_bound_ms": bound_ms, "window_after_send_max_ms": window_ms,
            "fits": bound_ms < window_ms}  # fmt: skip


def header(report: dict) -> list[str]:
    """The table's lines on the RTC trace: period, rows, what the d bound used, and whether a
    mean request fits the window under it."""
    r = report["rtc"]
    f = fit(report)
    lines = [
        f"rtc: every request carries a prefix of {r['rows']} rows, action_period "
        f"{r['action_period_ns'] / 1e6:g} ms ({r['period_rule']}), rtc_max_delay "
        f"{r['rtc_max_delay']}; prefix_start on the period grid at or after the send; d from "
        f"admission's bound with nfe_ns={report['nfe_ns']} admission_reserve_ns="
        f"{report['admission_reserve_ns']} (calibrate's real-time chunking values unless given: "
        "the p99 request per NFE and the answer's way out; work past the bound expires at its "
        "switch row); rtc_in_time = received by chunk_start + d x period; d-k = frozen rows "
        "minus rows run at receipt",
    ]
    trips = [m["rtc"] for by_load in report["policies"].values() for m in by_load.values()
             if m.get("rtc") and m["rtc"]["dds_trip_ns_max"] is not None]  # fmt: skip
    if trips:
        top = max(trips, key=lambda x: x["dds_trip_ns_max"])
        p99 = max(x["dds_trip_ns_p99"] for x in trips)
        reserve = report["admission_reserve_ns"]
        lines.append(
            f"reserve vs the answers' DDS trip (relay publish -> client callback): reserve "
            f"{reserve / 1e6:.2f} ms, trip p99 up to {p99 / 1e6:.2f} ms, max "
            f"{top['dds_trip_ns_max'] / 1e6:.2f} ms: the reserve "
            + ("covers it" if top["dds_trip_ns_max"] <= reserve else
               "does not cover it alone (nfe_ns's margin over the real cost may)"))
    for policy, by_load in report["policies"].items():
        for load, m in by_load.items():
            x = (m.get("rtc") or {}).get("margin_parts_ms")
            if x:
                lines.append(
                    f"d-k parts, {policy} {load}x (mean ms): margin {x['margin']:.1f} = reserve "
                    f"{x['reserve']:.1f} + cost slack {x['cost_slack']:.1f} + to the row end "
                    f"{x['to_row_end']:.1f} - trip {x['trip']:.1f}; d-k = floor(margin / "
                    f"{r['action_period_ns'] / 1e6:g} ms)")
    if not f["fits"]:
        lines.append(
            f"WARNING: a mean request's admission bound ({f['mean_request_bound_ms']:.1f} ms) is "
            f"longer than the RTC window can be ({f['window_after_send_max_ms']:g} ms after the "
            "send): EDF admission rejects all but the shortest RTC requests, and d is the window's "
            "end; the calibration measured a stalling host")
    return lines

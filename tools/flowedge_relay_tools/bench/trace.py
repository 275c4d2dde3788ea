# SPDX-License-Identifier: Apache-2.0
"""The seeded arrival trace the overload bench replays (same trace for every policy).

One base trace is drawn once from `seed`: for request i a unit-mean exponential gap, a session
(uniform over `sessions`), an NFE count (uniform integer in [nfe_min, nfe_max]), a deadline slack
(uniform in [slack_min_ms, slack_max_ms], counted from the moment the client publishes it) and a
noise seed. Offered load L replays the same sequence with gaps scaled to a Poisson rate of
L x capacity and keeps the requests that arrive within `duration_s`, so every policy at load L
sees identical requests at identical offsets, and higher loads see a prefix of the same sequence,
compressed in time.

capacity (requests/s) = workers / (mean NFE of the distribution x measured ns per NFE).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class TraceSpec:
    seed: int = 7
    sessions: int = 4
    nfe_min: int = 4
    nfe_max: int = 16
    slack_min_ms: float = 40.0
    slack_max_ms: float = 160.0

    @property
    def mean_nfe(self) -> float:
        return (self.nfe_min + self.nfe_max) / 2

    def describe(self) -> dict:
        d = asdict(self)
        d["arrivals"] = "Poisson (exponential gaps), rate = load x capacity"
        d["session"] = f"uniform over {self.sessions} sessions, one generation each (no staleness)"
        d["nfe"] = f"uniform integer in [{self.nfe_min}, {self.nfe_max}], mean {self.mean_nfe:g}"
        d["deadline"] = (
            f"send time + uniform({self.slack_min_ms:g}, {self.slack_max_ms:g}) ms"
        )
        return d


@dataclass(frozen=True)
class Arrival:
    offset_ns: int  # from the start of the point
    session: str
    nfe: int
    slack_ns: int
    noise_seed: int


class Trace:
    def __init__(self, spec: TraceSpec, max_requests: int = 200_000) -> None:
        self.spec = spec
        rng = np.random.default_rng(spec.seed)
        self.gaps = rng.exponential(1.0, max_requests)
        self.cum = np.cumsum(self.gaps)
        self.session = rng.integers(0, spec.sessions, max_requests)
        self.nfe = rng.integers(spec.nfe_min, spec.nfe_max + 1, max_requests)
        self.slack_ms = rng.uniform(spec.slack_min_ms, spec.slack_max_ms, max_requests)
        self.noise_seed = rng.integers(0, 2**31, max_requests)

    def at_load(self, rate_per_s: float, duration_s: float) -> list[Arrival]:
        """The arrivals within duration_s when the base sequence runs at rate_per_s."""
        if rate_per_s <= 0:
            return []
        times = self.cum / rate_per_s
        n = int(np.searchsorted(times, duration_s, side="left"))
        if n >= len(times):
            raise ValueError("trace too short for this rate and duration; raise max_requests")
        return [
            Arrival(
                offset_ns=int(times[i] * 1e9),
                session=f"bench-s{int(self.session[i])}",
                nfe=int(self.nfe[i]),
                slack_ns=int(self.slack_ms[i] * 1e6),
                noise_seed=int(self.noise_seed[i]),
            )
            for i in range(n)
        ]


def capacity_rps(workers: int, mean_nfe: float, ns_per_nfe: float) -> float:
    """Requests per second the workers can complete at ns_per_nfe per NFE."""
    return workers / (mean_nfe * ns_per_nfe * 1e-9)

# SPDX-License-Identifier: Apache-2.0
"""Robustness campaigns on a real relay over real DDS: hostile input, soak, faults.

    python -m flowedge_relay_tools.stress malformed --messages 20000 --json out/malformed.json
    python -m flowedge_relay_tools.stress malformed --rate 2500 --duration 30 \
        --json out/flood.json
    python -m flowedge_relay_tools.stress soak --duration 600 --json out/soak.json \
        --plot out/soak.png
    python -m flowedge_relay_tools.stress faults --json out/faults.json

A real `RelayNode` (request thread, main executor, workers, publisher thread;
`harness.running_relay`) and a client node run in this process, over DDS on this host. With
`--rate` the hostile requests come from a second process (`stress produce`, paced by wall clock)
so the producer does not share the relay's interpreter. The same scenario functions back
`test/test_robustness.py`, so the CI tests and the figures a reviewer reruns are one code path.

One job per module: probes.py (the hostile requests and their oracle), flood.py (the hostile-input
campaign, `malformed`, with or without `--rate`, and the `produce` process), soak.py, faults.py,
report.py (the figures a campaign reports, assembled once), __main__.py (the command line).

How "exactly once" is checked: every generated request has a unique index. The index is the
sequence number (BASE + index) or, for probes whose sequence is deliberately UINT64_MAX, part of
a session id of their own. Answers are counted per index in preallocated arrays, together with a
CRC of the session id the answer must carry, so the bookkeeping neither grows during the run (RSS
stays meaningful) nor misattributes an answer.

What the relay must do with each probe is what its builder made it (`Oracle`), never a second
opinion from the relay's own code: valid requests must be answered once (EXPIRED when built past
their deadline), requests broken in one named field must be discarded and counted under that
reason, and raw CDR, whose fate is unknown by construction, must be either dropped by the
middleware, discarded and counted, or answered once. Figures: `valid_lost`, `duplicates`,
`unexpected_answers`, `middleware_lost`, next to the per-reason counts and RSS.
"""

from flowedge_relay_tools.stress.faults import (
    exactly_once,
    fault_bad_model,
    fault_burst,
    fault_consumer_stops,
    fault_many_sessions,
    fault_slow_worker,
    fault_worker_dies,
    level,
    run_faults,
)
from flowedge_relay_tools.stress.flood import (
    FloodBook,
    malformed_ok,
    pace,
    produce,
    producer_command,
    run_flood,
    run_malformed,
)
from flowedge_relay_tools.stress.probes import (
    BASE_SEQ,
    MIXES,
    Contract,
    Oracle,
    Probe,
    ProbeFactory,
    RequestBuilder,
)
from flowedge_relay_tools.stress.report import (
    campaign_report,
    judge,
    lost,
    received,
    relay_threads_alive,
    rss_bytes,
)
from flowedge_relay_tools.stress.soak import (
    AnswerBook,
    SoakTraffic,
    measure_capacity,
    plot_soak,
    run_soak,
    soak_ok,
)

__all__ = [
    "BASE_SEQ", "MIXES", "AnswerBook", "Contract", "FloodBook", "Oracle", "Probe", "ProbeFactory",
    "RequestBuilder", "SoakTraffic", "campaign_report", "exactly_once", "fault_bad_model",
    "fault_burst", "fault_consumer_stops", "fault_many_sessions", "fault_slow_worker",
    "fault_worker_dies", "judge", "level", "lost", "malformed_ok", "measure_capacity", "pace",
    "plot_soak", "produce", "producer_command", "received", "relay_threads_alive", "rss_bytes",
    "run_faults", "run_flood", "run_malformed", "run_soak", "soak_ok",
]

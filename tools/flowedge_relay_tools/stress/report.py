# SPDX-License-Identifier: Apache-2.0
"""The figures a hostile-input campaign reports, read from the relay and this process, and the
one place its report is assembled (`campaign_report`), whichever campaign ran it (flood.py:
the producer in this process, or a producer process at a fixed rate).

Figures: `valid_lost`, `duplicates`, `unexpected_answers`, `middleware_lost`, next to the
per-reason counts and RSS. Answers are counted per probe index in preallocated arrays (the
book), so the bookkeeping neither grows during a run (RSS stays meaningful) nor misattributes
an answer; `judge` holds them against what the builder made (probes.Oracle).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flowedge_relay.core import CODE_KEYS
from flowedge_relay_tools.stress.probes import (
    EXPIRED_CODE,
    INVALID,
    NOT_SENT,
    RAW,
    VALID_ANY,
    VALID_EXPIRED,
    Oracle,
)

MB = 1024 * 1024


def rss_bytes() -> int:
    """Resident set size of this process (relay + client + DDS), from /proc."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def relay_threads_alive(node) -> dict[str, bool]:
    """Liveness of every relay thread that must survive hostile input."""
    return {"request": node.requests.alive, **node.relay.threads_alive()}


def received(node) -> int:
    """Requests the relay's callback has seen (valid or not)."""
    return node.relay.counters().received


def lost(node) -> int:
    """Requests the middleware reported lost before the relay's callback."""
    return node.relay.counters().middleware_lost


def param(node, name: str):
    return node.get_parameter(name).value


@dataclass
class RelayMark:
    """The relay's intake counters when a campaign starts: what it received, what the
    middleware reported lost, what its intake discarded per reason."""

    received: int
    lost: int
    discarded: dict = field(default_factory=dict)

    @classmethod
    def of(cls, node) -> RelayMark:
        return cls(received(node), lost(node), node.relay.counters().discarded)

    def received_since(self, node) -> int:
        return received(node) - self.received

    def lost_since(self, node) -> int:
        return lost(node) - self.lost

    def reasons_since(self, node) -> dict[str, int]:
        """Discards per reason (validation.Reason value) since the mark."""
        return {r: c - self.discarded[r] for r, c in node.relay.counters().discarded.items()}


def judge(oracle: Oracle, book) -> dict:
    """Exactly-once against what the builder made (see probes.Oracle); `book` is a
    flood.FloodBook."""
    e, c = oracle.expect, book.count
    valid = (e == VALID_ANY) | (e == VALID_EXPIRED)
    answered_valid = valid & (c > 0)
    wrong_session = answered_valid & (book.crc != oracle.sid_crc)
    expired = e == VALID_EXPIRED
    return {
        "valid_sent": int(valid.sum()),
        "valid_past_deadline_sent": int(expired.sum()),
        "valid_answered_exactly_once": int((valid & (c == 1) & ~wrong_session).sum()),
        "valid_lost": int((valid & (c == 0)).sum()),
        "duplicates": int((valid & (c > 1)).sum() + (((e == RAW) & (c > 1)).sum())),
        "unexpected_answers": int(c[(e == INVALID) | (e == NOT_SENT)].sum())
        + book.unattributed + int(wrong_session.sum()),
        "past_deadline_not_expired": int((expired & (c > 0) & (book.code != EXPIRED_CODE)).sum()),
        "raw_sent": int((e == RAW).sum()),
        "raw_answered": int(((e == RAW) & (c > 0)).sum()),
    }


def _close_accounting(fig: dict, oracle: Oracle, got_reasons: dict[str, int]) -> None:
    """Every message the relay received is answered or counted, per reason; raw CDR that the
    middleware delivered accounts for any excess over what the builder broke on purpose."""
    typed_sent = int(((oracle.expect != NOT_SENT) & (oracle.expect != RAW)).sum())
    raw_delivered = fig["relay_received"] - typed_sent
    excess = {k: got_reasons.get(k, 0) - oracle.reasons.get(k, 0)
              for k in set(got_reasons) | set(oracle.reasons)}
    fig["invalid_built_by_reason"] = dict(sorted(oracle.reasons.items()))
    fig["invalid_counted_by_reason"] = {k: v for k, v in sorted(got_reasons.items()) if v}
    fig["raw_delivered"] = raw_delivered
    fig["undeliverable_raw"] = fig["raw_sent"] - raw_delivered
    fig["invalid_counts_match_builder"] = all(v >= 0 for v in excess.values()) and (
        sum(excess.values()) == raw_delivered - fig["raw_answered"])


def _relay_figures(h, got_reasons: dict[str, int]) -> dict:
    from flowedge_relay_tools.harness import status_values

    node = h.node
    stats = node.relay.core.stats()
    status = h.latest_status("admission")
    diag = status_values(status) if status else {}
    alive = relay_threads_alive(node)
    return {
        "diagnostics_invalid_discarded": int(diag.get("invalid_discarded", -1)),
        "diagnostics_by_reason": {k[len("invalid."):]: int(v) for k, v in diag.items()
                                  if k.startswith("invalid.") and v != "0"},
        "diagnostics_middleware_lost": diag.get("middleware_lost", ""),
        "core_refused": got_reasons.get("core_refused", 0),
        "coalesced": stats.coalesced,
        "output_drops": stats.rejection_outputs_dropped + stats.action_outputs_dropped,
        "threads_alive": alive,
        "crashes": sum(1 for a in alive.values() if not a) + got_reasons.get("core_refused", 0),
    }


def answers_by_code(book) -> dict[str, int]:
    return dict(zip(CODE_KEYS, map(int, book.codes), strict=True))


def campaign_report(h, mark: RelayMark, oracle: Oracle, book, *, mix: str, head: dict,
                    hangs: int, rss_warm: int, rss_end: int, rss_max: int | None = None,
                    tail: dict | None = None) -> dict:
    """The report of one hostile-input campaign: `mix`, the campaign's own leading figures
    (`head`), what the relay received and the middleware lost since `mark`, the exactly-once
    judgement, answers by code, the relay's own figures, hangs, RSS (MB; the growth is None
    without a warm reading), the campaign's trailing figures (`tail`), then the per-reason
    accounting."""
    node = h.node
    got_reasons = mark.reasons_since(node)
    rss = {"rss_warm_mb": round(rss_warm / MB, 2)}
    if rss_max is not None:
        rss["rss_max_mb"] = round(rss_max / MB, 2)
    rss["rss_end_mb"] = round(rss_end / MB, 2)
    rss["rss_growth_mb"] = round((rss_end - rss_warm) / MB, 2) if rss_warm else None
    fig = {
        "mix": mix,
        **head,
        "kinds": dict(sorted(oracle.kinds.items())),
        "relay_received": mark.received_since(node),
        "middleware_lost": mark.lost_since(node),
        **judge(oracle, book),
        "answers_by_code": answers_by_code(book),
        **_relay_figures(h, got_reasons),
        "hangs": hangs,
        **rss,
        **(tail or {}),
    }
    _close_accounting(fig, oracle, got_reasons)
    return fig

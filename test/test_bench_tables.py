# SPDX-License-Identifier: Apache-2.0
"""The benches' readable tables (flowedge_relay_tools/bench/tables.py)."""

from __future__ import annotations

from flowedge_relay_tools.bench.tables import format_rows


def test_every_column_any_row_has_is_in_the_header():
    """A point that measured nothing (no NFE ran) has fewer keys than the others: the columns of
    the later rows still show, its own cells empty (nfe-breakdown on a swamped host)."""
    rows = [{"variant": "a", "nfes": 0}, {"variant": "b", "nfes": 3, "gil_wait_p99": 1.5}]
    text = format_rows(rows)
    header = text.splitlines()[0].split()
    assert header == ["variant", "nfes", "gil_wait_p99"]
    assert text.splitlines()[3].split() == ["b", "3", "1.5"]
    md = format_rows(rows, markdown=True)
    assert md.splitlines()[0] == "| variant | nfes | gil_wait_p99 |"

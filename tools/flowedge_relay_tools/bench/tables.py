# SPDX-License-Identifier: Apache-2.0
"""Plain-text and Markdown tables from a list of dicts (bench reports keep their rows as such),
and the cells and target verdicts the benches print alike."""

from __future__ import annotations

#: a target's `met` as the tables print it (None: not measured)
VERDICT = {True: "met", False: "MISSED", None: "n/a"}


def percent(v: float | None) -> str:
    """A ratio as a percentage with two decimals; "-" when there is none."""
    return "-" if v is None else f"{100 * v:.2f}%"


def target_met(value: float | None, op: str, bound: float) -> bool | None:
    """Whether `value` meets the target `op bound` (">=" or "<="); None when not measured."""
    return None if value is None else (value >= bound if op == ">=" else value <= bound)


def bound_text(target: tuple[str, float]) -> str:
    """A ratio target as the tables state it: (">=", 0.9999) -> ">= 99.99%"."""
    op, bound = target
    return f"{op} {100 * bound:g}%"


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
    return "-" if value is None else str(value)


def format_rows(rows: list[dict], markdown: bool = False) -> str:
    """Aligned columns, the header every key any row has (in first-seen order; a row without a
    key shows it empty); `markdown=True` for README use."""
    if not rows:
        return "(no rows)"
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[_cell(r.get(k)) for k in keys] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
        lines += ["| " + " | ".join(c) + " |" for c in cells]
        return "\n".join(lines)
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    fmt = lambda row: "  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True))  # noqa: E731
    return "\n".join([fmt(keys), fmt(["-" * w for w in widths])] + [fmt(c) for c in cells])

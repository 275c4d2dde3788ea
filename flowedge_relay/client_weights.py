# SPDX-License-Identifier: Apache-2.0
"""client_weights' rules (docs/design.md §7.1), parsed without ROS: the core's config reads them
(serving.py) and the parameter check refuses a bad one (parameters.py)."""

from __future__ import annotations

WEIGHT_MAX = 1_000_000  # csrc/fer.h FER_WEIGHT_MAX
WEIGHT_RULES = 32  # csrc/fer.h FER_WEIGHT_RULES
CLIENT_ID_MAX_BYTES = 64  # csrc/fer.h FER_SESSION_ID_MAX: a pattern is at most an id long


def parse_client_weights(rules) -> tuple[tuple[str, int], ...]:
    """client_weights' "pattern=weight" strings as (pattern, weight) pairs, in order; ValueError
    saying which rule is wrong (docs/design.md §7.1)."""
    out = []
    if len(rules or ()) > WEIGHT_RULES:
        raise ValueError(f"client_weights holds at most {WEIGHT_RULES} rules, got {len(rules)}")
    for rule in rules or ():
        pattern, sep, weight = rule.rpartition("=")
        if not sep or not pattern or len(pattern.encode()) > CLIENT_ID_MAX_BYTES:
            raise ValueError(f'client_weights: {rule!r} is not "pattern=weight" with a pattern '
                             f"of 1..{CLIENT_ID_MAX_BYTES} bytes")
        try:
            value = int(weight)
        except ValueError:
            value = 0
        if not 1 <= value <= WEIGHT_MAX:
            raise ValueError(f"client_weights: the weight in {rule!r} must be an integer in "
                             f"1..{WEIGHT_MAX}")
        out.append((pattern, value))
    return tuple(out)

# SPDX-License-Identifier: Apache-2.0
"""`bench pool` (d)'s arithmetic, without DDS: a process's CPU time read from /proc, the pool's
decisions/s with one core per member, the split of a member's CPU between owned decisions and
not_owner drops, and how a ramp's steps make a ceiling.

The figures are measurements; what is checked here is that the arithmetic they come from is
right, on hand-worked cases, and that /proc is read right against a real process.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from flowedge_relay_tools.bench import pool
from flowedge_relay_tools.bench.host import cpu_seconds, proc_stat_cpu_seconds

#: a child that names itself with spaces and parentheses (its comm, /proc/<pid>/stat field 2),
#: spins until it has used SPIN_S of CPU, says so, and waits for its stdin to close
SPIN_S = 0.3
CHILD = f"""
import sys, time
with open("/proc/self/comm", "w") as f:
    f.write("a) 1 2 (b")
while time.process_time() < {SPIN_S}:
    pass
print("spun", flush=True)
sys.stdin.read()
"""


def test_cpu_seconds_reads_a_real_process_whose_name_has_parentheses():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout.readline() == "spun\n"
        with open(f"/proc/{child.pid}/stat") as f:
            stat = f.read()
        assert "(a) 1 2 (b)" in stat  # the name that would shift a naive split of the fields
        used = proc_stat_cpu_seconds(stat)
        # at least what it spun (less a clock tick); its start-up is on top, but not seconds
        assert SPIN_S - 0.02 <= used < SPIN_S + 2.0, used
        assert cpu_seconds(child.pid) >= used
    finally:
        child.stdin.close()
        child.wait(30)


def test_cpu_seconds_of_this_process_follows_its_own_clock():
    before, own = cpu_seconds(), time.process_time()
    while time.process_time() - own < 0.1:
        pass
    assert cpu_seconds() - before >= 0.1 - 0.02  # a tick's resolution


def test_capacity_per_core_is_bounded_by_the_busiest_member():
    # both members take the same 1,000 requests in a 1 s step and decide half each; at rest
    # each uses 0.1 of a core. Member 0's load costs 0.2 s (200 us a request: 4,500/s on the
    # 0.9 of a core left), member 1's 0.3 s (3,000/s).
    per = {"0": {"received": 1000, "decided": 500, "cpu_s": 0.3, "idle_share": 0.1},
           "1": {"received": 1000, "decided": 500, "cpu_s": 0.4, "idle_share": 0.1}}
    c = pool.capacity_per_core(per, 1.0)
    assert c["sum_per_s"] == pytest.approx(500 * 4.5 + 500 * 3.0)
    # every member takes every request: the pool takes no more than member 1's 3,000/s
    assert c["bound_per_s"] == pytest.approx(3000.0)
    assert c["capacity_per_s"] == pytest.approx(3000.0) and c["bounded_by"] == "1"


def test_capacity_per_core_of_one_member_is_its_requests_per_cpu_second():
    per = {"0": {"received": 2000, "decided": 2000, "cpu_s": 0.5, "idle_share": 0.0}}
    c = pool.capacity_per_core(per, 2.0)
    assert c["capacity_per_s"] == pytest.approx(4000.0) and c["bounded_by"] is None


def test_capacity_per_core_is_none_when_the_load_did_not_register():
    per = {"0": {"received": 100, "decided": 50, "cpu_s": 0.5, "idle_share": 0.0},
           "1": {"received": 100, "decided": 50, "cpu_s": 0.1, "idle_share": 0.1}}
    assert pool.capacity_per_core(per, 1.0)["capacity_per_s"] is None  # member 1: 0 s of load
    assert pool.capacity_per_core({}, 1.0)["capacity_per_s"] is None


def test_drop_cost_is_the_cpu_left_after_the_decisions_per_drop():
    # 0.3 s of load, 500 decisions at 400 us (0.2 s): 0.1 s over 1,000 drops
    assert pool.drop_cost_us(0.3, 500, 1000, 400.0) == pytest.approx(100.0)
    assert pool.drop_cost_us(0.3, 500, 1000, None) is None
    assert pool.drop_cost_us(0.3, 500, 0, 400.0) is None


def test_fit_costs_recovers_the_decision_and_the_drop():
    a, b = 50.0, 5.0  # us
    cost = lambda d, o: (a * d + b * o) / 1e6  # noqa: E731
    points = [(1000, 0, cost(1000, 0)), (500, 500, cost(500, 500)), (490, 510, cost(490, 510)),
              (250, 750, cost(250, 750))]
    assert pool.fit_costs(points) == pytest.approx((a, b))
    # one pool size splits every member alike: decision and drop cannot be told apart
    assert pool.fit_costs([(500, 500, 0.0275), (500, 500, 0.0275)]) is None
    assert pool.fit_costs([]) is None


def step(rate: float, offered: float | None = None, **counts) -> dict:
    s = {"rate": rate, "offered_per_s": rate if offered is None else offered,
         "pool_decided_per_s": rate, **{k: 0 for k in pool.SHORT_IF}, **counts}
    s["short"] = pool.shortfalls(s)
    return s


def test_a_step_is_short_for_any_loss_or_a_sender_behind():
    assert step(1000.0)["short"] == []
    assert step(1000.0, offered=0.96 * 1000)["short"] == []
    assert step(1000.0, offered=900.0, middleware_lost=3)["short"] == [
        "middleware_lost 3", "sender behind (900/s of 1000/s)"]
    for k in pool.SHORT_IF:
        assert step(1000.0, **{k: 1})["short"] == [f"{k} 1"]


def test_the_ceiling_is_the_highest_rate_answered_in_full():
    steps = [step(2000.0), step(4000.0), step(8000.0, unanswered=5), step(6000.0)]
    z = pool.ceiling(2, steps, 8000.0)
    assert z["ceiling_rate"] == 6000.0 and z["first_short_rate"] == 8000.0
    assert z["first_short_why"] == ["unanswered 5"] and not z["ramp_top"]
    top = pool.ceiling(1, [step(2000.0), step(8000.0)], 8000.0)
    assert top["ceiling_rate"] == 8000.0 and top["ramp_top"]  # never short: the ramp's top
    none = pool.ceiling(4, [step(2000.0, duplicated=1)], 8000.0)
    assert none["ceiling_rate"] == 0.0 and none["first_short_rate"] == 2000.0


def test_sizes_compare_at_the_highest_rate_all_answered_in_full():
    one = pool.ceiling(1, [step(2000.0), step(4000.0), step(8000.0)], 8000.0)
    two = pool.ceiling(2, [step(2000.0), step(4000.0), step(8000.0, unanswered=1)], 8000.0)
    assert pool.common_rate([one, two]) == 4000.0
    assert pool.step_at(two, 4000.0)["rate"] == 4000.0 and pool.step_at(two, 8000.0) is None
    assert pool.common_rate([pool.ceiling(1, [step(2000.0, unanswered=1)], 2000.0)]) is None
    assert pool.grows([1.0, 2.0, 3.0]) is True and pool.grows([1.0, 3.0, 2.0]) is False
    assert pool.grows([1.0]) is None and pool.grows([1.0, None]) is None


def test_the_split_uses_the_pool_of_one_at_the_same_rate_in_full():
    def measured(rate, decided, not_owner, load_s, short=()):
        return {"rate": rate, "short": list(short), "decided": decided, "not_owner": not_owner,
                "load_cpu_s": load_s}

    one = {"members": 1, "steps": [measured(1000.0, {"0": 1000}, {"0": 0}, {"0": 0.05}),
                                   measured(2000.0, {"0": 1500}, {"0": 0}, {"0": 0.5},
                                            short=["unanswered 500"])]}
    two = {"members": 2, "steps": [
        measured(1000.0, {"0": 500, "1": 500}, {"0": 500, "1": 500}, {"0": 0.0275, "1": 0.03}),
        measured(2000.0, {"0": 1000, "1": 1000}, {"0": 1000, "1": 1000}, {"0": 0.1, "1": 0.1})]}
    pool.intake_costs_split([two, one])
    s = two["steps"][0]
    assert s["decision_us"] == pytest.approx(50.0)
    assert s["not_owner_us"] == pytest.approx({"0": 5.0, "1": 10.0})
    assert s["not_owner_over_decision"] == pytest.approx({"0": 0.1, "1": 0.2})
    # the pool of one was short at 2,000/s: no decision to take off there
    assert two["steps"][1]["decision_us"] is None
    assert two["steps"][1]["not_owner_us"] == {"0": None, "1": None}

# SPDX-License-Identifier: Apache-2.0
"""Spill on capacity in a relay pool of real `flowedge-relayd` processes over real DDS
(docs/design.md §13.5).

Three relays of one pool with `pool_spill: true`, one worker each, a queue of 2 and a slow step
(the drill relay's fault_nfe_delay_ms: 200 ms a request), so an owner is pushed past its
capacity on purpose by a burst of its own sessions while their successors are idle. The sessions
are picked from the members' relay_ids with the rendezvous ranking computed here, so the owner
and the successor of each request are known in advance. Every request is counted in the answers
(exactly once, by whom, with which code).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from core_helpers import wait_for
from flowedge_relay_msgs.msg import RelayStats
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from test_pool import (
    NFE_DELAY_MS,
    NS,
    RELAYS,
    PoolClient,
    fnv1a64,
    mix64,
    pool_client,
    relay_args,
)

from flowedge_relay.core import Code
from flowedge_relay.timebase import ros_time
from flowedge_relay_tools.harness import build_request

pytestmark = pytest.mark.ros

QUEUE = 2  # a member holds 1 running + 2 queued; a 4th request at once is a capacity rejection
OWNER = 0


def spill_args(i: int) -> list[str]:
    return relay_args(i) + ["-p", "pool_spill:=true", "-p", f"queue_capacity:={QUEUE}"]


def ranked(session: str, relay_ids: list[str]) -> list[str]:
    """relay_ids by the session's rendezvous ranking (owner first, then its successor), computed
    here apart from the relays' C pool."""
    h = fnv1a64(session.encode())
    key = {r: mix64(fnv1a64(r.encode())) for r in relay_ids}
    return sorted(relay_ids, key=lambda r: (mix64(key[r] ^ h), key[r]), reverse=True)


def sessions_with(ids: list[str], owner: str, successor: str, n: int, prefix: str) -> list[str]:
    """n session ids that `owner` owns and `successor` would serve next."""
    got, k = [], 0
    while len(got) < n:
        s = f"{prefix}{k}"
        k += 1
        if ranked(s, ids)[:2] == [owner, successor]:
            got.append(s)
    return got


@pytest.fixture(scope="module")
def spill_pool(tmp_path_factory):
    from relayd import relayds

    tmp = tmp_path_factory.mktemp("spill")
    with relayds(tmp, *[spill_args(i) for i in range(RELAYS)]) as procs, \
            pool_client("pool_spill_client") as (client, ids):
        # every member's window open for origin stamps a few seconds old (the aged request)
        with client.lock:
            start = max(m.owning_from.sec * 10**9 + m.owning_from.nanosec
                        for m in client.members.values())
        assert wait_for(lambda: client.now() > start + 3_000_000_000, 30)
        yield client, procs, ids


def counter(client: PoolClient, i: int, name: str) -> int:
    with client.lock:
        return int(client.status.get(f"{NS[1:]}/r{i}/flowedge_relay", {}).get(name, 0))


def set_parameter(client: PoolClient, i: int, name: str, value: ParameterValue) -> None:
    """A parameter of relay i, set live through its parameter service (returns once set)."""
    cli = client.node.create_client(SetParameters, f"{NS}/r{i}/flowedge_relay/set_parameters")
    try:
        assert cli.wait_for_service(timeout_sec=30)
        future = cli.call_async(SetParameters.Request(parameters=[Parameter(name=name,
                                                                            value=value)]))
        assert wait_for(future.done, 30, 0.05)
        assert future.result().results[0].successful, future.result().results[0].reason
    finally:
        client.node.destroy_client(cli)


def set_spill(client: PoolClient, i: int, on: bool) -> None:
    """pool_spill on relay i, set live."""
    set_parameter(client, i, "pool_spill",
                  ParameterValue(type=ParameterType.PARAMETER_BOOL, bool_value=on))


def burst(client: PoolClient, sessions: list[str]) -> list[tuple[str, int]]:
    """One request of each session, back to back, each sent once (no deadline)."""
    return [client.send(s) for s in sessions]


def answers_of(client: PoolClient, keys: list[tuple[str, int]]) -> dict[tuple[str, int], list]:
    with client.lock:
        got: dict[tuple[str, int], list] = {k: [] for k in keys}
        for a, _ in client.answers:
            if (a.session_id, a.sequence) in got:
                got[(a.session_id, a.sequence)].append(a)
    return got


def test_an_owner_past_capacity_spills_to_the_successor_who_answers_once_with_actions(
        spill_pool):
    """5 requests of the owner's sessions at once (its capacity: 1 running + 2 queued): the ones
    it would answer REJECTED_CAPACITY are handed to their sessions' successors, idle, which
    answer them with actions; every request is answered exactly once, all with actions, and the
    owner's spilled_out is the successors' spilled_in."""
    client, _, ids = spill_pool
    client.reset()
    owner = ids[OWNER]
    b, c = (r for r in ids if r != owner)
    to_b = sessions_with(ids, owner, b, 3, "spb")
    to_c = sessions_with(ids, owner, c, 2, "spc")
    out0 = counter(client, OWNER, "spilled_out")
    ins0 = sum(counter(client, i, "spilled_in") for i in range(RELAYS))
    keys = burst(client, [to_b[0], to_c[0], to_b[1], to_c[1], to_b[2]])
    client.assert_exactly_once()
    got = answers_of(client, keys)
    assert all(a[0].code == Code.INFERENCE for a in got.values()), \
        {k: a[0].code for k, a in got.items()}
    spilled = {k: a[0].relay_id for k, a in got.items() if a[0].relay_id != owner}
    assert len(spilled) >= 2, "the owner answered all: it was never past its capacity"
    assert all(r == ranked(k[0], ids)[1] for k, r in spilled.items())  # each by its successor
    assert all(a[0].relay_id in (owner, ranked(k[0], ids)[1]) for k, a in got.items())
    assert wait_for(lambda: counter(client, OWNER, "spilled_out") - out0 == len(spilled), 10)
    assert wait_for(lambda: sum(counter(client, i, "spilled_in") for i in range(RELAYS)) - ins0
                    == len(spilled), 10)
    print(f"{len(spilled)} of {len(keys)} spilled and answered by the successors")


def test_rejected_deadline_and_stale_are_never_spilled(spill_pool):
    """With the owner past its capacity, a stale request (an older generation than the one it
    accepted) and a retry whose age beats its slack are answered by the owner itself,
    REJECTED_STALE and REJECTED_DEADLINE, never handed over."""
    client, _, ids = spill_pool
    client.reset()
    owner = ids[OWNER]
    b = next(r for r in ids if r != owner)
    stale_s, aged_s, *fill = sessions_with(ids, owner, b, 5, "spd")
    first = build_request(client.model, client.now(), session_id=stale_s, sequence=1,
                          generation=2)
    with client.lock:
        client.sent[(stale_s, 1)] = client.now()
    client.pub.publish(first)
    assert wait_for(lambda: answers_of(client, [(stale_s, 1)])[(stale_s, 1)], 30, 0.02)
    keys = burst(client, fill)  # 3 of the owner's: it is full now
    now = client.now()
    stale = build_request(client.model, now, session_id=stale_s, sequence=2, generation=1)
    aged = build_request(client.model, now - 2_000_000_000, session_id=aged_s, sequence=1,
                         retry_count=1)
    aged.deadline = ros_time(now + 500_000_000)  # 0.5 s of slack, 2 s of age
    for msg in (stale, aged):
        with client.lock:
            client.sent[(msg.session_id, msg.sequence)] = now
        client.pub.publish(msg)
    client.assert_exactly_once()
    got = answers_of(client, [(stale_s, 2), (aged_s, 1)])
    assert [(a[0].code, a[0].relay_id) for a in got.values()] == [
        (Code.REJECTED_STALE, owner), (Code.REJECTED_DEADLINE, owner)]
    assert len(keys) == 3


def test_with_spill_off_the_owner_answers_capacity_itself(spill_pool):
    """pool_spill set false live on the owner: the same burst past its capacity is answered by
    the owner alone, REJECTED_CAPACITY for what it cannot hold, as a pool without spill does;
    nothing is handed over. Set true again, it spills again."""
    client, _, ids = spill_pool
    client.reset()
    owner = ids[OWNER]
    b = next(r for r in ids if r != owner)
    sessions = sessions_with(ids, owner, b, 5, "spo")
    out0 = counter(client, OWNER, "spilled_out")
    set_spill(client, OWNER, False)
    try:
        keys = burst(client, sessions)
        client.assert_exactly_once()
    finally:
        set_spill(client, OWNER, True)
    got = answers_of(client, keys)
    assert all(a[0].relay_id == owner for a in got.values())
    codes = [a[0].code for a in got.values()]
    assert Code.REJECTED_CAPACITY in codes, codes
    time.sleep(1.5)  # the 1 Hz pool status
    assert counter(client, OWNER, "spilled_out") == out0


HOLD_NFE = 30  # a filler's NFEs: at HOLD_MS each it holds its worker 30 s unless released
HOLD_MS = 1000


def send_long(client: PoolClient, session: str) -> tuple[str, int]:
    """A session's one request of HOLD_NFE NFEs (no deadline): at a fault delay of HOLD_MS it
    holds the worker until the delay is set back (read before every NFE's sleep), then ends
    within one HOLD_MS."""
    key = (session, 1)
    now = client.now()
    with client.lock:
        client.sent[key] = now
    client.pub.publish(build_request(client.model, now, session_id=session, sequence=key[1],
                                     remaining_nfe=HOLD_NFE))
    return key


class LatestStats:
    """Relay i's latest flowedge/stats (published at STATS_HZ)."""

    def __init__(self, client: PoolClient, i: int) -> None:
        self.latest: RelayStats | None = None
        client.node.create_subscription(RelayStats, f"{NS}/r{i}/flowedge/stats", self._on, 10)

    def _on(self, msg: RelayStats) -> None:
        self.latest = msg

    def busy_queued(self) -> tuple[int, int] | None:
        """(lanes busy, requests queued) as last published, None before the first."""
        m = self.latest
        return None if m is None else (m.lanes_busy, m.queue_depth)


def delay(ms: float) -> ParameterValue:
    return ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=float(ms))


def test_a_target_killed_while_holding_handovers_leaves_them_to_the_owner_once(spill_pool):
    """Each condition is made and then seen before the next step, none left to the host's
    pace. The target is made to hold what it is handed (its NFEs take a minute, set live and
    acknowledged). The owner is filled until released: its NFEs take HOLD_MS (set live), and
    three long requests of its own sessions (successor: the third relay) take its worker (seen
    busy in its flowedge/stats) and then its whole queue (seen queued). Two requests of
    sessions whose successor is the target are then capacity rejections: handed over (the
    owner's spilled_out and the target's spilled_in, each +2) and held there unanswered. The
    owner is released (its delay set back), answers its own three and is idle; the target is
    killed (-9): after a lease the owner takes the two back (spill_back) and answers each once,
    with actions. Runs last: the target stays dead."""
    client, procs, ids = spill_pool
    client.reset()
    owner, target, third = ids[OWNER], ids[1], ids[2]
    fill = sessions_with(ids, owner, third, QUEUE + 1, "spf")
    handed = sessions_with(ids, owner, target, 2, "spk")
    out0, in0 = counter(client, OWNER, "spilled_out"), counter(client, 1, "spilled_in")
    back0 = counter(client, OWNER, "spill_back")
    stats = LatestStats(client, OWNER)
    set_parameter(client, 1, "fault_nfe_delay_ms", delay(60_000))
    killed = False
    try:
        set_parameter(client, OWNER, "fault_nfe_delay_ms", delay(HOLD_MS))
        try:
            # its worker takes the first (seen running), then its queue the rest (seen queued):
            # sent together, a worker slow to dispatch would leave the third no room
            own = [send_long(client, fill[0])]
            assert wait_for(lambda: stats.busy_queued() == (1, 0), 30, 0.02), \
                (stats.busy_queued(), pool_state(client, own))
            own += [send_long(client, s) for s in fill[1:]]
            assert wait_for(lambda: stats.busy_queued() == (1, QUEUE), 30, 0.02), \
                (stats.busy_queued(), pool_state(client, own))
            keys = [client.send(s) for s in handed]
            assert wait_for(lambda: counter(client, OWNER, "spilled_out") - out0 == 2 and
                            counter(client, 1, "spilled_in") - in0 == 2, 30)
        finally:
            set_parameter(client, OWNER, "fault_nfe_delay_ms", delay(NFE_DELAY_MS))
        assert wait_for(lambda: all(answers_of(client, own).values()), 60, 0.05), \
            pool_state(client, own + keys)
        assert not any(answers_of(client, keys).values()), seen(client, keys)  # held there
        os.kill(procs[1].pid, signal.SIGKILL)
        killed = True
        procs[1].wait(timeout=10)
    finally:
        if not killed:
            set_parameter(client, 1, "fault_nfe_delay_ms", delay(NFE_DELAY_MS))
    client.wait_views([OWNER, 2], {owner, third})
    client.assert_exactly_once()
    got = answers_of(client, own + keys)
    assert all(a[0].relay_id == owner for a in got.values()), \
        {k: a[0].relay_id for k, a in got.items()}
    assert all(a[0].code == Code.INFERENCE for a in got.values()), \
        {k: (a[0].code, a[0].reject_reason) for k, a in got.items()}
    assert wait_for(lambda: counter(client, OWNER, "spill_back") - back0 == 2, 10)


def seen(client: PoolClient, keys: list[tuple[str, int]]) -> dict:
    """Who answered each of keys, and how (for a failure's message)."""
    return {k: [(a.relay_id, a.code, a.pool_epoch) for a in v]
            for k, v in answers_of(client, keys).items()}


def pool_state(client: PoolClient, keys: list[tuple[str, int]]) -> str:
    """The announcements, the pool statuses and the answers to keys, short (for a failure)."""
    with client.lock:
        members = {r: (m.epoch, m.state, m.queue_depth) for r, m in client.members.items()}
        status = {n: {k: v.get(k) for k in ("relay_id", "pool_epoch", "members", "takeovers",
                                             "stalls_detected", "unowned", "spilled_out",
                                             "spilled_in", "spill_back")}
                  for n, v in client.status.items()}
    return f"announced {members}; status {status}; answers {seen(client, keys)}"

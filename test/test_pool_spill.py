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

import time

import pytest
from core_helpers import wait_for
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from test_pool import NS, RELAYS, PoolClient, fnv1a64, mix64, pool_client, relay_args

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

# SPDX-License-Identifier: Apache-2.0
"""What a pool member's own stall left it holding, when the member stops (docs/design.md §13.2,
held outcomes at stop): three real `flowedge-relayd` processes over real DDS on loopback, as in
test_pool.py (its client and its relays' arguments), in a module of its own since a member
stopped here does not come back for the tests that follow.

The condition is made on purpose: every member frozen (SIGSTOP) while each holds queued and
running work, for longer than lease + the stall margin, so each finds its own stall and holds
what it has; then resumed, and one member stopped (SIGTERM, the CLI's clean stop) at once, long
before anything it holds is due. Nobody took its work over during the stall (everybody was
frozen), so what it holds is answered by nobody else unless it answers it at its stop.
"""

from __future__ import annotations

import re
import signal
import time

import pytest
from relayd import relayds
from test_pool import (
    LEASE_MS,
    RELAYS,
    PoolClient,
    owner,
    pool_client,
    relay_args,
    sessions_owned,
)

from flowedge_relay_tools.harness import build_request

pytestmark = pytest.mark.ros

#: the stop's log line (flowedge_relay/pool.py, RelayPool.close): the C pool's counters then
STOP_LINE = re.compile(r"pool at stop: held (\d+), released (\d+), surrendered (\d+), "
                       r"hold_full (\d+), holding (\d+)")


BURST_SEQ = 1_000_000  # the burst's sequences, clear of the steady load's (PoolClient.send)
BURST_DEADLINE_MS = 2000


def send_due(client: PoolClient, session: str, sequence: int, deadline_ms: int) -> tuple[str, int]:
    """One request with a deadline deadline_ms from now, recorded as the client's own."""
    now = client.now()
    req = build_request(client.model, now, session_id=session, sequence=sequence,
                        deadline_ms=deadline_ms)
    with client.lock:
        client.sent[(session, sequence)] = now
    client.pub.publish(req)
    return session, sequence


@pytest.fixture(scope="module")
def stop_pool(tmp_path_factory):
    """Three relays of one pool, the test's client, and the directory of the relays' logs."""
    tmp = tmp_path_factory.mktemp("pool_stop")
    with relayds(tmp, *[relay_args(i) for i in range(RELAYS)]) as procs, \
            pool_client("pool_stop_client") as (client, ids):
        yield client, procs, ids, tmp


def test_outcomes_held_when_a_member_stops_are_answered_once(stop_pool):
    """SIGSTOP of all three members under load past lease + margin and past the burst's
    deadline + lease, SIGCONT, then SIGTERM of one member at once, before anything it holds is
    due: it answers at its stop what it held (no other member answered it, none took it over,
    and the successors' copies are gone), so every request sent is answered, each exactly once,
    the ones it held by it, and its hold ends empty with its counters balanced."""
    client, procs, ids, logs = stop_pool
    client.reset()
    victim = 0
    sessions = sessions_owned(ids, 2, "stop")
    with client.under_load(sessions, 12.0):
        time.sleep(1.0)
        # 1.2 s of work at each member, due in BURST_DEADLINE_MS: the freeze outlasts the
        # deadline + a lease, so a successor's copy of one is gone when the members resume
        burst = [send_due(client, s, BURST_SEQ + k, BURST_DEADLINE_MS)
                 for k, s in enumerate(sessions * 3)]
        sent_at = time.monotonic()
        with client.all_frozen(procs, burst, ids) as answered:
            held = [k for k in burst if k not in answered and owner(k[0], ids) == ids[victim]]
            # past lease + margin (each one's own stall) and past the burst's deadline + lease
            time.sleep(max(LEASE_MS / 1000 + 0.4, (BURST_DEADLINE_MS + LEASE_MS) / 1000 + 0.5
                           - (time.monotonic() - sent_at)))
        # stopped at once: what it holds is due a lease + margin + a lease from now at the
        # earliest, so nothing it held has been answered by the hold's own release yet
        procs[victim].send_signal(signal.SIGTERM)
        assert held, "the member stopped held no unanswered work at the stall: nothing at risk"
        assert procs[victim].wait(timeout=120) == 0
        client.wait_views([1, 2], {ids[1], ids[2]})  # it left; the others rejoined
    # the survivors' own held work is due at most 6 leases + margin after their stall: wait past
    # that, so that a late duplicate would be seen too
    time.sleep((6 * LEASE_MS + 100) / 1000 + 1.0)
    counts = client.ledger()
    with client.lock:
        missing = [k for k in client.sent if counts[k] == 0]
        sent = len(client.sent)
        detail = [(a.session_id, a.sequence, a.relay_id, a.code, a.pool_epoch)
                  for a, _ in client.answers if counts[(a.session_id, a.sequence)] > 1]
    lost = [k for k in held if counts[k] == 0]
    assert not missing, (f"{len(missing)} of {sent} unanswered, {len(lost)} of the {len(held)} "
                         f"the stopped member held: {missing[:5]}")
    assert not detail, f"answered twice: {detail[:6]}"
    line = STOP_LINE.findall((logs / f"relay{victim}.log").read_text(encoding="utf-8"))
    assert line, "the stopped member logged no pool counters at its stop"
    held_n, released, surrendered, full, holding = map(int, line[-1])
    assert holding == 0 and held_n > 0 and released > 0, line[-1]
    assert held_n <= released + surrendered, line[-1]  # each held one ended one of the two ways
    by = client.answerers()
    # the survivors' copies were gone (deadline + lease passed in the freeze): only it could
    assert all(by[k] == ids[victim] for k in held), {k: by[k] for k in held}
    print(f"{len(held)} requests of the stopped member unanswered at the stall; {sent} sent, 0 "
          f"unanswered, 0 answered twice; {sum(by[k] == ids[victim] for k in held)} of them "
          f"answered by it at its stop; its pool counters at stop: {line[-1]}")


def test_a_member_stopped_after_its_takeover_duplicates_nothing(stop_pool):
    """SIGSTOP of one member under load while it holds queued and running work, until the others
    have taken it over and past lease + margin, SIGCONT, then SIGTERM of it at once: the others
    answered what it held, and its stop waits, its intake still reading their answers, until
    nothing is held, so its last pass publishes none of it: every request exactly once, none it
    held by it (counted surrendered). Runs on the members still up (after the test above: two)."""
    client, procs, ids, logs = stop_pool
    live = client.still_up(procs, ids)
    victim, survivors = live[0], live[1:]
    live_ids = [ids[i] for i in live]
    sessions = sessions_owned(live_ids, 3, "leave")
    victims = [s for s in sessions if owner(s, live_ids) == ids[victim]]
    # 4 requests/s of 200 ms: a survivor alone keeps up (a queue that kept growing would answer
    # a held request later than its due, the named window of §13.2, not what is tested here)
    with client.under_load(sessions, 4.0):
        time.sleep(1.0)
        burst = client.busy(ids[victim], victims)  # freeze while it holds the rest
        held = client.frozen_until_taken_over(procs[victim], burst, survivors,
                                              {ids[i] for i in survivors})
        procs[victim].send_signal(signal.SIGTERM)  # at once: its hold is not due for 2 leases
        assert held, "the member stopped held no unanswered work at the freeze: nothing at risk"
        assert procs[victim].wait(timeout=120) == 0
        time.sleep(1.0)
    client.assert_exactly_once()
    by = client.answerers()
    assert all(by[k] != ids[victim] for k in held), "the stopped member answered what it held"
    line = STOP_LINE.findall((logs / f"relay{victim}.log").read_text(encoding="utf-8"))
    assert line, "the stopped member logged no pool counters at its stop"
    held_n, released, surrendered, _, holding = map(int, line[-1])
    assert holding == 0 and surrendered > 0 and held_n <= released + surrendered, line[-1]
    print(f"{len(held)} requests of the stopped member unanswered at the freeze, answered by the "
          f"others once; its pool counters at stop: {line[-1]}")

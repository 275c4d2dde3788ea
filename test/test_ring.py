# SPDX-License-Identifier: Apache-2.0
"""SPSC outcome rings (csrc/fer_ring.c) with a real producer thread and a real consumer thread.

Two levels: Python threads calling push / pop one record at a time (the GIL is released inside
each C call), and Python threads that each run a tight C loop (fer_bench_ring_produce /
_consume) so producer and consumer really overlap in C for hundreds of thousands of records.
Each record carries its sequence number and an action payload derived from it, so a lost,
duplicated, reordered or torn record is detected.
"""

import threading
import time

import numpy as np
import pytest
from core_helpers import request, wait_for

from flowedge_relay.core import Code, Core, CoreConfig, InvalidArgument, Ring
from flowedge_relay_tools.native import lib


def payload(seq: int, n: int) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) + (seq & 0xFFFFF)).astype(np.float32)


class Threads:
    """Daemon threads whose failures reach the test's main thread.

    An assertion inside a thread would only kill that thread: its peers would then wait for it
    forever (a hang instead of a failure). Here the first exception is recorded and sets
    `failed`, which every loop below also watches, and `join` asserts in the main thread.
    """

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self.failed = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, target, *args) -> threading.Thread:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:
                self.errors.append(exc)
                self.failed.set()

        thread = threading.Thread(target=run, name=target.__name__, daemon=True)
        self.threads.append(thread)
        thread.start()
        return thread

    def join(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(end - time.monotonic(), 0.0))
        self.failed.set()  # whatever still runs: stop
        if self.errors:
            raise self.errors[0]
        alive = [t.name for t in self.threads if t.is_alive()]
        assert alive == [], f"threads still running after {timeout} s: {alive}"


def test_capacity_rounds_up_to_power_of_two():
    for asked, got in [(1, 1), (3, 4), (4, 4), (5, 8), (1000, 1024)]:
        with Ring(asked, 0) as r:
            assert r.capacity == got
    with pytest.raises(InvalidArgument):
        Ring(0, 4)


def test_fifo_and_payload_single_thread():
    with Ring(4, 3) as r:
        assert r.pop() is None
        for s in range(3):
            assert r.push(s, payload(s, 3))
        assert r.push(3)                             # a record without actions
        assert r.count() == 4 and r.free_slots() == 0
        for s in range(3):
            seq, act = r.pop()
            assert seq == s and act.tolist() == payload(s, 3).tolist()
        assert r.pop() == (3, None)
        assert r.pop() is None


def test_full_ring_drops_and_counts():
    with Ring(8, 2) as r:
        assert all(r.push(s, payload(s, 2)) for s in range(8))
        assert not r.push(8, payload(8, 2))
        assert not r.push(9, payload(9, 2))
        assert r.dropped() == 2
        assert [r.pop()[0] for _ in range(8)] == list(range(8))   # the first 8 survive intact
        assert r.push(10, payload(10, 2)) and r.pop()[0] == 10
        assert r.dropped() == 2


def test_indices_wrap_around_the_mask_many_times():
    with Ring(4, 1) as r:
        for s in range(1000):
            assert r.push(s, payload(s, 1))
            seq, act = r.pop()
            assert seq == s and act[0] == payload(s, 1)[0]


def test_python_threads_lose_and_duplicate_nothing():
    n, action_len = 20_000, 4
    with Ring(16, action_len) as r:
        got, full = [], [0]
        threads = Threads()

        def producer():
            for s in range(n):
                while not r.push(s, payload(s, action_len)):
                    full[0] += 1                   # consumer behind: retry (counted as drop)
                    if threads.failed.is_set():
                        return

        def consumer():
            while len(got) < n and not threads.failed.is_set():
                item = r.pop()
                if item is None:
                    r.wait(50_000_000)
                    continue
                seq, act = item
                assert act.tolist() == payload(seq, action_len).tolist(), seq
                got.append(seq)

        threads.start(producer)
        threads.start(consumer)
        threads.join(60)
        assert got == list(range(n))
        assert r.dropped() == full[0]


@pytest.mark.parametrize("capacity,action_len", [(2, 1), (64, 16), (1024, 0)])
def test_c_loops_in_two_threads_lose_and_duplicate_nothing(capacity, action_len):
    n = 200_000
    with Ring(capacity, action_len) as r:
        result = {}

        def producer():
            result["full"] = lib.fer_bench_ring_produce(r.ptr, 0, n)

        def consumer():
            result["errors"] = lib.fer_bench_ring_consume(r.ptr, 0, n)

        threads = Threads()
        threads.start(consumer)
        threads.start(producer)
        threads.join(120)
        assert result["errors"] == 0
        assert r.count() == 0
        assert r.dropped() == result["full"]       # every refused push was counted


def test_consumer_detects_loss():
    # The checker itself must be able to fail: skip one record on the producer side.
    with Ring(64, 2) as r:
        lib.fer_bench_ring_produce(r.ptr, 0, 10)
        lib.fer_bench_ring_produce(r.ptr, 11, 5)
        assert lib.fer_bench_ring_consume(r.ptr, 0, 15) > 0


def test_core_rings_with_concurrent_producers_and_publisher():
    # The core's own rings: the request thread (ring 0) and two workers (rings 1, 2) produce
    # concurrently while a publisher drains; every request is answered exactly once.
    n_per = 2000
    cfg = CoreConfig(workers=2, queue_capacity=n_per, max_sessions=4, obs_dim=1, action_len=2,
                     ring_capacity=8)
    obs = np.zeros(1, np.float32)
    with Core(cfg) as c:
        seen: list[tuple] = []
        done = threading.Event()
        threads = Threads()

        def submitter():
            for i in range(n_per):
                # Odd sequences are already late: EXPIRED into ring 0. Even ones are queued.
                deadline = 1 if i % 2 else 0
                c.submit(request(b"s", i, seed=0, deadline=deadline, origin=10, obs=obs), 10)

        def worker(lane):
            while not done.is_set() and not threads.failed.is_set():
                if not c.wait_for_work(lane, 10_000_000):
                    continue
                w = c.dispatch(lane, 20)
                if w is None:
                    continue
                c.step(lane, 21, 1)
                while not c.output_space(lane):    # the bounded wait happens here, in Python
                    if threads.failed.is_set():
                        return
                    threading.Event().wait(0.0001)
                c.finish(lane, 22, np.full(2, w.sequence, np.float32))

        def publisher():
            while not threads.failed.is_set() and (
                not done.is_set() or c.stats().queue_depth or c.stats().lanes_busy
            ):
                c.wait_outputs(10_000_000)
                for o in c.pop_outcomes():
                    if o.code == Code.INFERENCE:
                        assert o.actions.tolist() == [o.sequence] * 2, o.sequence
                    seen.append((o.code, o.sequence))

        threads.start(publisher)
        threads.start(worker, 0)
        threads.start(worker, 1)
        feeder = threads.start(submitter)
        feeder.join(60)
        # all queued work served (or a thread failed)
        assert wait_for(lambda: not (c.stats().queue_depth or c.stats().lanes_busy)
                        or threads.failed.is_set(), 60, 0.001), c.stats()
        done.set()
        c.shutdown()
        threads.join(60)
        seen += [(o.code, o.sequence) for o in c.pop_outcomes(10_000)]
        s = c.stats()
        dropped = s.rejection_outputs_dropped + s.action_outputs_dropped
        assert s.action_outputs_dropped == 0       # workers waited for space
        seqs = sorted(q for _, q in seen)
        assert len(seqs) == len(set(seqs))          # nothing duplicated
        assert len(seqs) + dropped == n_per         # nothing lost without being counted
        assert all(code == Code.INFERENCE for code, q in seen if q % 2 == 0)

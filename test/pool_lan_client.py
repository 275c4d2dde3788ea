# SPDX-License-Identifier: Apache-2.0
"""The producers' side of test_pool_netns.py, run inside the producers' network namespace.

It sees the pool only over the test's bridge: waits until every relay lists all three in its
view, sends requests over sessions picked so each member owns a known share, optionally kills one
relay (kill -9, by pid: the namespaces share the pid space) under load, and prints one JSON line:
what was sent, what is missing or duplicated, and who answered.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

from test_pool import RELAYS, owner, pool_client, sessions_owned


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-pid", type=int, default=0, help="relay 1's pid: kill it")
    args = parser.parse_args()
    report: dict[str, object] = {}
    with pool_client("pool_lan_client") as (client, ids):
        sessions = sessions_owned(ids, 4, "lan")
        if args.kill_pid:
            stop = threading.Event()
            thread = client.load(sessions, 20.0, stop)
            time.sleep(1.5)
            os.kill(args.kill_pid, signal.SIGKILL)
            client.wait_views([0, 2], {ids[0], ids[2]})
            time.sleep(1.0)
            stop.set()
            thread.join()
        else:
            for _ in range(5):
                for s in sessions:
                    client.send(s)
        counts = client.ledger()
        by = client.answerers()
        with client.lock:
            sent = dict(client.sent)
        report = {
            "relay_ids": ids,
            "sent": len(sent),
            "missing": sum(1 for k in sent if counts[k] == 0),
            "duplicated": sum(1 for n in counts.values() if n > 1),
            "answered_by": {r: sum(1 for v in by.values() if v == r) for r in ids},
            "not_by_owner": sum(1 for k, r in by.items() if k in sent
                                and r != owner(k[0], ids)),
            "takeovers": {i: int(client.status.get(f"pooltest/r{i}/flowedge_relay", {})
                                 .get("takeovers", 0)) for i in range(RELAYS)},
        }
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

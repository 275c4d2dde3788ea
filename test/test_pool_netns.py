# SPDX-License-Identifier: Apache-2.0
"""A relay pool across hosts: each relay in a Linux network namespace of its own, the producers
in another, joined by a bridge (in a namespace of its own too) over veth pairs, as hosts on one
LAN switch. DDS discovery runs as on a LAN: multicast over the bridge, UDP only (Fast DDS's
shared memory, which namespaces on one machine would share, is off).

Needs root (CI runs as root); skipped with the reason where the kernel or the user refuses. The
fixture always removes every namespace it made; traffic goes only to addresses inside them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from relayd import ROOT, relayds
from test_pool import RELAYS, relay_args

pytestmark = pytest.mark.ros

SUBNET = "10.213.77"
#: discovery as on a LAN; Fast DDS over UDP only (namespaces share /dev/shm)
LAN_ENV = {"ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET", "FASTDDS_BUILTIN_TRANSPORTS": "UDPv4"}


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def lan():
    """Namespaces <tag>r0..r2 (relays), <tag>p (producers) and <tag>sw (the bridge); yields
    the ones with hosts, each with eth0 at SUBNET.<k + 1>/24 and a multicast route."""
    tag = f"fr{os.getpid() % 100000}"
    hosts = [f"{tag}r{i}" for i in range(RELAYS)] + [f"{tag}p"]
    switch = f"{tag}sw"
    made: list[str] = []
    try:
        if os.geteuid() != 0:
            pytest.skip("network namespaces need root (CI runs as root)")
        for ns in (switch, *hosts):
            try:
                _ip("netns", "add", ns)
            except (subprocess.CalledProcessError, FileNotFoundError) as exc:
                pytest.skip(f"the kernel or iproute2 refused a network namespace: {exc}")
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for k, ns in enumerate(hosts):
            _ip("-n", switch, "link", "add", f"v{k}", "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _ip("-n", switch, "link", "set", f"v{k}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{SUBNET}.{k + 1}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", "eth0")
        yield hosts
    finally:
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _client(ns: str, *args: str) -> dict:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, str(ROOT / "test" / "pool_lan_client.py"),
         *args], cwd=ROOT / "test", capture_output=True, text=True, timeout=300,
        env={**os.environ, **LAN_ENV, "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "test"), os.environ.get("PYTHONPATH", "")])})
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert out.returncode == 0 and lines, f"client failed ({out.returncode}):\n{out.stderr[-3000:]}"
    return json.loads(lines[-1])


def test_a_pool_across_namespaces_answers_once_and_survives_a_kill(lan, tmp_path):
    """Three relays on three "hosts" and a producer on a fourth, over a bridge: every request is
    answered exactly once by its session's owner; then kill -9 of one relay under load: every
    request still answered exactly once, the survivors took over."""
    prefixes = [["ip", "netns", "exec", ns] for ns in lan[:RELAYS]]
    with relayds(tmp_path, *[relay_args(i) for i in range(RELAYS)], prefixes=prefixes,
                 env=LAN_ENV) as procs:
        once = _client(lan[-1])
        assert once["missing"] == 0 and once["duplicated"] == 0, once
        assert once["not_by_owner"] == 0 and all(once["answered_by"].values()), once
        killed = _client(lan[-1], "--kill-pid", str(procs[1].pid))
        print(f"across namespaces: {once}; with kill -9: {killed}")
        assert killed["missing"] == 0 and killed["duplicated"] == 0, killed
        assert killed["takeovers"]["0"] >= 1 and killed["takeovers"]["2"] >= 1, killed

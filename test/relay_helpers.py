# SPDX-License-Identifier: Apache-2.0
"""A relay.Relay without ROS or DDS: the real C core, the real ONNX model, the real worker and
publisher threads; its answers go to a Sink instead of a DDS writer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from flowedge_relay import parameters
from flowedge_relay.relay import Host, Relay


class Sink:
    """What a Relay without DDS publishes its answers to (Host.actions), kept in order."""

    def __init__(self) -> None:
        self.messages: list = []
        self._lock = threading.Lock()

    def publish(self, msg) -> None:
        with self._lock:
            self.messages.append(msg)

    def got(self) -> list:
        with self._lock:
            return list(self.messages)


@contextmanager
def plain_relay(**values) -> Iterator[tuple[Relay, Sink]]:
    """A Relay on every parameter's default but `values`, unconfigured, with the Python intake
    and publisher loops (the C ones take from and publish to DDS); stopped and closed on exit."""
    p = {**parameters.defaults(), "intake_loop": "python", "publisher_loop": "python", **values}
    sink = Sink()
    relay = Relay(p, Host.plain(sink))
    try:
        yield relay, sink
    finally:
        relay.stop()
        relay.close()

# SPDX-License-Identifier: Apache-2.0
"""Tooling around the relay, kept apart from the runtime in flowedge_relay/.

Nothing in the runtime (node, core, workers, validation, model, policy, diagnostics, cli)
imports from here. These modules drive a relay from outside, through its topics, parameters and
the node's small public surface (RelayNode.counters(), threads_alive(), snapshot(),
handle_request()): the demo behind `make run`, the blind-retry drill, the robustness campaigns,
the benchmarks, and the in-process harness the tests and tools share.
"""

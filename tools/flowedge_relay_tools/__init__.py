# SPDX-License-Identifier: Apache-2.0
"""flowedge_relay_tools: the tooling around the relay, a package of its own beside the runtime.

A robot installs flowedge_relay and runs the relay without any of this. Nothing in the runtime
(node, core, workers, validation, model, policy, diagnostics, cli) imports from here. These
modules drive a relay from outside, through its topics, parameters and, in process, the node's
relay.Relay (`node.relay`: counters(), threads_alive(), snapshot(), core): the demo behind
`make run`, the blind-retry drill, the robustness campaigns, the benchmarks, policy training,
and the in-process harness the tests and tools share.
"""

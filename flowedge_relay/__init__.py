# SPDX-License-Identifier: Apache-2.0
"""FlowEdge Relay: a deadline-aware EDF inference relay for flow-matching action policies."""

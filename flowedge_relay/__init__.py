"""FlowEdge Relay: a deadline-aware EDF inference relay for flow-matching action policies."""

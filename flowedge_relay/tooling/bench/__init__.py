"""flowedge_relay_bench: the relay's benchmarks (see __main__.py for the subcommands)."""

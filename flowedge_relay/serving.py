# SPDX-License-Identifier: Apache-2.0
"""One model being served: its description, core, intakes, workers and publisher thread.

A relay serves through exactly one `Serving` at a time. It is built in stages (the model, the
core, the intakes, the workers and the output) when the relay is configured, and again for a
model swap, beside the one it replaces, while that one keeps serving (docs/design.md §9): the
old one then drains its admitted work and is closed. A `Serving` without a model is what an
unconfigured relay (or one whose model failed to load) has: every request is discarded as
`model_unavailable`, and diagnostics say why.
"""

from __future__ import annotations

import threading
import time

from flowedge_relay import policy as policy_mod
from flowedge_relay.client_weights import parse_client_weights
from flowedge_relay.core import AgeGate, Core, CoreConfig, CostModel
from flowedge_relay.diagnostics import model_description
from flowedge_relay.intake import IntakeUnavailable, NativeIntake, PythonIntake
from flowedge_relay.model import ModelInfo, default_model_path
from flowedge_relay.publisher import ActionPublisher
from flowedge_relay.realtime import ThreadSettings
from flowedge_relay.rtc import RtcSpec
from flowedge_relay.rtc import resolve as resolve_rtc
from flowedge_relay.validation import ModelContract, Validator
from flowedge_relay.workers import SlotInputs, WorkerPool

MS = 1_000_000
US = 1_000


def cost_fields(p: dict) -> dict[str, int]:
    """The cost-model parameters (docs/design.md §5.2) as the core's config fields."""
    return {
        "cost_model": CostModel[p["cost_model"].upper()],
        "cost_window_ns": p["cost_window_ms"] * MS,
        "cost_quantile_ppm": round(p["cost_quantile"] * 1_000_000),
    }


def cede_fields(p: dict) -> dict[str, int]:
    """The workers' pacing (docs/design.md §5.3) as the core's config fields, which are also
    the WorkerPool's arguments: only real-time workers cede (a normal-priority one shares its CPU
    with normal tasks anyway)."""
    if p["worker_rt_priority"] == 0 or p["worker_rt_cede_us"] == 0:
        return {"cede_ns": 0, "cede_every_ns": 0}
    return {"cede_ns": p["worker_rt_cede_us"] * US,
            "cede_every_ns": p["worker_rt_cede_every_us"] * US}


def rtc_of(policy: policy_mod.Policy, rtc_mode: str, solver: str) -> RtcSpec | None:
    """Real-time chunking as this policy is served with `rtc_mode` (rtc.resolve) on the `solver`
    parameter (a package's own flow.solver overrides it); RtcManifestError (a ModelError) when
    the mode cannot be served."""
    package = policy.kind != "onnx"
    return resolve_rtc(policy.rtc, rtc_mode, package=package,
                       solver=policy.solver if package else solver,
                       horizon=policy.action_horizon)


def thread_settings(p: dict, prefix: str) -> ThreadSettings:
    """A thread role's settings from its `<prefix>_cpu_affinity` / `<prefix>_rt_priority`."""
    return ThreadSettings(tuple(p[f"{prefix}_cpu_affinity"]), p[f"{prefix}_rt_priority"])


def model_of(p: policy_mod.Policy) -> ModelInfo | policy_mod.Policy:
    """ModelInfo for a single .onnx file (what its path always used), else the Policy."""
    if p.kind != "onnx":
        return p
    return ModelInfo(p.path, p.digest, p.obs_dim, p.action_horizon, p.action.dim,
                     p.graphs["velocity"].data)


def load_policy(model_path: str, providers) -> policy_mod.Policy:
    """The policy at `model_path` ("" = the bundled one) on `providers`; ModelError if it cannot
    be served (policy.ProviderUnavailable is one too)."""
    policy_mod.check_providers(tuple(providers))
    return policy_mod.load(model_path or default_model_path())


class Serving:
    """What serves one model. Stages, in order: `policy` (given, or None: nothing to serve,
    `model_error` says why), `core`, the intakes (`validator` and `python_intake` for the rclpy
    callback, `native_intake` for the C loop), `pool` (the workers, None without a model) and
    `output` (the publisher thread's ActionPublisher over this core's rings). `start` starts
    the threads; the relay routes its intake here; `stop` and `close` end it.

    `relay` is the Relay it serves for (its Host, intake loop and pool); `p` the parameter
    values; `calibration` overrides nfe_ns / admission_reserve_ns /
    prefix_ns (a model swap's atomic set). `accepting` False builds the core inactive (its
    arrivals are REJECTED_CAPACITY until set_accepting), `hold` holds its workers' dispatch.
    """

    def __init__(self, relay, p: dict, policy: policy_mod.Policy | None, *, model_path: str,
                 model_error: str = "", calibration: dict | None = None,
                 accepting: bool = True, hold: bool = False) -> None:
        self.host = relay.host
        self.intake_loop = relay.intake_loop
        self.p = {**p, **(calibration or {})}
        self.model_path = model_path or default_model_path()
        self.policy = policy
        self.model = model_of(policy) if policy is not None else None
        #: real-time chunking as served (docs/design.md §5.4): rtc_mode resolved on the policy
        self.rtc = rtc_of(policy, p["rtc_mode"], p["solver"]) if policy is not None else None
        self.model_error = model_error
        self.execution_providers = tuple(p["execution_providers"])
        self.intake_note = ""
        #: the relay pool in C (docs/design.md §13), shared by every serving; or None
        self.relay_pool = relay.pool_c
        self.started_ns = 0
        self._publisher_thread: threading.Thread | None = None
        self._build_core(accepting, hold)
        self._build_intakes()
        self._build_pool()
        self.output = ActionPublisher(self.host, self.core, self.host.actions, self.model,
                                      native=p["publisher_loop"] != "python",
                                      pool=self.relay_pool)  # fmt: skip
        self.model_values = (model_description(policy, self.execution_providers, self.rtc)
                             if policy is not None else {})

    # -- stages ----------------------------------------------------------------------------------

    @property
    def package(self) -> bool:
        return self.policy is not None and self.policy.kind != "onnx"

    def _build_core(self, accepting: bool, hold: bool) -> None:
        p, m = self.p, self.model
        package_fields = {}
        # A single .onnx file's observation travels in the core's observation rows: its slots
        # have a payload only for a real-time chunking prefix.
        if self.package or self.rtc is not None:
            layout = policy_mod.payload_layout(self.policy, rtc=self.rtc is not None)
            package_fields = {"two_phase": int(self.policy.two_phase),
                              "payload_bytes": layout.nbytes,
                              "rtc_max_delay": self.rtc.max_delay if self.rtc else 0}
        self.core = Core(CoreConfig(
            workers=p["workers"], batch_slots=p["batch_slots"],
            queue_capacity=p["queue_capacity"], max_sessions=p["max_sessions"],
            max_nfe=p["max_nfe"], obs_dim=m.obs_dim if m else 1,
            action_len=m.action_len if m else 1, ring_capacity=p["output_ring_capacity"],
            nfe_ns=p["nfe_ns"], admission_reserve_ns=p["admission_reserve_ns"],
            prefix_ns=p["prefix_ns"], reject_if_retry_count_gte=p["reject_if_retry_count_gte"],
            age_gate=AgeGate[p["age_gate"].upper()],
            reject_if_queue_age_ns_gte=p["reject_if_queue_age_ms_gte"] * MS,
            queue_timeout_ns=p["queue_timeout_ms"] * MS,
            session_idle_ns=p["session_idle_ms"] * MS,
            fair_share=int(p["fair_share"]), max_clients=p["max_clients"],
            client_weights=parse_client_weights(p["client_weights"]),
            **cost_fields(p), **cede_fields(p), **package_fields,
        ))  # fmt: skip
        self.core.set_accepting(accepting)
        self.core.hold_dispatch(hold)

    def apply_fair_share(self, p: dict) -> None:
        """A live fair_share / client_weights set (docs/design.md §7.1) into the running core:
        weights first, so a decision between the two calls sees a valid pair (old flag, new
        rules); each call is atomic in the core. p: the node's parameters after the set."""
        self.p.update(fair_share=p["fair_share"], client_weights=p["client_weights"])
        self.core.set_client_weights(parse_client_weights(p["client_weights"]))
        self.core.set_fair_share(bool(p["fair_share"]))

    def _build_intakes(self) -> None:
        p = self.p
        # A package's request tensors go straight into the core's staging slot (one copy).
        self.slot_inputs = None
        if self.package or self.rtc is not None:
            self.slot_inputs = SlotInputs(self.policy, self.core.payload_view, self.rtc)
            self.slot_inputs.prepare(range(self.core.slots))  # views + OrtValues, once per slot
        contract = ModelContract.of(self.policy) if self.policy is not None else None
        self.validator = Validator(
            contract, p["max_nfe"],
            intake_target=self._staging_inputs if self.package else None,
            max_request_bytes=p["max_request_bytes"],
            prefix_target=self._staging_prefix if self.rtc is not None else None,
        )
        self.python_intake = PythonIntake(self.core, self.validator, self._ros_now)
        self.native_intake = None
        if self.intake_loop == "native":
            try:
                self.native_intake = NativeIntake(
                    self.core, contract, p["max_nfe"], p["max_request_bytes"],
                    self.slot_inputs.layout.prefix_offset if self.slot_inputs else None,
                    pool=self.relay_pool)
            except IntakeUnavailable as exc:  # served through the rclpy callback instead
                self.intake_note = f"not in C: {exc}"

    def _ros_now(self) -> int:
        return self.host.now_ns()

    def _staging_inputs(self) -> policy_mod.InputBuffers:
        """Where the validator copies a package request's tensors: the core's staging slot,
        the slot the next submit enqueues (request thread only)."""
        return self.slot_inputs[self.core.staging_slot()]

    def _staging_prefix(self):
        """Where the validator copies a request's real-time chunking prefix: the staging slot's
        prefix rows (request thread only)."""
        return self.slot_inputs.prefix(self.core.staging_slot())

    def _build_pool(self) -> None:
        p = self.p
        self.pool = None
        self.yield_after_accept = False
        if self.model is None:
            # No model, no workers: the lanes are gone, so calibrated admission cannot promise.
            for lane in range(self.core.lanes):
                self.core.disable_lane(lane, time.monotonic_ns())
            return
        self.pool = WorkerPool(
            self.core, self.policy if self.package else self.model,
            workers=p["workers"], intra_op_threads=p["intra_op_threads"], solver=p["solver"],
            execution_providers=self.execution_providers, slot_inputs=self.slot_inputs,
            cpu_affinity=p["worker_cpu_affinity"], rt_priority=p["worker_rt_priority"],
            output_wait_ns=p["action_output_wait_ms"] * MS, stall_ns=p["worker_stall_ms"] * MS,
            fault_nfe_delay_ns=int(p.get("fault_nfe_delay_ms", 0.0) * MS),
            drill=self.host.drill, nfe_loop=p["nfe_loop"],
            **cede_fields(p),
            logger=self.host.logger, thread_roles=self.host.thread_roles,
        )  # fmt: skip

    # -- running ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the workers and the publisher thread."""
        self.started_ns = time.time_ns()
        if self.pool is not None:
            self.pool.start()
            # A worker on the Python loop needs the GIL to take an accepted request (a native
            # one serves it in C): only then does the request thread hand it over at once.
            self.yield_after_accept = any(
                info["nfe_loop"] == "python" for info in self.pool.worker_info())
        self._publisher_thread = threading.Thread(
            target=self._run_publisher, name="flowedge-publisher", daemon=True)
        self._publisher_thread.start()

    def _run_publisher(self) -> None:
        """The publisher thread: its real-time settings, then the outcome rings until stop."""
        self.host.thread_roles.apply("publisher", thread_settings(self.p, "publisher"),
                                     self.host.logger.warning)  # fmt: skip
        self.output.run()

    def idle(self) -> bool:
        """Nothing queued and no lane running: every admitted request was answered."""
        st = self.core.stats()
        return st.queue_depth == 0 and st.lanes_busy == 0

    @property
    def publisher_alive(self) -> bool:
        return bool(self._publisher_thread and self._publisher_thread.is_alive())

    def stop(self) -> None:
        """Stop the workers, flush and stop the publisher; every thread joined. Idempotent."""
        try:
            if self.pool is not None:
                self.pool.stop()
        finally:
            self.output.stop()
            self.core.shutdown()
            if self._publisher_thread is not None:
                self._publisher_thread.join(timeout=5.0)

    def close(self) -> None:
        """Release the core (after stop: nothing may run on it)."""
        self.core.close()

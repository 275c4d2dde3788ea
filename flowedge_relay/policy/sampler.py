# SPDX-License-Identifier: Apache-2.0
"""The runtime sampler of a policy: prefix once per request, then one step graph run per NFE.

Time convention: `0_to_1` integrates from noise at t=0 to the action at t=1 (x += dt v, the
bundled policies); `1_to_0` from noise at t=1 down to t=0 (x -= dt v, the sign pi0-style exports
use). The grid is model.solver_plan's; for 1_to_0 the evaluation times are 1 - those.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnxruntime as ort

from flowedge_relay.model import FlowIntegrator
from flowedge_relay.policy.description import Policy
from flowedge_relay.policy.intake import InputBuffers, fill_buffers


def _device_of(sess: ort.InferenceSession) -> tuple[str, int]:
    first = sess.get_providers()[0]
    if first in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
        return "cuda", 0
    return "cpu", 0


class PolicySampler(FlowIntegrator):
    """Integrates one request at a time on one set of sessions; owns the hot path's buffers.

    Not thread-safe: one sampler per worker thread. prefix() runs the prefix graph once into the
    context tensors, which stay bound as step inputs for every NFE (on the device when the step
    session runs on CUDA); nfe() is one bound step run plus in-place numpy updates.
    """

    def __init__(
        self,
        policy: Policy,
        sessions: Mapping[str, ort.InferenceSession],
        solver: str | None = None,
        buffers: InputBuffers | None = None,
    ) -> None:
        self._sign = np.float32(1.0 if policy.time == "0_to_1" else -1.0)
        self._init_integrator(solver or policy.solver)
        self.policy = policy
        self.sessions = dict(sessions)
        a = policy.action
        self._x_in = np.zeros((1, a.horizon, a.dim), np.float32)
        self._state = np.zeros(a.model_len, np.float32)
        self._v = np.zeros((1, a.horizon, a.dim), np.float32)
        self._tmp = np.zeros(a.model_len, np.float32)
        self._t = np.zeros(policy.t_shape, np.float32)
        self._t_flat = self._t.reshape(-1)
        self._x_flat, self._v_flat = self._x_in.reshape(-1), self._v.reshape(-1)
        self._out = np.zeros((a.horizon, a.output_dim), np.float32)
        self._out_flat = self._out.reshape(-1)
        self._state_hd = self._state.reshape(a.horizon, a.dim)
        step = policy.step_graph
        self._step_sess = self.sessions[step.role]
        device, device_id = _device_of(self._step_sess)
        self._context: dict[str, ort.OrtValue] = {}
        #: host arrays under the context OrtValues (CPU only): the native loop copies them
        self.context_arrays: dict[str, np.ndarray] = {}
        for c in policy.context:
            if device == "cpu":
                host = self.context_arrays[c.name] = np.zeros(c.shape, c.dtype)
                value = ort.OrtValue.ortvalue_from_numpy(host)
            else:
                value = ort.OrtValue.ortvalue_from_shape_and_type(
                    list(c.shape), c.dtype.type, device, device_id
                )
            self._context[c.name] = value
        sb = self._step_sess.io_binding()
        sb.bind_ortvalue_input(policy.x_name, ort.OrtValue.ortvalue_from_numpy(self._x_in))
        sb.bind_ortvalue_input(policy.t_name, ort.OrtValue.ortvalue_from_numpy(self._t))
        for name, value in self._context.items():
            sb.bind_ortvalue_input(name, value)
        sb.bind_ortvalue_output(policy.v_name, ort.OrtValue.ortvalue_from_numpy(self._v))
        self._step_binding = sb
        self._step_inputs = [n for n in step.inputs if n in policy.input]
        self._prefix_binding = None
        self._prefix_inputs: list[str] = []
        if policy.two_phase:
            psess = self.sessions["prefix"]
            pb = psess.io_binding()
            for name, value in self._context.items():
                pb.bind_ortvalue_output(name, value)
            self._prefix_binding, self._prefix_sess = pb, psess
            self._prefix_inputs = list(policy.graphs["prefix"].inputs)
        self.buffers: InputBuffers | None = None
        self.use_buffers(buffers or InputBuffers(policy))
        self._prefix_done = False

    def use_buffers(self, buffers: InputBuffers) -> None:
        """Bind a request's input buffers (once per request, not per NFE)."""
        if buffers is self.buffers:
            return
        for name in self._step_inputs:
            self._step_binding.bind_ortvalue_input(name, buffers.ortvalues[name])
        if self._prefix_binding is not None:
            for name in self._prefix_inputs:
                self._prefix_binding.bind_ortvalue_input(name, buffers.ortvalues[name])
        self.buffers = buffers

    @property
    def prefix_pending(self) -> bool:
        return self.policy.two_phase and not self._prefix_done

    def start(self, noise_seed: int, total_nfe: int, buffers: InputBuffers | None = None) -> None:
        """Begin a request whose inputs are in `buffers` (default: the bound ones)."""
        if buffers is not None:
            self.use_buffers(buffers)
        self._begin(noise_seed, total_nfe)
        self._prefix_done = not self.policy.two_phase

    def prefix(self) -> None:
        """The prefix graph, once per request: its outputs stay bound for every NFE."""
        if self._prefix_binding is not None and not self._prefix_done:
            self._prefix_sess.run_with_iobinding(self._prefix_binding)
        self._prefix_done = True

    def nfe(self) -> None:
        """Exactly one step-graph evaluation and its solver update."""
        t = self._time_of_next()
        if not self._prefix_done:
            raise RuntimeError("prefix() has not run for this request")
        self._t_flat[0] = t
        self._step_sess.run_with_iobinding(self._step_binding)
        self._advance()

    def context(self, name: str) -> np.ndarray:
        """A host copy of one context tensor (inspection and tests; never on the hot path)."""
        return self._context[name].numpy()

    def actions(self) -> np.ndarray:
        """float32 [horizon * output_dim]: truncated, then de-normalized (a view: copy to keep)."""
        a = self.policy.action
        cols = self._state_hd[:, : a.output_dim]
        if a.normalization is not None:
            a.normalization.invert(cols, self._out)
        else:
            np.copyto(self._out, cols)
        return self._out_flat

    def sample(
        self, arrays: Mapping[str, np.ndarray], noise_seed: int, total_nfe: int
    ) -> np.ndarray:
        """Local convenience: fill the bound buffers, run everything, return a copy."""
        assert self.buffers is not None
        fill_buffers(self.policy, self.buffers, arrays)
        self.start(noise_seed, total_nfe)
        self.prefix()
        for _ in range(total_nfe):
            self.nfe()
        return self.actions().copy()

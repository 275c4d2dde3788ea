# SPDX-License-Identifier: Apache-2.0
"""What the latched flowedge/model says is served (docs/design.md §9): a ServedModel built from
a serving.Serving; producer.ServedModel.from_message reads it back."""

from __future__ import annotations

from flowedge_relay_msgs.msg import ServedModel, Tensor

from flowedge_relay.serving import Serving
from flowedge_relay.timebase import ros_time


def served_model_message(s: Serving) -> ServedModel:
    """The announcement of `s` (nothing served: an empty digest)."""
    msg = ServedModel(stamp=ros_time(s.started_ns), model_path=s.model_path,
                      nfe_ns=s.p["nfe_ns"], prefix_ns=s.p["prefix_ns"],
                      admission_reserve_ns=s.p["admission_reserve_ns"])
    if s.policy is not None:
        v = s.model_values
        msg.model_digest = s.policy.digest
        msg.model_kind = str(v["model_kind"])
        msg.inputs = [Tensor(name=i.name, dtype=i.code, shape=list(i.shape))
                      for i in s.policy.inputs]
        msg.observation_dim = s.policy.observation_dim
        msg.action_dim = s.policy.action_dim
        msg.action_horizon = s.policy.action_horizon
        msg.solver = str(v["solver"])
        msg.time_convention = str(v["time_convention"])
        msg.execution_providers = list(s.execution_providers)
        msg.rtc_mode = str(v["rtc_mode"])
        msg.rtc_max_delay = int(v["rtc_max_delay"])
    return msg

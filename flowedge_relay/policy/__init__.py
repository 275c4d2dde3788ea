# SPDX-License-Identifier: Apache-2.0
"""Policy packages: named tensor inputs, two-phase (prefix + step) graphs, normalization.

Why: the policies robots run take several named inputs (uint8 camera images, float robot state,
int64 token ids) and are exported as two graphs, a prefix run once per request (a vision-language
encoder producing context tensors or a KV cache) and a step run once per NFE (the action expert).
This package is the relay-side description of such a policy and everything the data path needs,
one job per module:

  description   `Policy` and its parts (inputs, action chunk, graphs, normalization): one
                description for a single `.onnx` file and for a package alike.
  manifest      `load(path)`: a `.onnx` file or a directory with `policy.yaml` (docs/design.md
                §10), checked against the graphs' ONNX metadata and one test evaluation, hashed.
  session       `make_session(...)`: an InferenceSession on an explicit ordered list of execution
                providers; an unavailable provider is an error, never a silent CPU fallback.
  intake        `intake(...)`: validates `InferenceRequest.inputs` against the declared inputs
                and copies each tensor once, normalizing on the way, into preallocated model
                buffers; `payload_layout` places those buffers in a core slot's payload.
  sampler       `PolicySampler`: prefix() once per request, nfe() once per step (IOBinding, the
                context stays bound, no per-NFE copies), actions() de-normalized and truncated.

The names below are the package's public surface (`from flowedge_relay import policy;
policy.load(...)`).
"""

from flowedge_relay.policy.description import (
    DTYPE_CODES,
    DTYPES,
    ActionSpec,
    ContextSpec,
    Graph,
    InputSpec,
    Normalization,
    Policy,
    rtc_policy_path,
    vision_policy_path,
)
from flowedge_relay.policy.intake import (
    DEFAULT_MAX_REQUEST_BYTES,
    INPUT_BOOL_VALUE,
    INPUT_BYTES,
    INPUT_DTYPE,
    INPUT_DUPLICATE,
    INPUT_MISSING,
    INPUT_NOT_FINITE,
    INPUT_SHAPE,
    INPUT_UNEXPECTED,
    INTAKE_REASONS,
    PAYLOAD_ALIGN,
    REQUEST_TOO_LARGE,
    InputBuffers,
    PayloadLayout,
    fill_buffers,
    intake,
    payload_layout,
    request_bytes,
)
from flowedge_relay.policy.manifest import (
    FORMAT,
    FORMAT_VERSION,
    INPUT_NAME_MAX,
    MANIFEST,
    TIME_CONVENTIONS,
    GraphMismatch,
    ManifestError,
    PolicyError,
    load,
    load_package,
    package_digest,
)
from flowedge_relay.policy.sampler import PolicySampler
from flowedge_relay.policy.session import (
    DEFAULT_PROVIDERS,
    ProviderUnavailable,
    check_providers,
    make_session,
    make_sessions,
)

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES", "DEFAULT_PROVIDERS", "DTYPES", "DTYPE_CODES", "FORMAT",
    "FORMAT_VERSION", "INPUT_BOOL_VALUE", "INPUT_BYTES", "INPUT_DTYPE", "INPUT_DUPLICATE",
    "INPUT_MISSING", "INPUT_NAME_MAX", "INPUT_NOT_FINITE", "INPUT_SHAPE", "INPUT_UNEXPECTED",
    "INTAKE_REASONS", "MANIFEST", "PAYLOAD_ALIGN", "REQUEST_TOO_LARGE", "TIME_CONVENTIONS",
    "ActionSpec", "ContextSpec", "Graph", "GraphMismatch", "InputBuffers", "InputSpec",
    "ManifestError", "Normalization", "PayloadLayout", "Policy", "PolicyError", "PolicySampler",
    "ProviderUnavailable", "check_providers", "fill_buffers", "intake", "load", "load_package",
    "make_session", "make_sessions", "package_digest", "payload_layout", "request_bytes",
    "rtc_policy_path", "vision_policy_path",
]

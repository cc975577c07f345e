"""Preparing a layer's routed experts: from checkpoint tensors (or a fused w13 in another engine's
layout) to a PreparedExperts the operator runs on."""

from __future__ import annotations

import numbers
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from . import _mxmoe as _C
from . import _tensors
from .activation import ActivationLike, ActivationType, activation_type

#: The fused FC1 layouts prepare_experts(w13=..., layout=...) reads, by their canonical names
#: (aliases: "sglang" = gate_up, "flashinfer" = up_gate, "gpt_oss" = interleaved).
FC1_LAYOUTS = tuple(_C.fc1_layouts())

Device = Union[str, int, Any]


class PreparedExperts:
    """One rank's routed experts, prepared for one device (returned by prepare_experts)."""

    __slots__ = ("_impl",)

    def __init__(self, impl: Any):
        self._impl = impl

    # The unsplit layer (the same on every rank).
    num_experts = property(lambda self: self._impl.num_experts, doc="E, global")
    hidden = property(lambda self: self._impl.hidden, doc="K, the experts' input (and output) width")
    intermediate = property(lambda self: self._impl.intermediate, doc="I, before any TP split")
    top_k = property(lambda self: self._impl.top_k, doc="k fixed at prepare time, or None: from each call")
    # This rank's share.
    tp_size = property(lambda self: self._impl.tp_size)
    tp_rank = property(lambda self: self._impl.tp_rank)
    ep_size = property(lambda self: self._impl.ep_size)
    ep_rank = property(lambda self: self._impl.ep_rank)
    num_local_experts = property(lambda self: self._impl.num_local_experts)
    first_expert = property(lambda self: self._impl.first_expert, doc="global id of local expert 0")
    local_intermediate = property(lambda self: self._impl.local_intermediate, doc="I / tp_size")
    device = property(lambda self: self._impl.device, doc='"cpu" or "cuda:N"')
    num_threads = property(lambda self: self._impl.num_threads)

    @property
    def activation(self) -> ActivationType:
        return ActivationType(self._impl.activation_value)

    def expert_params(self, local_idx: int) -> Dict[str, float]:
        """The activation parameters (beta, linear_beta, alpha, limit) of local expert local_idx."""
        return self._impl.expert_params(int(local_idx))

    def export_weights(self) -> Dict[str, np.ndarray]:
        """The local experts' weights in the canonical layout, stacked: w1 / w3 [E_local, I_local,
        K/2] and [E_local, I_local, K/32], w2 [E_local, K, I_local/2] and [E_local, K, I_local/32]
        (uint8), plus gate_bias / up_bias [E_local, I_local] when present. CPU-prepared only."""
        return dict(self._impl.export_weights())

    def __repr__(self) -> str:
        return (
            f"PreparedExperts(E={self.num_experts}, K={self.hidden}, I={self.intermediate}, "
            f"top_k={self.top_k}, activation={self.activation.name}, tp={self.tp_rank}/{self.tp_size}, "
            f"ep={self.ep_rank}/{self.ep_size}, device={self.device})"
        )


def _device_index(device: Device) -> int:
    """-1 for the CPU, else a CUDA device index; from "cpu", "cuda", "cuda:N", an int or a torch.device."""
    if isinstance(device, bool):
        raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device: CUDA index {device} is negative")
        return device
    text = str(device)  # torch.device prints as "cuda:0" / "cpu"
    if text == "cpu":
        return -1
    if text == "cuda":
        return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def _param(value: Any, name: str) -> Any:
    """A scalar as float, or per-expert values as a host float32 tensor."""
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return float(value)
    if isinstance(value, (list, tuple)):
        return np.asarray(value, dtype=np.float32)
    if not _tensors.is_tensor(value):
        raise ValueError(f"{name}: expected a number or per-expert float32 values, got {type(value).__name__}")
    return _tensors.host(value, name)


def _f32(value: Any, name: str) -> Any:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return np.asarray(value, dtype=np.float32)
    return _tensors.host(value, name)


_SITU_ONLY = ("beta", "linear_beta")
_BIAS_ONLY = ("alpha", "limit", "gate_bias", "up_bias", "w13_bias")


def _check_params_apply(kind: ActivationType, given: Dict[str, Any]) -> None:
    # A parameter the kind does not read is a mistake (e.g. SiTU betas with Swiglu), not a no-op.
    for name, value in given.items():
        if value is None:
            continue
        if name in _SITU_ONLY and kind != ActivationType.Situ:
            raise ValueError(f"{name}: only used by Situ, not {kind.name}")
        if name in _BIAS_ONLY and kind != ActivationType.SwigluBias:
            raise ValueError(f"{name}: only used by SwigluBias, not {kind.name}")


def prepare_experts(
    *,
    w1: Any = None,
    w1_scale: Any = None,
    w3: Any = None,
    w3_scale: Any = None,
    w2: Any = None,
    w2_scale: Any = None,
    w13: Any = None,
    w13_scale: Any = None,
    layout: Optional[str] = None,
    activation: ActivationLike = ActivationType.Situ,
    beta: Any = None,
    linear_beta: Any = None,
    alpha: Any = None,
    limit: Any = None,
    gate_bias: Any = None,
    up_bias: Any = None,
    w13_bias: Any = None,
    tp_size: int = 1,
    tp_rank: int = 0,
    ep_size: int = 1,
    ep_rank: int = 0,
    local: bool = False,
    top_k: Optional[int] = None,
    device: Device = "cpu",
    num_threads: int = 0,
) -> PreparedExperts:
    """Prepares one layer's routed experts (MXFP4) for the operator.

    Weights, in the checkpoint's layout (SPEC section 4), each either one stacked tensor or a list
    with one 2-D tensor per expert:
      w1, w3 (gate, up): uint8 [E, I, K/2] packed E2M1 (element 2i in the low nibble) and
      w1_scale, w3_scale: uint8 (or float8_e8m0fnu) [E, I, K/32] UE8M0;
      w2 (down): [E, K, I/2] and w2_scale [E, K, I/32].
    Or, instead of w1 / w3, a fused w13 [E, 2I, K/2] with w13_scale [E, 2I, K/32] in `layout`:
      "gate_up" (SGLang's w13, [gate; up]), "up_gate" (FlashInfer's CUTLASS MoE, [up; gate]) or
      "interleaved" (GPT-OSS: row 2i gate row i, row 2i+1 up row i).

    activation: an ActivationType, its value or its name (default Situ). Its parameters, each a
    number for every expert or per-expert values (float32 [E] over the experts given):
      Situ: beta (gate, default 4.0), linear_beta (up, default 25.0);
      SwigluBias: alpha (1.702), limit (7.0), and biases gate_bias / up_bias [E, I] or a fused
      w13_bias [E, 2I] in `layout`.
    A parameter the kind does not use is refused.

    Parallel slices (SPEC section 1): by default the weights are the whole layer (global E and I)
    and this rank's share is cut out here: experts [r*E/ep, (r+1)*E/ep) and rows [r*I/tp,
    (r+1)*I/tp) of w1 / w3 (and biases), the same columns of w2. With local=True the weights given
    are already this rank's share (E/ep experts of I/tp rows each, as an engine holds them after its
    own sharding); the global E and I are then E_given*ep and I_given*tp. Either way per-expert
    parameters and biases cover the experts given. Expert ids in topk_ids stay global.

    top_k: fixes k (each call's topk_ids must then be [T, top_k]); None takes k from each call
    (CPU only: the CUDA backend's layout is fixed at prepare time and needs top_k).

    device: "cpu", or "cuda" / "cuda:N" / an index / a torch.device for the CUDA backend (in a
    build without it, NotImplementedError). Weights are read on the host: torch and cupy tensors on
    a GPU are copied to the host first; CPU tensors (numpy, torch, memory-mapped safetensors) are
    read in place and copied once into the prepared layout.

    Errors: ValueError naming the argument (dtype, shape, slice, parameter), NotImplementedError for
    an activation kind mxmoe does not implement or a device without a backend.
    """
    kind = activation_type(activation)
    _check_params_apply(
        kind,
        dict(beta=beta, linear_beta=linear_beta, alpha=alpha, limit=limit, gate_bias=gate_bias,
             up_bias=up_bias, w13_bias=w13_bias),
    )
    if layout is not None and not isinstance(layout, str):
        raise ValueError(f"layout: expected one of {', '.join(FC1_LAYOUTS)}, got {layout!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise ValueError(f"top_k: expected a positive integer or None, got {top_k!r}")
    h = _tensors.host_list
    impl = _C.prepare_experts(
        h(w1, "w1"), h(w1_scale, "w1_scale"), h(w3, "w3"), h(w3_scale, "w3_scale"),
        h(w2, "w2"), h(w2_scale, "w2_scale"), h(w13, "w13"), h(w13_scale, "w13_scale"),
        layout or "",
        _f32(gate_bias, "gate_bias"), _f32(up_bias, "up_bias"), _f32(w13_bias, "w13_bias"),
        int(kind),
        _param(beta, "beta"), _param(linear_beta, "linear_beta"), _param(alpha, "alpha"), _param(limit, "limit"),
        int(tp_size), int(tp_rank), int(ep_size), int(ep_rank), bool(local),
        int(top_k or 0), _device_index(device), int(num_threads),
    )
    return PreparedExperts(impl)


def synthetic_experts(
    num_experts: int,
    hidden: int,
    intermediate: int,
    top_k: Optional[int] = None,
    *,
    activation: ActivationLike = ActivationType.Situ,
    beta: Any = None,
    linear_beta: Any = None,
    alpha: Any = None,
    limit: Any = None,
    tp_size: int = 1,
    tp_rank: int = 0,
    ep_size: int = 1,
    ep_rank: int = 0,
    seed: int = 1,
    scale_exp_jitter: int = 1,
    with_bias: bool = False,
    device: Device = "cpu",
    num_threads: int = 0,
) -> PreparedExperts:
    """A synthetic layer from a fixed seed (the C++ MakeSyntheticExperts): expert e's weights depend
    only on (seed, e), so any TP / EP slice is the slice of the same unsplit layer. Per-expert
    parameters are given over all num_experts experts. with_bias adds SwigluBias biases."""
    kind = activation_type(activation)
    _check_params_apply(kind, dict(beta=beta, linear_beta=linear_beta, alpha=alpha, limit=limit))
    impl = _C.synthetic_experts(
        int(num_experts), int(hidden), int(intermediate), int(top_k or 0), int(kind),
        _param(beta, "beta"), _param(linear_beta, "linear_beta"), _param(alpha, "alpha"), _param(limit, "limit"),
        int(tp_size), int(tp_rank), int(ep_size), int(ep_rank), int(seed), int(scale_exp_jitter),
        bool(with_bias), _device_index(device), int(num_threads),
    )
    return PreparedExperts(impl)


def synthetic_weights(
    num_experts: int, hidden: int, intermediate: int, *, seed: int = 1, scale_exp_jitter: int = 1,
    with_bias: bool = False,
) -> Dict[str, np.ndarray]:
    """The unsplit synthetic layer's weights as checkpoint-layout numpy arrays (see
    PreparedExperts.export_weights): input for prepare_experts in tests and examples."""
    kind = ActivationType.SwigluBias if with_bias else ActivationType.Situ
    experts = synthetic_experts(num_experts, hidden, intermediate, activation=kind, seed=seed,
                                scale_exp_jitter=scale_exp_jitter, with_bias=with_bias)
    return experts.export_weights()


ROUTING_PATTERNS = ("uniform", "one_expert", "few_experts", "with_invalid", "heavy_hitters")


def synthetic_input(
    num_experts: int, hidden: int, top_k: int, num_tokens: int, *, pattern: str = "uniform", seed: int = 1,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x [T, K] bf16 bits as uint16, topk_ids [T, k] int32, topk_weights [T, k] float32) from a
    fixed seed, routed by `pattern` (one of ROUTING_PATTERNS; "with_invalid" has -1 slots)."""
    return tuple(_C.synthetic_input(int(num_experts), int(hidden), int(top_k), int(num_tokens), str(pattern),
                                    int(seed)))

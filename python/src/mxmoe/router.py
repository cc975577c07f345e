"""Kimi-K3's router (SPEC section 5): the C++ KimiK3Route on the CPU, KimiK3RouteCuda (one fused
kernel) on a CUDA device."""

from __future__ import annotations

import numbers
from typing import Any, Optional, Tuple

from . import _mxmoe as _C
from . import _tensors


def kimi_k3_router(
    logits: Any,
    correction_bias: Any,
    top_k: int = 16,
    routed_scaling_factor: float = 1.0,
    *,
    topk_ids: Any = None,
    topk_weights: Any = None,
    stream: Any = None,
) -> Tuple[Any, Any]:
    """(topk_ids [T, top_k] int32, topk_weights [T, top_k] float32) for logits [T, E] and
    e_score_correction_bias [E] float32.

    s = sigmoid(logits); experts are picked by s + correction_bias (the bias steers selection
    only), top_k of them in descending order of that score, the lower expert id first on equal
    scores (deterministic) and NaN below every number; the weights are the picked s renormalized
    to sum 1 (denominator sum + 1e-20), times routed_scaling_factor. All in float32.

    logits: float32, or bfloat16 (torch.bfloat16, or its bits as uint16 for numpy / cupy), widened
    to float32 exactly. Where the logits are decides where it runs: CPU tensors (numpy, torch) on
    the CPU; CUDA tensors (torch, cupy) on their device, in one kernel on `stream` (default: the
    framework's current stream), with no synchronization and no allocation of its own, so it can be
    captured in a CUDA graph (pass preallocated topk_ids / topk_weights to keep the outputs'
    addresses fixed). Both give the same ids and the same weight bits. Every tensor must be on the
    logits' device; results are allocated there, in the logits' framework, unless given.
    """
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1:
        raise ValueError(f"top_k: expected a positive integer, got {top_k!r}")
    if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, numbers.Real):
        raise ValueError(f"routed_scaling_factor: expected a number, got {routed_scaling_factor!r}")
    logits = _tensors.operand(logits)
    correction_bias = _tensors.operand(correction_bias)
    if not _tensors.is_tensor(logits) or len(getattr(logits, "shape", ())) != 2:
        raise ValueError(f"logits: expected a [num_tokens, num_experts] float32 or bfloat16 tensor, got "
                         f"{getattr(logits, 'shape', type(logits).__name__)}")
    num_tokens = int(logits.shape[0])
    if topk_ids is None:
        topk_ids = _tensors.empty(logits, (num_tokens, int(top_k)), "int32")
    if topk_weights is None:
        topk_weights = _tensors.empty(logits, (num_tokens, int(top_k)), _tensors.F32)
    _tensors.check_writable(topk_ids, "topk_ids")
    _tensors.check_writable(topk_weights, "topk_weights")
    _C.kimi_k3_route(logits, correction_bias, int(top_k), float(routed_scaling_factor),
                     _tensors.operand(topk_ids), _tensors.operand(topk_weights),
                     _tensors.stream_of(logits, stream))
    return topk_ids, topk_weights

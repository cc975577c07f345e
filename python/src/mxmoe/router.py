"""Kimi-K3's router (SPEC section 5), the C++ KimiK3Route."""

from __future__ import annotations

import numbers
from typing import Any, Tuple

from . import _mxmoe as _C
from . import _tensors


def kimi_k3_router(
    logits: Any, correction_bias: Any, top_k: int = 16, routed_scaling_factor: float = 1.0,
) -> Tuple[Any, Any]:
    """(topk_ids [T, top_k] int32, topk_weights [T, top_k] float32) for logits [T, E] float32 and
    e_score_correction_bias [E] float32, on the CPU (numpy or torch CPU tensors; results in the
    logits' framework).

    s = sigmoid(logits); experts are picked by s + correction_bias (the bias steers selection
    only), top_k of them in descending order of that score, the lower expert id first on equal
    scores (deterministic) and NaN below every number; the weights are the picked s renormalized
    to sum 1 (denominator sum + 1e-20), times routed_scaling_factor. All in float32.
    """
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1:
        raise ValueError(f"top_k: expected a positive integer, got {top_k!r}")
    logits = _tensors.operand(logits)
    correction_bias = _tensors.operand(correction_bias)
    if not _tensors.is_tensor(logits) or len(getattr(logits, "shape", ())) != 2:
        raise ValueError(f"logits: expected a [num_tokens, num_experts] float32 tensor, got "
                         f"{getattr(logits, 'shape', type(logits).__name__)}")
    num_tokens = int(logits.shape[0])
    topk_ids = _tensors.empty(logits, (num_tokens, int(top_k)), "int32")
    topk_weights = _tensors.empty(logits, (num_tokens, int(top_k)), _tensors.F32)
    _C.kimi_k3_route(logits, correction_bias, int(top_k), float(routed_scaling_factor), topk_ids, topk_weights)
    return topk_ids, topk_weights

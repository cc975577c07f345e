"""The operator: fused_moe (the prepared backend), reference_moe (the definition of correct)."""

from __future__ import annotations

from typing import Any, Optional

from . import _mxmoe as _C
from . import _tensors
from .experts import PreparedExperts


def workspace_size(experts: PreparedExperts, max_tokens: int) -> int:
    """Workspace bytes fused_moe needs for calls of up to max_tokens tokens (0 on the CPU)."""
    _check_experts(experts)
    return int(_C.workspace_size(experts._impl, int(max_tokens)))


def fused_moe(
    x: Any,
    topk_ids: Any,
    topk_weights: Any,
    experts: PreparedExperts,
    *,
    out: Any = None,
    out_dtype: Any = None,
    workspace: Any = None,
    stream: Any = None,
) -> Any:
    """This rank's routed-expert output (SPEC section 1) into out [T, K].

    x: [T, K] bf16 (torch.bfloat16, or its bits as numpy uint16), or an MXFP8 pair
    (x_e4m3 [T, K] uint8 / float8_e4m3fn, x_scale [T, K/32] uint8 / float8_e8m0fnu).
    topk_ids: [T, k] int32 global expert ids, -1 = none; topk_weights: [T, k] float32.
    out: [T, K] bf16 (uint16 bits for numpy) or float32, written in place and returned; allocated
    in x's framework and device when None, with out_dtype (bf16 default, or "float32" /
    torch.float32 / numpy.float32). Every tensor C-contiguous and on the experts' device; the
    operator reads and writes them in place (no copies).
    workspace: uint8 scratch of at least workspace_size(experts, T) bytes (allocated when None and
    needed; 0 on the CPU). stream: a cudaStream_t as int, or a torch / cupy stream; default the
    framework's current stream (CUDA only).
    Under TP or EP the result is the rank's partial sum: the all-reduce / combine is the caller's.
    """
    return _call(x, topk_ids, topk_weights, experts, out, out_dtype, workspace, stream, reference=False)


def reference_moe(
    x: Any,
    topk_ids: Any,
    topk_weights: Any,
    experts: PreparedExperts,
    *,
    out: Any = None,
    out_dtype: Any = None,
    workspace: Any = None,
    stream: Any = None,
) -> Any:
    """fused_moe's arguments, computed by the reference: the C++ ReferenceMoe (plain loops, the
    definition of correct) for CPU-prepared experts, the unfused GPU reference for CUDA ones."""
    return _call(x, topk_ids, topk_weights, experts, out, out_dtype, workspace, stream, reference=True)


def _check_experts(experts: Any) -> None:
    if not isinstance(experts, PreparedExperts):
        raise ValueError(f"experts: expected a PreparedExperts (from prepare_experts), got {type(experts).__name__}")


def _call(x, topk_ids, topk_weights, experts, out, out_dtype, workspace, stream, reference):
    _check_experts(experts)
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ValueError(f"x: an MXFP8 input is a pair (x_e4m3, x_scale), got {len(x)} items")
        x_main, x_scale = _tensors.operand(x[0]), _tensors.operand(x[1])
        x_name = "x_e4m3"
    else:
        x_main, x_scale, x_name = _tensors.operand(x), None, "x"
    if not _tensors.is_tensor(x_main) or len(getattr(x_main, "shape", ())) != 2:
        raise ValueError(f"{x_name}: expected a [num_tokens, hidden] tensor, got "
                         f"{getattr(x_main, 'shape', type(x_main).__name__)}")
    num_tokens = int(x_main.shape[0])
    want = _tensors.output_kind(out_dtype)
    if out is None:
        out = _tensors.empty(x_main, (num_tokens, experts.hidden), want or _tensors.BF16)
    else:
        have = _tensors.kind_of_output(out)
        if want is not None and have is not None and want != have:
            raise ValueError(f"out_dtype: {out_dtype} disagrees with out's dtype {out.dtype}")
        _tensors.check_writable(out)
    if workspace is None:
        size = workspace_size(experts, num_tokens)
        if size > 0:
            workspace = _tensors.empty(x_main, (size,), "uint8")
    _C.run(
        experts._impl,
        x_main,
        x_scale,
        _tensors.operand(topk_ids),
        _tensors.operand(topk_weights),
        _tensors.operand(out),
        workspace,
        _tensors.stream_of(x_main, stream),
        reference,
    )
    return out

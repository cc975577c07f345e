"""mxmoe: a fused Mixture-of-Experts operator, MXFP8 activations x MXFP4 weights, gated
activations (first of all Kimi-K3's SiTU). The Python binding of the C++ library.

    experts = mxmoe.prepare_experts(w1=..., w1_scale=..., w3=..., w3_scale=..., w2=..., w2_scale=...,
                                    activation="situ")
    out = mxmoe.fused_moe(x_bf16, topk_ids, topk_weights, experts)

Errors: ValueError for an invalid argument (naming it, with the C++ message), NotImplementedError
(a RuntimeError) for a valid request this build or device cannot serve, RuntimeError otherwise.
"""

from . import _mxmoe as _C
from .activation import GATED, IMPLEMENTED, ActivationType, activation_type, is_gated, is_implemented
from .backend import BackendChoice, select_backend
from .experts import (
    FC1_LAYOUTS,
    ROUTING_PATTERNS,
    PreparedExperts,
    prepare_experts,
    synthetic_experts,
    synthetic_input,
    synthetic_weights,
)
from .formats import bf16_to_float32, float32_to_bf16
from .ops import fused_moe, reference_moe, workspace_size
from .router import kimi_k3_router
from . import flashinfer  # mxmoe.flashinfer.cutlass_fused_moe: FlashInfer's call, served by mxmoe

__version__ = _C.__version__


def cuda_built() -> bool:
    """Whether this build has the CUDA backend (pip install with MXMOE_PYTHON_CUDA=1)."""
    return bool(_C.cuda_built())


def cuda_archs() -> str:
    """The SASS targets compiled in ("sm_90a sm_120a"), empty without CUDA."""
    return str(_C.cuda_archs())


def cuda_devices() -> list:
    """[(index, name, major, minor, sm_count, total_memory)] for the GPUs the runtime sees."""
    return list(_C.cuda_devices())


__all__ = [
    "ActivationType", "GATED", "IMPLEMENTED", "activation_type", "is_gated", "is_implemented",
    "PreparedExperts", "prepare_experts", "FC1_LAYOUTS",
    "fused_moe", "reference_moe", "workspace_size",
    "kimi_k3_router", "select_backend", "BackendChoice", "flashinfer",
    "synthetic_experts", "synthetic_weights", "synthetic_input", "ROUTING_PATTERNS",
    "bf16_to_float32", "float32_to_bf16", "cuda_built", "cuda_archs", "cuda_devices", "__version__",
]

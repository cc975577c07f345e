"""Whether an engine should route a model's MoE layers to mxmoe.

mxmoe is for one situation: the routed experts are MXFP4 and their activation is one mxmoe
implements but the engine's own fused MoE does not (today: Kimi-K3's SiTU), on a GPU mxmoe has
kernels for (SM90, SM120). Everything else (GPT-OSS's MXFP4 SwiGLU, DeepSeek's fp8 experts,
unquantized Qwen MoE, configs this does not recognize, other GPUs) stays on the engine's path,
and the reason says why.

The decision reads only the model config and the device capability; it does not check that this
build has the CUDA backend (prepare_experts(device="cuda") refuses if it has not).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, Mapping, Optional, Tuple

from .activation import IMPLEMENTED, ActivationType

#: Gated kinds the engines' own fused MoE kernels run (FlashInfer's CUTLASS / TRT-LLM MoE and
#: SGLang's Triton MoE: SwiGLU, GPT-OSS's clamped SwiGLU with biases, GeGLU).
ENGINE_ACTIVATIONS = frozenset(
    {ActivationType.Swiglu, ActivationType.SwigluBias, ActivationType.Geglu, ActivationType.GegluTanh}
)
#: What only mxmoe provides: implemented here, absent from the engines.
MXMOE_ONLY_ACTIVATIONS = frozenset(IMPLEMENTED - ENGINE_ACTIVATIONS)

#: Compute-capability majors with mxmoe kernels.
SUPPORTED_CAPABILITIES = {9: "SM90", 12: "SM120"}

# hidden_act spellings of MoE configs. In a MoE config "silu" names the SwiGLU expert MLP.
_HIDDEN_ACT = {
    "situ": ActivationType.Situ,
    "silu": ActivationType.Swiglu,
    "swiglu": ActivationType.Swiglu,
    "gelu": ActivationType.Geglu,
    "geglu": ActivationType.Geglu,
    "gelu_tanh": ActivationType.GegluTanh,
    "gelu_pytorch_tanh": ActivationType.GegluTanh,
}

_MXFP4_FORMAT = "mxfp4-pack-quantized"
# A routed expert's projections as mxmoe reads them (SPEC section 4), and the Linear class they
# are: what a compressed-tensors group's targets and ignore patterns are matched against.
_EXPERT_MODULES = tuple(
    f"language_model.model.layers.1.block_sparse_moe.experts.0.w{w}" for w in (1, 2, 3)
) + tuple(f"model.layers.1.mlp.experts.0.{p}" for p in ("gate_proj", "up_proj", "down_proj"))


@dataclasses.dataclass(frozen=True)
class BackendChoice:
    use_mxmoe: bool
    reason: str
    activation: Optional[ActivationType] = None  # the experts' kind, when recognized


def _get(cfg: Mapping[str, Any], name: str) -> Any:
    """A field under text_config first, then at the top level (as the C++ config reader)."""
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and name in text:
        return text[name]
    return cfg.get(name)


def _model_name(cfg: Mapping[str, Any]) -> str:
    archs = cfg.get("architectures") or []
    model_type = cfg.get("model_type") or _get(cfg, "model_type") or "unknown model_type"
    return f"{model_type} ({archs[0]})" if archs else str(model_type)


def _module_matches(pattern: str, module: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module) is not None
    return pattern == module or module.endswith("." + pattern) or pattern == "Linear"


def _covers_experts(targets: Any, ignore: Any) -> bool:
    """Whether a compressed-tensors group quantizes the routed experts' projections: its targets
    reach them and no ignore entry leaves any of them out (conservative: one ignored projection, in
    either naming, and the experts are not taken to be MXFP4)."""
    targets = targets or ["Linear"]
    ignore = [i for i in (ignore or []) if i != "Linear"]
    targeted = any(_module_matches(t, m) for t in targets for m in _EXPERT_MODULES)
    ignored = any(_module_matches(i, m) for i in ignore for m in _EXPERT_MODULES)
    return targeted and not ignored


def _experts_quantization(cfg: Mapping[str, Any]) -> Tuple[bool, str]:
    """(routed experts are MXFP4 with blocks of 32, a description)."""
    qc = _get(cfg, "quantization_config") or _get(cfg, "compression_config")
    if not qc:
        dtype = _get(cfg, "torch_dtype") or _get(cfg, "dtype") or "bf16"
        return False, f"unquantized routed experts ({dtype}, no quantization_config)"
    method = str(qc.get("quant_method", "")).lower()
    if method == "mxfp4":
        return True, "MXFP4 experts (quant_method mxfp4)"
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        ignore = qc.get("ignore") or []
        formats = []
        for group in groups.values():
            weights = group.get("weights") or {}
            fmt = group.get("format") or qc.get("format")
            formats.append(fmt or f"{weights.get('type')}{weights.get('num_bits')}")
            if not _covers_experts(group.get("targets"), ignore):
                continue
            fp4 = weights.get("type") == "float" and weights.get("num_bits") == 4
            if fmt == _MXFP4_FORMAT or (fmt is None and fp4):
                group_size = weights.get("group_size", 32)
                if group_size != 32:
                    return False, f"compressed-tensors MXFP4 with group_size {group_size}, not 32"
                return True, f"MXFP4 experts (compressed-tensors {_MXFP4_FORMAT}, group 32)"
        shown = ", ".join(sorted({str(f) for f in formats})) or "no config_groups"
        return False, f"routed experts not MXFP4 (compressed-tensors {shown})"
    if method == "fp8":
        block = qc.get("weight_block_size")
        return False, f"routed experts are fp8 (quant_method fp8{', block ' + str(block) if block else ''}), not MXFP4"
    return False, f"routed experts not MXFP4 (quant_method {method or 'missing'})"


def _experts_activation(cfg: Mapping[str, Any]) -> Tuple[Optional[ActivationType], str]:
    model_type = str(cfg.get("model_type") or _get(cfg, "model_type") or "")
    if model_type == "gpt_oss" or _get(cfg, "swiglu_limit") is not None:
        return ActivationType.SwigluBias, "GPT-OSS's clamped SwiGLU with biases (SwigluBias)"
    act = _get(cfg, "hidden_act")
    if act is None:
        return None, "no hidden_act"
    kind = _HIDDEN_ACT.get(str(act).lower())
    if kind is None:
        return None, f"hidden_act '{act}' is not an activation mxmoe knows"
    return kind, f"hidden_act '{act}' ({kind.name})"


def _num_experts(cfg: Mapping[str, Any]) -> Optional[int]:
    for name in ("num_experts", "n_routed_experts", "num_local_experts"):
        value = _get(cfg, name)
        if isinstance(value, int) and value > 1:
            return value
    return None


def select_backend(model_config: Mapping[str, Any], device_capability: Tuple[int, int]) -> BackendChoice:
    """BackendChoice(use_mxmoe, reason): mxmoe for MXFP4 routed experts whose activation only mxmoe
    implements (MXMOE_ONLY_ACTIVATIONS: Kimi-K3's SiTU) on SM90 (9, x) or SM120 (12, x); otherwise
    the engine's own MoE, with the reason. model_config is the parsed config.json (fields at top
    level or under text_config); device_capability is (major, minor), e.g.
    torch.cuda.get_device_capability()."""
    if not isinstance(model_config, Mapping):
        raise ValueError(f"model_config: expected a dict (the parsed config.json), got {type(model_config).__name__}")
    if (
        not isinstance(device_capability, (tuple, list))
        or len(device_capability) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in device_capability)
    ):
        raise ValueError(f"device_capability: expected (major, minor) integers, got {device_capability!r}")
    name = _model_name(model_config)
    major, minor = device_capability

    if _num_experts(model_config) is None:
        return BackendChoice(False, f"{name}: not a mixture-of-experts config (no num_experts / n_routed_experts)")
    mxfp4, quant = _experts_quantization(model_config)
    kind, act = _experts_activation(model_config)
    if not mxfp4:
        return BackendChoice(False, f"{name}: {quant}; mxmoe runs MXFP4 experts only", kind)
    if kind is None:
        return BackendChoice(False, f"{name}: unrecognized expert activation ({act})", None)
    if kind not in IMPLEMENTED:
        return BackendChoice(False, f"{name}: {act} is not implemented by mxmoe", kind)
    if kind not in MXMOE_ONLY_ACTIVATIONS:
        return BackendChoice(
            False, f"{name}: {quant} with {act}, which the engine's own MXFP4 MoE runs; mxmoe is for "
            f"{', '.join(sorted(k.name for k in MXMOE_ONLY_ACTIVATIONS))}", kind)
    intermediate = _get(model_config, "moe_intermediate_size")
    if isinstance(intermediate, int) and intermediate % 32 != 0:
        return BackendChoice(False, f"{name}: moe_intermediate_size {intermediate} is not a multiple of 32", kind)
    arch = SUPPORTED_CAPABILITIES.get(major)
    if arch is None:
        supported = " and ".join(f"{v} ({k}, x)" for k, v in SUPPORTED_CAPABILITIES.items())
        return BackendChoice(
            False, f"{name}: no mxmoe kernels for compute capability {major}.{minor} ({supported} only)", kind)
    return BackendChoice(True, f"{name}: {quant} with {act}, which only mxmoe implements, on {arch}", kind)

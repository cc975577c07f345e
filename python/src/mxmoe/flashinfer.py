"""FlashInfer's cutlass_fused_moe, for the MXFP8 x MXFP4 case, served by mxmoe.

An engine that calls

    from flashinfer.fused_moe import cutlass_fused_moe

switches by changing that one import to

    from mxmoe.flashinfer import cutlass_fused_moe

Same argument names, positions, defaults and tensor layouts as FlashInfer's function (the version
with situ_beta / situ_linear_beta), with FlashInfer's MXFP8 x MXFP4 conventions
(use_mxfp8_act_scaling=True):

  input                   [T, K] float8_e4m3fn (uint8 codes for numpy)
  input_sf                the input's UE8M0 scales, one per 32 of K, in the 128x4 swizzled layout
                          (swizzled_input_sf=True, what mxfp8_quantize(x, True) writes) or linear
                          [T, K/32] (swizzled_input_sf=False)
  token_selected_experts  [T, k] int32 global expert ids
  token_final_scales      [T, k] float32
  fc1_expert_weights      [E_local, 2*I_local, K/16] int64 (or [.., K/2] uint8): packed E2M1,
                          element 2i in the low nibble; rows [up; gate] (w3 first)
  fc2_expert_weights      [E_local, K, I_local/16] int64 (or [.., I_local/2] uint8)
  quant_scales            [fc1 weight block scales, fc1 global scale, fc2 weight block scales,
                          fc2 global scale]: the block scales UE8M0 in the 128x4 swizzled layout,
                          per expert [pad128(rows), pad4(cols / 32)] bytes (int32 views as
                          FlashInfer takes them, or uint8); the global scales float32 [E_local]
  tp_size, tp_rank, ep_size, ep_rank
                          the weights are this rank's share (E / ep experts, I / tp rows); ids
                          are global; the result is the rank's partial sum
  situ_beta, situ_linear_beta
                          float32 [E_local] per-expert SiTU parameters, None for 4.0 / 25.0

It maps onto mxmoe.prepare_experts(w13=..., layout="up_gate", local=True, ...) and
mxmoe.fused_moe. Preparing (unswizzling the scales, copying the weights into mxmoe's layout) runs
on the first call with a set of weights and is cached: see _ExpertCache for the key and its
lifetime. The differences from FlashInfer are listed in python/README.md; whatever this cannot
serve is refused by name (NotImplementedError), never run as something else.
"""

from __future__ import annotations

import re
import sys
import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _tensors
from .activation import ActivationType, is_implemented
from .activation import activation_type as _activation_kind
from .experts import PreparedExperts, prepare_experts
from .ops import fused_moe, workspace_size

__all__ = ["cutlass_fused_moe", "cache_size", "clear_cache", "swizzle_block_scales", "unswizzle_block_scales"]

_SF_BLOCK = 32  # elements per UE8M0 scale
_SF_ROW_TILE = 128  # the 128x4 swizzled layout pads rows to 128 ...
_SF_COL_TILE = 4  # ... and scale columns to 4

#: Activations this entry point passes through: gated, implemented by mxmoe, and with no
#: parameters beyond the SiTU betas (SwigluBias needs alpha / limit / biases, which FlashInfer
#: gives as swiglu_* and fc1_expert_biases; see the refusals below).
_PASSED_ACTIVATIONS = (ActivationType.Situ, ActivationType.Swiglu, ActivationType.Geglu, ActivationType.GegluTanh)


# ---------------------------------------------------------------------------------------------
# The 128x4 swizzled scale layout (FlashInfer's fp4_quantize / mxfp8_quantize with
# is_sf_swizzled_layout=True, CUTLASS's block-scaled SF atom): a [rows, cols] scale matrix padded to
# [pad128(rows), pad4(cols)], cut into 128x4 tiles stored one after another (row tiles outer), each
# tile as [32][4 row groups][4 cols]: element (r, c) sits at
#   (r / 128) * (pad4(cols) * 128) + (c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4.


def _pad(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def swizzled_size(rows: int, cols: int) -> int:
    """Bytes of one [rows, cols] scale matrix in the 128x4 swizzled layout."""
    return _pad(rows, _SF_ROW_TILE) * _pad(cols, _SF_COL_TILE)


def _swizzle_index(xp: Any, rows: int, cols: int) -> Any:
    r = xp.arange(rows).reshape(rows, 1)
    c = xp.arange(cols).reshape(1, cols)
    col_tiles = _pad(cols, _SF_COL_TILE) // _SF_COL_TILE
    return ((r // 128) * (col_tiles * 512) + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4
            + (c % 4))


def _tiles(rows: int, cols: int) -> Tuple[int, int]:
    return _pad(rows, _SF_ROW_TILE) // _SF_ROW_TILE, _pad(cols, _SF_COL_TILE) // _SF_COL_TILE


def _unswizzled_view(flat: Any, batch: int, rows: int, cols: int) -> Any:
    """[batch, rows, cols] (strided) from `flat` bytes holding `batch` swizzled matrices: the layout
    is a tiling, [row tiles, col tiles, 32, 4 row groups, 4 cols], so a transpose undoes it (no
    index tensor: a copy kernel at most, in any framework, graph-safe)."""
    row_tiles, col_tiles = _tiles(rows, cols)
    tiled = flat.reshape(batch, row_tiles, col_tiles, 32, 4, 4)
    if _tensors.is_torch(tiled):
        tiled = tiled.permute(0, 1, 4, 3, 2, 5)
    else:
        tiled = tiled.transpose(0, 1, 4, 3, 2, 5)
    return tiled.reshape(batch, row_tiles * 128, col_tiles * 4)[:, :rows, :cols]


def unswizzle_block_scales(swizzled: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """[batch, rows, cols] linear scales from numpy bytes holding `batch` [rows, cols] matrices in
    the 128x4 swizzled layout (any shape; the batch is the number of matrices the bytes hold)."""
    per = swizzled_size(rows, cols)
    flat = np.ascontiguousarray(swizzled).view(np.uint8).reshape(-1)
    batch = flat.size // per if per else 0
    if flat.size != batch * per:
        raise ValueError(f"swizzled scales: {flat.size} bytes is not a multiple of {per} "
                         f"(one [{rows}, {cols}] matrix padded to [{_pad(rows, 128)}, {_pad(cols, 4)}])")
    return np.ascontiguousarray(_unswizzled_view(flat, batch, rows, cols))


def swizzle_block_scales(linear: np.ndarray) -> np.ndarray:
    """The inverse, for tests and tools: [E, rows, cols] uint8 scales -> [E, pad128(rows),
    pad4(cols)] in the 128x4 swizzled layout (padding zero), as FlashInfer's quantizers write them."""
    linear = np.asarray(linear, dtype=np.uint8)
    squeeze = linear.ndim == 2
    if squeeze:
        linear = linear[None]
    e, rows, cols = linear.shape
    out = np.zeros((e, swizzled_size(rows, cols)), np.uint8)
    out[:, _swizzle_index(np, rows, cols)] = linear
    out = out.reshape(e, _pad(rows, 128), _pad(cols, 4))
    return out[0] if squeeze else out


def _unswizzle_rows(sf: Any, rows: int, cols: int) -> Any:
    """The input's [rows, cols] linear scales from its swizzled ones, on their device and in their
    framework (FlashInfer's buffer may be longer than the padded matrix: the rest is ignored)."""
    flat = sf.reshape(-1)[:swizzled_size(rows, cols)]
    view = _unswizzled_view(flat, 1, rows, cols)[0]
    if _tensors.is_torch(view):
        return view.contiguous()
    if _tensors.is_cupy(view):
        return sys.modules["cupy"].ascontiguousarray(view)
    return np.ascontiguousarray(view)


# ---------------------------------------------------------------------------------------------
# Tensor helpers (framework-neutral; no framework is imported here)


def _shape(t: Any) -> Tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def _dtype_name(t: Any) -> str:
    return str(getattr(t, "dtype", type(t).__name__)).replace("torch.", "")


def _bytes_view(t: Any, name: str) -> Any:
    """The tensor's bytes, last axis widened by the item size (int64 packed weights, int32 packed
    scales, float8 codes all become uint8), on its device, without a copy."""
    if not _tensors.is_tensor(t):
        raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
    if _tensors.is_torch(t):
        torch = sys.modules["torch"]
        t = t.detach()
        if not t.is_contiguous():
            raise ValueError(f"{name}: must be contiguous")
        return t.view(torch.uint8) if t.dtype != torch.uint8 else t
    if _tensors.is_cupy(t):
        if not t.flags.c_contiguous:
            raise ValueError(f"{name}: must be contiguous")
        return t.view(sys.modules["cupy"].uint8)
    a = np.asarray(t)
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: must be contiguous")
    return a.view(np.uint8)


def _host_numpy(t: Any) -> np.ndarray:
    """A host numpy array of t's values (copied from a GPU)."""
    if _tensors.is_torch(t):
        return t.detach().cpu().numpy()
    if _tensors.is_cupy(t):
        return sys.modules["cupy"].asnumpy(t)
    return np.asarray(t)


def _is_float8_e4m3(t: Any) -> bool:
    return _dtype_name(t) == "float8_e4m3fn"


def _is_bf16(t: Any) -> bool:
    name = _dtype_name(t)
    return name == "bfloat16" or (not _tensors.is_torch(t) and name == "uint16")


def _is_uint8(t: Any) -> bool:
    return _dtype_name(t) == "uint8"


def _device_string(t: Any) -> str:
    kind, index = _tensors.device_of(t)
    return "cpu" if kind == "cpu" else f"{kind}:{index}"


def _capturing(t: Any) -> bool:
    if not _tensors.is_torch(t) or t.device.type != "cuda":
        return False
    return bool(sys.modules["torch"].cuda.is_current_stream_capturing())


# ---------------------------------------------------------------------------------------------
# The cache of prepared experts


def _data_ptr(t: Any) -> int:
    if _tensors.is_torch(t):
        return int(t.data_ptr())
    if _tensors.is_cupy(t):
        return int(t.data.ptr)
    return int(np.asarray(t).__array_interface__["data"][0])


def _root(t: Any) -> Any:
    """The object whose lifetime is that of t's memory: a torch tensor's storage (torch keeps one
    Python object per live storage, and a dtype view such as w.view(torch.long) has no _base), the
    end of a numpy / cupy view's base chain."""
    if _tensors.is_torch(t):
        return t.untyped_storage()
    while type(getattr(t, "base", None)) is type(t):
        t = t.base
    return t


def _tensor_key(t: Any) -> Any:
    """Where t's bytes are and what they are (address, shape, dtype, device); a number as itself."""
    if t is None or not _tensors.is_tensor(t):
        return t if t is None else ("value", float(t))
    return (_data_ptr(t), _shape(t), _dtype_name(t), _device_string(t))


def _version(t: Any) -> Optional[int]:
    """torch's in-place write counter (shared by a tensor and its views); None elsewhere."""
    if t is not None and _tensors.is_torch(t):
        return int(t._version)
    return None


class _ExpertCache:
    """Prepared experts per set of weight tensors.

    Key: the address, shape, dtype and device of fc1_expert_weights, fc2_expert_weights, the four
    quant_scales and situ_beta / situ_linear_beta, plus the activation, the TP / EP slice, top_k
    and the target device. An entry also records torch's version counters of those tensors: a
    write through torch (param.copy_(...), a reload into the same storage) changes a version and
    the next call prepares again, replacing the entry. numpy and cupy have no such counter:
    changing their weights in place is not detected (call clear_cache()).

    Lifetime: an entry lives as long as the weights' memory (torch: the tensors' storages, e.g. the
    nn.Parameter's behind `w.view(torch.long)`; numpy / cupy: the arrays at the end of the views'
    base chains); when one of them is freed the entry goes with it, so a later tensor that reuses
    the address is never taken for the old one. An
    owner that cannot be weakly referenced is held strongly instead, in at most
    _MAX_STRONG entries (least recently used dropped first).
    """

    _MAX_STRONG = 16

    def __init__(self) -> None:
        # Reentrant: a finalizer (an owner freed) may run during a garbage collection that starts
        # while this thread holds the lock.
        self._lock = threading.RLock()
        self._entries: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
        self._strong_order: List[Tuple[Any, ...]] = []
        self.prepares = 0  # how many times prepare_experts ran (tests read it)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            for entry in self._entries.values():
                for f in entry["finalizers"]:
                    f.detach()
            self._entries.clear()
            self._strong_order.clear()

    def _evict(self, key: Tuple[Any, ...]) -> None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                for f in entry["finalizers"]:
                    f.detach()
            if key in self._strong_order:
                self._strong_order.remove(key)

    def get(self, key: Tuple[Any, ...], versions: Tuple[Any, ...]) -> Optional[PreparedExperts]:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry["versions"] != versions:
                return None
            if key in self._strong_order:  # keep the recently used strong entries
                self._strong_order.remove(key)
                self._strong_order.append(key)
            return entry["experts"]

    def put(self, key: Tuple[Any, ...], versions: Tuple[Any, ...], experts: PreparedExperts,
            owners: Sequence[Any]) -> None:
        self._evict(key)  # an older version of the same weights
        finalizers, strong = [], []
        for owner in owners:
            try:
                finalizers.append(weakref.finalize(owner, self._evict, key))
            except TypeError:
                strong.append(owner)
        with self._lock:
            self.prepares += 1
            self._entries[key] = {"versions": versions, "experts": experts, "finalizers": finalizers,
                                  "strong": strong}
            if strong:
                self._strong_order.append(key)
                while len(self._strong_order) > self._MAX_STRONG:
                    old = self._strong_order.pop(0)
                    dropped = self._entries.pop(old, None)
                    for f in (dropped or {}).get("finalizers", []):
                        f.detach()


_CACHE = _ExpertCache()


def cache_size() -> int:
    """How many prepared expert sets the FlashInfer entry point holds."""
    return len(_CACHE)


def clear_cache() -> None:
    """Drops every prepared expert set (the next call with any weights prepares again)."""
    _CACHE.clear()


# ---------------------------------------------------------------------------------------------
# Argument names: mxmoe's own calls name their arguments; the caller knows FlashInfer's.

_RENAMES = (
    (r"x_e4m3|x", "input"),
    (r"x_scale", "input_sf"),
    (r"topk_ids", "token_selected_experts"),
    (r"topk_weights", "token_final_scales"),
    (r"out", "output"),
    (r"out_dtype", "output_dtype"),
    (r"workspace", "workspace_buffer"),
    (r"w13", "fc1_expert_weights"),
    (r"w13_scale", "quant_scales[0]"),
    (r"w2", "fc2_expert_weights"),
    (r"w2_scale", "quant_scales[2]"),
    (r"beta", "situ_beta"),
    (r"linear_beta", "situ_linear_beta"),
)


def _renamed(err: ValueError) -> ValueError:
    text = str(err)
    for ours, theirs in _RENAMES:
        m = re.match(rf"^(?:{ours})(?=[:\[])", text)
        if m:
            return ValueError(theirs + text[m.end():])
    return err


def _refuse(name: str, why: str) -> None:
    raise NotImplementedError(f"{name}: {why} (mxmoe.flashinfer serves FlashInfer's MXFP8 x MXFP4 case only)")


# ---------------------------------------------------------------------------------------------
# The entry point


def cutlass_fused_moe(
    input: Any,
    token_selected_experts: Any,
    token_final_scales: Any,
    fc1_expert_weights: Any,
    fc2_expert_weights: Any,
    output_dtype: Any,
    quant_scales: Sequence[Any],
    fc1_expert_biases: Any = None,
    fc2_expert_biases: Any = None,
    input_sf: Any = None,
    swiglu_alpha: Any = None,
    swiglu_beta: Any = None,
    swiglu_limit: Any = None,
    tp_size: int = 1,
    tp_rank: int = 0,
    ep_size: int = 1,
    ep_rank: int = 0,
    cluster_size: int = 1,
    cluster_rank: int = 0,
    output: Any = None,
    enable_alltoall: bool = False,
    use_deepseek_fp8_block_scale: bool = False,
    use_w4_group_scaling: bool = False,
    use_mxfp8_act_scaling: bool = False,
    min_latency_mode: bool = False,
    use_packed_weights: bool = False,
    use_wfp4afp8_humming: bool = False,
    tune_max_num_tokens: int = 8192,
    enable_pdl: Optional[bool] = None,
    activation_type: Any = ActivationType.Swiglu,
    swizzled_input_sf: bool = True,
    use_fused_finalize: bool = True,
    profile_ids: Optional[List[int]] = None,
    workspace_buffer: Any = None,
    *,
    situ_beta: Any = None,
    situ_linear_beta: Any = None,
) -> List[Any]:
    """FlashInfer's cutlass_fused_moe for MXFP8 activations x MXFP4 weights, computed by mxmoe
    (see the module docstring for the layouts). Returns [output] ([T, K], output_dtype), as
    FlashInfer returns a list whose first element is the output; under TP / EP the rank's partial
    sum. Runs on the input's device and, for CUDA tensors, on the framework's current stream.

    Accepted and without effect: tune_max_num_tokens, enable_pdl, profile_ids (no autotuner, no
    PDL), use_fused_finalize (mxmoe's combine is always the deterministic one). Refused by name
    (NotImplementedError): other quantization modes, min_latency_mode, enable_alltoall, clusters,
    biases, swiglu_alpha / swiglu_beta / swiglu_limit, activations mxmoe does not implement.
    """
    # What this cannot serve, named, before touching any tensor.
    for name, value in (("min_latency_mode", min_latency_mode), ("enable_alltoall", enable_alltoall),
                        ("use_deepseek_fp8_block_scale", use_deepseek_fp8_block_scale),
                        ("use_w4_group_scaling", use_w4_group_scaling), ("use_packed_weights", use_packed_weights),
                        ("use_wfp4afp8_humming", use_wfp4afp8_humming)):
        if value:
            _refuse(name, "not supported")
    if cluster_size != 1 or cluster_rank != 0:
        _refuse("cluster_size", f"clusters ({cluster_size}, rank {cluster_rank}) are not supported; use 1 / 0")
    for name, value in (("fc1_expert_biases", fc1_expert_biases), ("fc2_expert_biases", fc2_expert_biases),
                        ("swiglu_alpha", swiglu_alpha), ("swiglu_beta", swiglu_beta),
                        ("swiglu_limit", swiglu_limit)):
        if value is not None:
            _refuse(name, "not supported through this entry point (GPT-OSS's clamped SwiGLU with biases: use "
                          "mxmoe.prepare_experts(activation='SwigluBias', ...) and mxmoe.fused_moe)")
    try:
        kind = _activation_kind(activation_type if isinstance(activation_type, str) else int(activation_type))
    except (TypeError, ValueError):
        raise ValueError(f"activation_type: {activation_type!r} is not a FlashInfer ActivationType") from None
    if kind not in _PASSED_ACTIVATIONS:
        why = "not implemented by mxmoe" if not is_implemented(kind) else "its parameters do not pass through here"
        _refuse("activation_type", f"{kind.name} ({int(kind)}): {why}; "
                                   f"served: {', '.join(k.name for k in _PASSED_ACTIVATIONS)}")
    if kind != ActivationType.Situ:
        for name, value in (("situ_beta", situ_beta), ("situ_linear_beta", situ_linear_beta)):
            if value is not None:
                raise ValueError(f"{name}: only used by Situ, not {kind.name}")

    # The input: e4m3 codes with their scales (FlashInfer's mode), or bf16 that mxmoe quantizes.
    x = _tensors.operand(input)
    if not _tensors.is_tensor(x) or len(getattr(x, "shape", ())) != 2:
        raise ValueError(f"input: expected a [num_tokens, hidden_size] tensor, got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    num_tokens, hidden = _shape(x)
    if _is_float8_e4m3(input) or _is_uint8(x):
        if not use_mxfp8_act_scaling:
            _refuse("use_mxfp8_act_scaling", "False with an e4m3 input is FlashInfer's per-tensor FP8 mode; "
                                             "pass use_mxfp8_act_scaling=True with block scales in input_sf")
        if input_sf is None:
            raise ValueError("input_sf: missing: an e4m3 input needs its UE8M0 block scales")
        if hidden % _SF_BLOCK != 0:
            raise ValueError(f"input: hidden_size {hidden} is not a multiple of {_SF_BLOCK}")
        scale_cols = hidden // _SF_BLOCK
        sf = _bytes_view(_tensors.operand(input_sf), "input_sf")
        if _device_string(sf) != _device_string(x):
            raise ValueError(f"input_sf: is on {_device_string(sf)} but input is on {_device_string(x)}")
        size = int(np.prod(_shape(sf)))
        if swizzled_input_sf:
            need = swizzled_size(num_tokens, scale_cols)
            if size < need:
                raise ValueError(f"input_sf: {size} bytes, expected at least {need} (the 128x4 swizzled scales of "
                                 f"[{num_tokens}, {scale_cols}]; swizzled_input_sf=False for linear scales)")
            x_scale = _unswizzle_rows(sf, num_tokens, scale_cols)
        else:
            if size != num_tokens * scale_cols:
                raise ValueError(f"input_sf: {size} bytes, expected [{num_tokens}, {scale_cols}] linear scales")
            x_scale = sf.reshape(num_tokens, scale_cols)
        x_arg: Any = (x, x_scale)
    elif _is_bf16(x):
        if input_sf is not None:
            raise ValueError("input_sf: given with a bf16 input (scales go with an e4m3 input)")
        if not use_mxfp8_act_scaling:
            _refuse("use_mxfp8_act_scaling", "False with a bf16 input and FP4 weights is FlashInfer's NVFP4 mode; "
                                             "pass True to have mxmoe quantize the input to MXFP8")
        x_arg = x
    else:
        raise ValueError(f"input: expected float8_e4m3fn (or uint8 codes) with input_sf, or bfloat16, got "
                         f"{_dtype_name(x)}")

    # Weights (shapes only here; values are read when preparing).
    fc1 = _bytes_view(fc1_expert_weights, "fc1_expert_weights")
    fc2 = _bytes_view(fc2_expert_weights, "fc2_expert_weights")
    if len(_shape(fc1)) != 3:
        raise ValueError(f"fc1_expert_weights: expected [num_experts_on_rank, 2 * inter_size, hidden_size / 16] "
                         f"int64, got shape {_shape(fc1_expert_weights)}")
    if len(_shape(fc2)) != 3:
        raise ValueError(f"fc2_expert_weights: expected [num_experts_on_rank, hidden_size, inter_size / 16] int64, "
                         f"got shape {_shape(fc2_expert_weights)}")
    e_local, fc1_rows, fc1_bytes = _shape(fc1)
    if _shape(fc2)[0] != e_local:
        raise ValueError(f"fc2_expert_weights: {_shape(fc2)[0]} experts, fc1_expert_weights has {e_local}")
    if _shape(fc2)[1] != hidden:
        raise ValueError(f"fc2_expert_weights: hidden_size {_shape(fc2)[1]} (dimension 1) differs from input's {hidden}")
    if fc1_bytes * 2 != hidden:
        raise ValueError(f"fc1_expert_weights: {fc1_bytes * 2} packed E2M1 values per row, expected hidden_size "
                         f"{hidden}")
    inter_local = _shape(fc2)[2] * 2
    if fc1_rows != 2 * inter_local:
        raise ValueError(f"fc1_expert_weights: {fc1_rows} rows, expected 2 * inter_size = {2 * inter_local} "
                         f"([up; gate] for the gated {kind.name})")
    if not isinstance(quant_scales, (list, tuple)) or len(quant_scales) != 4:
        raise ValueError("quant_scales: expected 4 tensors for MXFP8 x MXFP4 (fc1 weight block scales, fc1 global "
                         "scale, fc2 weight block scales, fc2 global scale), got "
                         f"{len(quant_scales) if isinstance(quant_scales, (list, tuple)) else type(quant_scales).__name__}")
    sf1 = _bytes_view(quant_scales[0], "quant_scales[0]")
    sf2 = _bytes_view(quant_scales[2], "quant_scales[2]")
    for name, t, rows, cols in (("quant_scales[0]", sf1, fc1_rows, hidden // _SF_BLOCK),
                                ("quant_scales[2]", sf2, hidden, inter_local // _SF_BLOCK)):
        size = int(np.prod(_shape(t)))
        if not _shape(t) or _shape(t)[0] != e_local or size != e_local * swizzled_size(rows, cols):
            raise ValueError(f"{name}: shape {_shape(t)} ({size} bytes), expected {e_local} experts of [{rows}, {cols}] "
                             f"UE8M0 scales in the 128x4 swizzled layout, [{e_local}, {_pad(rows, 128)}, "
                             f"{_pad(cols, 4)}] bytes (int32 view [{e_local}, {_pad(rows, 128)}, {_pad(cols, 4) // 4}])")
    for i in (1, 3):
        g = quant_scales[i]
        if not _tensors.is_tensor(g) or _shape(g) != (e_local,) or _dtype_name(g) != "float32":
            raise ValueError(f"quant_scales[{i}]: expected the float32 [{e_local}] per-expert global scale, got "
                             f"{_dtype_name(g)} {_shape(g) if _tensors.is_tensor(g) else ''}")
    ids = _tensors.operand(token_selected_experts)
    if not _tensors.is_tensor(ids) or len(getattr(ids, "shape", ())) != 2:
        raise ValueError("token_selected_experts: expected a [num_tokens, top_k] int32 tensor")
    top_k = _shape(ids)[1]

    device = _device_string(x)
    key = (tuple(_tensor_key(t) for t in (fc1, fc2, sf1, quant_scales[1], sf2, quant_scales[3], situ_beta,
                                          situ_linear_beta)),
           int(kind), int(tp_size), int(tp_rank), int(ep_size), int(ep_rank), int(top_k), device)
    sources = (fc1_expert_weights, fc2_expert_weights, *quant_scales, situ_beta, situ_linear_beta)
    versions = tuple(_version(t) for t in sources)
    experts = _CACHE.get(key, versions)
    if experts is None:
        if _capturing(x):
            raise RuntimeError("fc1_expert_weights: first call with these weights is being captured in a CUDA graph; "
                               "preparing them copies to the host, so call once eagerly first (a warm-up)")
        experts = _prepare(fc1, fc2, sf1, sf2, quant_scales, kind, situ_beta, situ_linear_beta, tp_size, tp_rank,
                           ep_size, ep_rank, top_k, device, fc1_rows, hidden, inter_local)
        _CACHE.put(key, versions, experts, [_root(t) for t in sources if _tensors.is_tensor(t)])

    workspace = None
    if workspace_buffer is not None:
        ws = _bytes_view(workspace_buffer, "workspace_buffer")
        if int(np.prod(_shape(ws))) >= workspace_size(experts, num_tokens):
            workspace = ws.reshape(-1)
        # A buffer sized for FlashInfer's kernels that is too small for mxmoe's is not an error: the
        # call allocates its own (in the framework's allocator, graph-safe for torch).
    try:
        out = fused_moe(x_arg, ids, _tensors.operand(token_final_scales), experts, out=output,
                        out_dtype=output_dtype, workspace=workspace)
    except ValueError as err:
        raise _renamed(err) from None
    return [out]


def _prepare(fc1, fc2, sf1, sf2, quant_scales, kind, situ_beta, situ_linear_beta, tp_size, tp_rank, ep_size,
             ep_rank, top_k, device, fc1_rows, hidden, inter_local) -> PreparedExperts:
    for i in (1, 3):
        g = _host_numpy(quant_scales[i]).astype(np.float64)
        if not np.all(g == 1.0):
            bad = int(np.flatnonzero(g != 1.0)[0])
            _refuse(f"quant_scales[{i}]", f"per-expert global scales other than 1.0 are not supported "
                                          f"(expert {bad} has {g[bad]})")
    w13_scale = unswizzle_block_scales(_host_numpy(sf1), fc1_rows, hidden // _SF_BLOCK)
    w2_scale = unswizzle_block_scales(_host_numpy(sf2), hidden, inter_local // _SF_BLOCK)
    # Per-expert tensors to the host; a number (an mxmoe extension) stays a number.
    beta = _host_numpy(situ_beta) if _tensors.is_tensor(situ_beta) else situ_beta
    linear_beta = _host_numpy(situ_linear_beta) if _tensors.is_tensor(situ_linear_beta) else situ_linear_beta
    try:
        return prepare_experts(
            w13=_host_numpy(fc1), w13_scale=w13_scale, layout="up_gate", w2=_host_numpy(fc2), w2_scale=w2_scale,
            activation=kind, beta=beta, linear_beta=linear_beta, tp_size=tp_size, tp_rank=tp_rank,
            ep_size=ep_size, ep_rank=ep_rank, local=True, top_k=top_k, device=device)
    except ValueError as err:
        raise _renamed(err) from None

"""Framework glue: recognizing numpy / torch / cupy tensors without importing the frameworks,
allocating outputs in the caller's framework, finding the current CUDA stream.

The binding takes any DLPack producer; this module only covers what DLPack itself does not say
(which framework to allocate an output in, the framework's current stream, dtypes some DLPack
versions cannot carry).
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Tuple

import numpy as np

BF16 = "bf16"
F32 = "f32"


def _torch():
    return sys.modules.get("torch")


def _cupy():
    return sys.modules.get("cupy")


def is_torch(t: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(t, torch.Tensor)


def is_cupy(t: Any) -> bool:
    cupy = _cupy()
    return cupy is not None and isinstance(t, cupy.ndarray)


def is_tensor(t: Any) -> bool:
    return isinstance(t, np.ndarray) or hasattr(t, "__dlpack__") or hasattr(t, "__array_interface__")


def device_of(t: Any) -> Tuple[str, int]:
    """("cpu", 0) or ("cuda", index), from the framework or the DLPack device."""
    if isinstance(t, np.ndarray):
        return ("cpu", 0)
    if is_torch(t):
        return (t.device.type, t.device.index or 0)
    if hasattr(t, "__dlpack_device__"):
        kind, index = t.__dlpack_device__()
        return ({1: "cpu", 2: "cuda", 3: "cpu"}.get(int(kind), f"dlpack{int(kind)}"), int(index))
    return ("cpu", 0)


_BYTE_DTYPES = ("float8_e4m3fn", "float8_e8m0fnu", "float4_e2m1fn_x2")


def operand(t: Any) -> Any:
    """The tensor as the binding should see it: torch tensors detached (DLPack refuses tensors that
    require grad), and torch's one-byte float8 / packed fp4 dtypes viewed as uint8 (their bits are
    what the operator reads; not every DLPack version carries these dtypes)."""
    if is_torch(t):
        if t.requires_grad:
            t = t.detach()
        name = str(t.dtype).replace("torch.", "")
        if name in _BYTE_DTYPES:
            t = t.view(_torch().uint8)
    return t


def host(t: Any, name: str) -> Any:
    """A host (CPU) view or copy of a weight tensor: prepare_experts reads weights on the host."""
    if t is None or isinstance(t, (list, tuple)):
        return t
    t = operand(t)
    kind, _ = device_of(t)
    if kind == "cpu":
        return t
    if is_torch(t):
        return t.cpu()
    if is_cupy(t):
        return _cupy().asnumpy(t)
    raise ValueError(f"{name}: is on {kind}; give weights on the CPU, or as torch / cupy tensors")


def host_list(t: Any, name: str) -> Any:
    if isinstance(t, (list, tuple)):
        return [host(p, f"{name}[{i}]") for i, p in enumerate(t)]
    return host(t, name)


def output_kind(out_dtype: Any, name: str = "out_dtype") -> Optional[str]:
    """BF16 or F32 from a string, a torch dtype or a numpy dtype; None stays None."""
    if out_dtype is None:
        return None
    if isinstance(out_dtype, str):
        key = out_dtype.lower().replace("torch.", "")
        if key in ("bf16", "bfloat16"):
            return BF16
        if key in ("f32", "fp32", "float32", "float"):
            return F32
        raise ValueError(f"{name}: '{out_dtype}' is not bf16 or float32")
    torch = _torch()
    if torch is not None and isinstance(out_dtype, torch.dtype):
        if out_dtype == torch.bfloat16:
            return BF16
        if out_dtype == torch.float32:
            return F32
        raise ValueError(f"{name}: {out_dtype} is not torch.bfloat16 or torch.float32")
    try:
        dt = np.dtype(out_dtype)
    except TypeError:
        raise ValueError(f"{name}: {out_dtype!r} is not a dtype (bf16 or float32)") from None
    if dt == np.float32:
        return F32
    if dt == np.uint16:  # bf16 bits, numpy having no bfloat16
        return BF16
    raise ValueError(f"{name}: numpy dtype {dt} is not float32 or uint16 (bf16 bits)")


def kind_of_output(out: Any) -> Optional[str]:
    """BF16 / F32 of an output tensor, or None for anything else (the binding then names it)."""
    dt = getattr(out, "dtype", None)
    if dt is None:
        return None
    torch = _torch()
    if torch is not None and isinstance(dt, torch.dtype):
        return {torch.bfloat16: BF16, torch.float32: F32}.get(dt)
    try:
        dt = np.dtype(dt)
    except TypeError:
        return None
    if dt == np.float32:
        return F32
    if dt == np.uint16:
        return BF16
    if str(dt) == "bfloat16":  # ml_dtypes
        return BF16
    return None


def empty(ref: Any, shape: Tuple[int, ...], kind: str) -> Any:
    """An uninitialized tensor in ref's framework and device: BF16 / F32 / "int32" / "uint8".
    numpy and cupy have no bfloat16: their BF16 output holds the bits as uint16."""
    if is_torch(ref):
        torch = _torch()
        dtype = {BF16: torch.bfloat16, F32: torch.float32, "int32": torch.int32, "uint8": torch.uint8}[kind]
        return torch.empty(shape, dtype=dtype, device=ref.device)
    np_dtype = {BF16: np.uint16, F32: np.float32, "int32": np.int32, "uint8": np.uint8}[kind]
    if is_cupy(ref):
        with _cupy().cuda.Device(ref.device.id):
            return _cupy().empty(shape, dtype=np_dtype)
    kind_dev, _ = device_of(ref)
    if kind_dev != "cpu":
        raise ValueError(f"out: cannot allocate an output on {kind_dev} for {type(ref).__name__}; pass out=")
    return np.empty(shape, dtype=np_dtype)


def stream_of(ref: Any, stream: Any) -> int:
    """The cudaStream_t (as an int) to run on: the one given, else the framework's current stream."""
    if stream is not None:
        for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
            if hasattr(stream, attr):
                return int(getattr(stream, attr))
        return int(stream)
    kind, index = device_of(ref)
    if kind != "cuda":
        return 0
    if is_torch(ref):
        return int(_torch().cuda.current_stream(index).cuda_stream)
    if is_cupy(ref):
        return int(_cupy().cuda.get_current_stream().ptr)
    return 0


def check_writable(out: Any, name: str = "out") -> None:
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError(f"{name}: is read-only")

"""bf16 <-> float32 for numpy, which has no bfloat16: bf16 tensors are carried as uint16 bits."""

from __future__ import annotations

import numpy as np


def bf16_to_float32(bits) -> np.ndarray:
    """uint16 bf16 bits -> float32 (exact)."""
    b = np.asarray(bits)
    if b.dtype != np.uint16:
        raise ValueError(f"bits: expected uint16 bf16 bits, got {b.dtype}")
    return (b.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(values) -> np.ndarray:
    """float32 -> uint16 bf16 bits, round to nearest even; NaN stays a quiet NaN of its sign (as the
    C++ float_to_bf16)."""
    v = np.ascontiguousarray(values, dtype=np.float32)
    u = v.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(v)
    quiet = ((u >> 16) | 0x0040).astype(np.uint16)
    return np.where(nan, quiet, rounded).astype(np.uint16)

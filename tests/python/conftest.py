"""Shared helpers for the Python suite: small synthetic layers and numpy versions of the format
rules the tests need to build inputs (never of the operator itself: that is the C++ reference's)."""

import numpy as np
import pytest

import mxmoe

# A small layer with every dimension a few MX blocks: fast on 2 cores, still ragged enough.
E, K, I, TOPK = 8, 96, 128, 3


def e4m3_to_float(codes: np.ndarray) -> np.ndarray:
    c = codes.astype(np.int32)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exp = (c >> 3) & 0xF
    man = c & 0x7
    normal = (1.0 + man / 8.0) * np.exp2(exp - 7.0)
    sub = man * 2.0**-9
    v = sign * np.where(exp == 0, sub, normal)
    return np.where((exp == 0xF) & (man == 0x7), np.nan, v).astype(np.float32)


def fuse_w13(a: np.ndarray, b: np.ndarray, layout: str) -> np.ndarray:
    """Another engine's fused FC1 from gate (a = w1) and up (b = w3), stacked [E, I, n] -> [E, 2I, n],
    written from each engine's convention (SPEC section 4) independently of the C++ converters."""
    if layout == "gate_up":  # SGLang: [gate; up]
        return np.concatenate([a, b], axis=1)
    if layout == "up_gate":  # FlashInfer CUTLASS: [up; gate]
        return np.concatenate([b, a], axis=1)
    if layout == "interleaved":  # GPT-OSS: gate row i at 2i, up row i at 2i+1
        return np.stack([a, b], axis=2).reshape(a.shape[0], 2 * a.shape[1], *a.shape[2:])
    raise AssertionError(layout)


@pytest.fixture(scope="session")
def weights():
    """The unsplit synthetic layer in checkpoint layout (numpy), with SwigluBias biases."""
    return mxmoe.synthetic_weights(E, K, I, seed=7, with_bias=True)


@pytest.fixture(scope="session")
def situ_weights(weights):
    return {k: v for k, v in weights.items() if not k.endswith("_bias")}


def make_input(num_tokens=13, pattern="uniform", seed=3, num_experts=E, hidden=K, top_k=TOPK):
    return mxmoe.synthetic_input(num_experts, hidden, top_k, num_tokens, pattern=pattern, seed=seed)

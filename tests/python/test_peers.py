"""The peers of `make bench` (bench/peers/) on small synthetic layers, against the same math in float64
and against mxmoe's reference within the agreement the bench asks of a peer. The Triton peer's
kernels run in Triton's interpreter on a machine without a GPU, the PyTorch peer on torch's CPU
grouped_mm. Skipped where torch (or, for the Triton peer, triton) is not installed: CI installs
neither, the GPU image has both."""

import os
import sys

import numpy as np
import pytest

import mxmoe
from conftest import E, I, K, TOPK, make_input

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is first imported
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "peers"))
import peer_common  # noqa: E402
import torch_moe  # noqa: E402

try:
    import triton_moe  # noqa: E402
except ImportError:  # no triton here
    triton_moe = None
# Without a GPU the kernels must be the interpreter's, which they are not when triton was imported
# before TRITON_INTERPRET was set (by another module of the same run).
usable = triton_moe is not None and (torch.cuda.is_available()
                                    or "Interpreted" in type(triton_moe._fc1_kernel).__name__)
needs_triton = pytest.mark.skipif(not usable, reason="no triton, or not the interpreter's kernels without a GPU")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ACTIVATION_PARAMS = {"beta": 4.0, "linear_beta": 25.0, "alpha": 1.702, "limit": 7.0}


def make_layer(weights, activation, peer=None):
    spec = dict(name="small", num_experts=E, hidden=K, intermediate=I, top_k=TOPK, activation=activation,
                with_bias=activation == "SwigluBias", **ACTIVATION_PARAMS)
    layer = (peer or triton_moe).Layer(spec, DEVICE)
    for e in range(E):
        t = {f"{name}.weight_packed": torch.from_numpy(weights[name][e]) for name in ("w1", "w2", "w3")}
        t.update({f"{name}.weight_scale": torch.from_numpy(weights[f"{name}_scale"][e]) for name in ("w1", "w2", "w3")})
        if spec["with_bias"]:
            t["gate_bias"] = torch.from_numpy(weights["gate_bias"][e])
            t["up_bias"] = torch.from_numpy(weights["up_bias"][e])
        layer.set_expert(e, {k: v.to(DEVICE) for k, v in t.items()})
    return layer


def bf16(x):
    """x rounded to bf16 as the peer rounds: to nearest even on a GPU, toward zero in Triton's
    interpreter (its fp32 -> bf16 conversion truncates)."""
    if triton_moe is None or not triton_moe.INTERPRET:
        return x.to(torch.bfloat16).double()
    bits = x.to(torch.float32).view(torch.int32) & -65536
    return bits.view(torch.float32).double()


def same_math(layer, weights, x, ids, tw, rounding=None):
    """The Triton peer's computation in float64, rounding where it rounds to bf16 (`rounding`, bf16
    by default)."""
    bf16_round = rounding or bf16
    spec, out = layer.spec, torch.zeros(x.shape[0], K, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(TOPK):
            e = int(ids[t, j])
            if not 0 <= e < E:
                continue
            w1, w3, w2 = (peer_common.dequantize_mxfp4(torch.from_numpy(weights[n][e]),
                                                       torch.from_numpy(weights[f"{n}_scale"][e]), torch.float64)
                          for n in ("w1", "w3", "w2"))
            xt = x[t].double()
            biases = {}
            if spec["with_bias"]:
                biases = dict(gate_bias=torch.from_numpy(weights["gate_bias"][e]).double(),
                              up_bias=torch.from_numpy(weights["up_bias"][e]).double())
            a = bf16_round(peer_common.activation(spec, w1 @ xt, w3 @ xt, **biases))
            out[t] += bf16_round(float(tw[t, j]) * (w2 @ a))
    return bf16_round(out)


def run_peer(layer, x, ids, tw, config=None):
    got = triton_moe.moe_forward(layer, x.to(DEVICE), torch.from_numpy(ids).to(DEVICE),
                                 torch.from_numpy(tw).to(DEVICE), config)
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == (x.shape[0], K)
    return got.double().cpu()


def normwise(got, want):
    return ((got - want).norm() / want.norm()).item()


def mxmoe_reference(weights, activation, x_bits, ids, tw):
    w = weights if activation == "SwigluBias" else {k: v for k, v in weights.items() if not k.endswith("_bias")}
    used = {"Situ": ("beta", "linear_beta"), "SwigluBias": ("alpha", "limit")}.get(activation, ())
    experts = mxmoe.prepare_experts(**w, top_k=TOPK, activation=activation,
                                    **{name: ACTIVATION_PARAMS[name] for name in used})
    return torch.from_numpy(mxmoe.reference_moe(x_bits, ids, tw, experts, out_dtype="float32")).double()


@needs_triton
@pytest.mark.parametrize("activation", ["Situ", "Swiglu", "SwigluBias"])
@pytest.mark.parametrize("num_tokens,pattern", [(1, "uniform"), (2, "uniform"), (13, "with_invalid"),
                                                (40, "heavy_hitters")])
def test_triton_peer_matches_its_math_and_mxmoe(weights, activation, num_tokens, pattern):
    layer = make_layer(weights, activation)
    x_bits, ids, tw = make_input(num_tokens=num_tokens, pattern=pattern, seed=11)
    x = torch.from_numpy(x_bits.astype(np.int16)).view(torch.bfloat16)
    got = run_peer(layer, x, ids, tw)
    assert torch.isfinite(got).all()
    want = same_math(layer, weights, x, ids, tw)
    assert normwise(got, want) < 5e-3
    assert normwise(got, mxmoe_reference(weights, activation, x_bits, ids, tw)) < peer_common.AGREEMENT_NORMWISE


@needs_triton
def test_every_tile_height_and_the_skipped_slots(weights):
    """Each block height of Config.pick on one input whose experts get 1 to 40 pairs; a token whose
    slots are all -1 or out of range gets zeros."""
    layer = make_layer(weights, "Situ")
    x_bits, ids, tw = make_input(num_tokens=40, pattern="few_experts", seed=2)
    ids[5] = -1
    ids[6] = [E, -1, E + 3]
    x = torch.from_numpy(x_bits.astype(np.int16)).view(torch.bfloat16)
    want = same_math(layer, weights, x, ids, tw)
    for block_m in (16, 32, 64, 128):
        got = run_peer(layer, x, ids, tw, triton_moe.Config(block_m, (32, 64, 4), (64, 32, 4), 2))
        assert normwise(got, want) < 5e-3, block_m
        assert (got[5] == 0).all() and (got[6] == 0).all()


@needs_triton
def test_route_covers_each_pair_once():
    ids = torch.tensor([[3, 0, -1], [3, 7, 3], [9, 0, 3]], dtype=torch.int32)  # 9: out of range (E = 8)
    order, expert, row, count = triton_moe.route(ids, E, 2)
    order = order.tolist()
    seen = []
    for e, r, c in zip(expert.tolist(), row.tolist(), count.tolist()):
        if e < 0:
            continue
        assert 1 <= c <= 2
        pairs = order[r:r + c]
        assert all(int(ids.view(-1)[p]) == e for p in pairs)
        seen += pairs
    assert sorted(seen) == [0, 1, 3, 4, 5, 7, 8]
    assert seen == [1, 7, 0, 3, 5, 8, 4]  # by expert, then pair order within one


@pytest.mark.parametrize("activation", ["Situ", "SwigluBias"])
def test_torch_peer_matches_its_math_and_mxmoe(weights, activation):
    """The PyTorch peer rounds g and u, the intermediate and each pair's row to bf16 (its grouped_mm
    returns bf16): within 2% of the same math without those roundings."""
    layer = make_layer(weights, activation, torch_moe)
    x_bits, ids, tw = make_input(num_tokens=13, pattern="with_invalid", seed=4)
    x = torch.from_numpy(x_bits.astype(np.int16)).view(torch.bfloat16)
    grouped_mm, _ = torch_moe.grouped_mm_fn()
    got = torch_moe.moe_forward(layer, x.to(DEVICE), torch.from_numpy(ids).to(DEVICE), torch.from_numpy(tw).to(DEVICE),
                                grouped_mm)
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == (13, K)
    got = got.double().cpu()
    assert torch.isfinite(got).all()
    exact = same_math(layer, weights, x, ids, tw, rounding=lambda v: v)
    assert normwise(got, exact) < 2e-2
    assert normwise(got, mxmoe_reference(weights, activation, x_bits, ids, tw)) < peer_common.AGREEMENT_NORMWISE

"""Refusals: ValueError naming the argument (the C++ message), NotImplementedError for what this
build cannot serve."""

import numpy as np
import pytest

import mxmoe
from conftest import E, I, K, TOPK, make_input


@pytest.fixture(scope="module")
def experts(situ_weights):
    return mxmoe.prepare_experts(**situ_weights, top_k=TOPK)


def with_(w, **changes):
    d = dict(w)
    d.update(changes)
    return d


def test_weight_dtype_and_shape(situ_weights):
    w = situ_weights
    with pytest.raises(ValueError, match=r"^w1: expected dtype uint8.*got float32"):
        mxmoe.prepare_experts(**with_(w, w1=w["w1"].astype(np.float32)))
    with pytest.raises(ValueError, match=r"^w1_scale: expected shape \[8, 128, 3\].*got \[8, 128, 2\]"):
        mxmoe.prepare_experts(**with_(w, w1_scale=w["w1_scale"][:, :, :2]))
    with pytest.raises(ValueError, match=r"^w2: expected shape"):
        mxmoe.prepare_experts(**with_(w, w2=w["w2"][:4]))
    with pytest.raises(ValueError, match=r"^w3\[2\]: shape"):
        mxmoe.prepare_experts(**with_(w, w3=[w["w3"][e] if e != 2 else w["w3"][e, :64] for e in range(E)]))
    with pytest.raises(ValueError, match=r"^w3_scale: missing"):
        mxmoe.prepare_experts(**with_(w, w3_scale=None))
    with pytest.raises(ValueError, match=r"^w2: expected a \[num_experts, rows, cols\] tensor"):
        mxmoe.prepare_experts(**with_(w, w2="w2.weight"))
    with pytest.raises(ValueError, match=r"hidden size K"):
        mxmoe.prepare_experts(**with_(w, w1=w["w1"][:, :, :8], w3=w["w3"][:, :, :8]))


def test_fused_arguments(situ_weights):
    w = situ_weights
    w13 = np.concatenate([w["w1"], w["w3"]], axis=1)
    s13 = np.concatenate([w["w1_scale"], w["w3_scale"]], axis=1)
    with pytest.raises(ValueError, match=r"^w13: give either"):
        mxmoe.prepare_experts(**w, w13=w13, w13_scale=s13)
    with pytest.raises(ValueError, match=r"^layout: 'cutlass'"):
        mxmoe.prepare_experts(w13=w13, w13_scale=s13, w2=w["w2"], w2_scale=w["w2_scale"], layout="cutlass")
    with pytest.raises(ValueError, match=r"^layout: applies to a fused w13"):
        mxmoe.prepare_experts(**w, layout="gate_up")
    with pytest.raises(ValueError, match=r"^w13: 255 rows"):
        mxmoe.prepare_experts(w13=w13[:, :255], w13_scale=s13[:, :255], w2=w["w2"], w2_scale=w["w2_scale"])


def test_slices_and_parameters(situ_weights):
    w = situ_weights
    with pytest.raises(ValueError, match=r"I / tp_size"):
        mxmoe.prepare_experts(**w, tp_size=8)
    with pytest.raises(ValueError, match=r"ep_size"):
        mxmoe.prepare_experts(**w, ep_size=3)
    with pytest.raises(ValueError, match=r"tp_rank = 2"):
        mxmoe.prepare_experts(**w, tp_size=2, tp_rank=2)
    with pytest.raises(ValueError, match=r"^beta: only used by Situ"):
        mxmoe.prepare_experts(**w, activation="swiglu", beta=2.0)
    with pytest.raises(ValueError, match=r"^alpha: only used by SwigluBias"):
        mxmoe.prepare_experts(**w, alpha=1.0)
    with pytest.raises(ValueError, match=r"^beta: expected shape \[8\]"):
        mxmoe.prepare_experts(**w, beta=np.ones(5, np.float32))
    with pytest.raises(ValueError, match=r"situ beta"):
        mxmoe.prepare_experts(**w, beta=-1.0)
    with pytest.raises(ValueError, match=r"^device:"):
        mxmoe.prepare_experts(**w, device="tpu")
    with pytest.raises(ValueError, match=r"^top_k:"):
        mxmoe.prepare_experts(**w, top_k=0)


def test_unimplemented_activation_is_refused_by_name(situ_weights):
    for kind in ("relu", "Silu", "SwigluStep", "InvalidType"):
        with pytest.raises(NotImplementedError, match=kind if kind != "relu" else "Relu"):
            mxmoe.prepare_experts(**situ_weights, activation=kind)
    assert issubclass(NotImplementedError, RuntimeError)


@pytest.mark.skipif(mxmoe.cuda_built(), reason="this build has the CUDA backend")
def test_cuda_without_backend(situ_weights):
    with pytest.raises(NotImplementedError, match="CUDA"):
        mxmoe.prepare_experts(**situ_weights, top_k=TOPK, device="cuda")


def test_call_arguments(experts):
    x, ids, tw = make_input(num_tokens=5)
    with pytest.raises(ValueError, match=r"^x: expected dtype bfloat16 or uint16"):
        mxmoe.fused_moe(x.astype(np.float32), ids, tw, experts)
    with pytest.raises(ValueError, match=r"^x: expected shape \[5, 96\], got \[5, 64\]"):
        mxmoe.fused_moe(x[:, :64].copy(), ids, tw, experts)
    with pytest.raises(ValueError, match=r"^x: must be C-contiguous"):
        mxmoe.fused_moe(np.asfortranarray(x), ids, tw, experts)
    with pytest.raises(ValueError, match=r"^topk_ids: expected dtype int32"):
        mxmoe.fused_moe(x, ids.astype(np.int64), tw, experts)
    with pytest.raises(ValueError, match=r"^topk_ids: top_k = 2 .* differs from the experts' top_k = 3"):
        mxmoe.fused_moe(x, ids[:, :2].copy(), tw[:, :2].copy(), experts)
    with pytest.raises(ValueError, match=r"^topk_weights: expected shape \[5, 3\]"):
        mxmoe.fused_moe(x, ids, tw[:4].copy(), experts)
    bad = ids.copy()
    bad[3, 1] = E
    with pytest.raises(ValueError, match=r"topk_ids\[3, 1\] = 8 is outside \[-1, 8\)"):
        mxmoe.fused_moe(x, bad, tw, experts)
    with pytest.raises(ValueError, match=r"^out: expected shape \[5, 96\]"):
        mxmoe.fused_moe(x, ids, tw, experts, out=np.empty((5, 95), np.float32))
    with pytest.raises(ValueError, match=r"^out: expected dtype"):
        mxmoe.fused_moe(x, ids, tw, experts, out=np.empty((5, K), np.float64))
    ro = np.empty((5, K), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"^out: is read-only"):
        mxmoe.fused_moe(x, ids, tw, experts, out=ro)
    with pytest.raises(ValueError, match=r"^out_dtype:"):
        mxmoe.fused_moe(x, ids, tw, experts, out=np.empty((5, K), np.float32), out_dtype="bf16")
    with pytest.raises(ValueError, match=r"^out_dtype: 'fp16'"):
        mxmoe.fused_moe(x, ids, tw, experts, out_dtype="fp16")
    with pytest.raises(ValueError, match=r"^x_scale: expected shape \[5, 3\]"):
        mxmoe.fused_moe((np.zeros((5, K), np.uint8), np.zeros((5, 2), np.uint8)), ids, tw, experts)
    with pytest.raises(ValueError, match=r"^experts: expected a PreparedExperts"):
        mxmoe.fused_moe(x, ids, tw, "experts")
    with pytest.raises(ValueError, match=r"^topk_weights: expected a tensor"):
        mxmoe.fused_moe(x, ids, [[0.5] * 3] * 5, experts)

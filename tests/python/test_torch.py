"""torch tensors through DLPack (skipped where torch is not installed: CI does not install it)."""

import gc

import numpy as np
import pytest

import mxmoe
from conftest import E, K, TOPK, make_input

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def experts(situ_weights):
    return mxmoe.prepare_experts(**situ_weights, top_k=TOPK)


def test_bf16_in_and_out(experts):
    x, ids, tw = make_input(num_tokens=9)
    want = mxmoe.fused_moe(x, ids, tw, experts)
    xt = torch.from_numpy(x.astype(np.int16)).view(torch.bfloat16)
    got = mxmoe.fused_moe(xt, torch.from_numpy(ids), torch.from_numpy(tw), experts)
    assert got.dtype == torch.bfloat16 and got.device.type == "cpu" and tuple(got.shape) == (9, K)
    np.testing.assert_array_equal(got.view(torch.int16).numpy().view(np.uint16), want)
    out = torch.full((9, K), float("nan"), dtype=torch.float32)
    assert mxmoe.fused_moe(xt, torch.from_numpy(ids), torch.from_numpy(tw), experts, out=out) is out
    np.testing.assert_array_equal(out.numpy(), mxmoe.fused_moe(x, ids, tw, experts, out_dtype="float32"))
    f32 = mxmoe.reference_moe(xt, torch.from_numpy(ids), torch.from_numpy(tw), experts, out_dtype=torch.float32)
    assert f32.dtype == torch.float32


def test_float8_pair(experts):
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 0x7E, size=(4, K), dtype=np.uint8)
    scales = rng.integers(120, 130, size=(4, K // 32), dtype=np.uint8)
    _, ids, tw = make_input(num_tokens=4)
    want = mxmoe.fused_moe((codes, scales), ids, tw, experts)
    pair = (torch.from_numpy(codes).view(torch.float8_e4m3fn), torch.from_numpy(scales))
    got = mxmoe.fused_moe(pair, torch.from_numpy(ids), torch.from_numpy(tw), experts)
    np.testing.assert_array_equal(got.view(torch.int16).numpy().view(np.uint16), want)


def test_torch_weights(situ_weights):
    x, ids, tw = make_input(num_tokens=5)
    want = mxmoe.fused_moe(x, ids, tw, mxmoe.prepare_experts(**situ_weights))
    as_torch = {k: torch.from_numpy(v) for k, v in situ_weights.items()}
    np.testing.assert_array_equal(mxmoe.fused_moe(x, ids, tw, mxmoe.prepare_experts(**as_torch)), want)
    per_expert = {k: [torch.nn.Parameter(v[e], requires_grad=False) for e in range(E)] for k, v in as_torch.items()}
    np.testing.assert_array_equal(mxmoe.fused_moe(x, ids, tw, mxmoe.prepare_experts(**per_expert)), want)
    betas = torch.full((E,), 4.0, requires_grad=True)
    np.testing.assert_array_equal(mxmoe.fused_moe(x, ids, tw, mxmoe.prepare_experts(**as_torch, beta=betas)), want)


def test_torch_errors(experts):
    x, ids, tw = make_input(num_tokens=5)
    xt = torch.from_numpy(x.astype(np.int16)).view(torch.bfloat16)
    with pytest.raises(ValueError, match=r"^topk_ids: expected dtype int32"):
        mxmoe.fused_moe(xt, torch.from_numpy(ids).long(), torch.from_numpy(tw), experts)
    with pytest.raises(ValueError, match=r"^x: must be C-contiguous"):
        mxmoe.fused_moe(xt.t().contiguous().t(), torch.from_numpy(ids), torch.from_numpy(tw), experts)
    with pytest.raises(ValueError, match=r"^topk_weights: expected dtype float32"):
        mxmoe.fused_moe(xt, torch.from_numpy(ids), torch.from_numpy(tw).double(), experts)


def test_router_torch():
    logits = torch.randn(6, 32)
    bias = torch.zeros(32)
    ids, w = mxmoe.kimi_k3_router(logits, bias, top_k=4)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    want_ids, want_w = mxmoe.kimi_k3_router(logits.numpy(), bias.numpy(), top_k=4)
    np.testing.assert_array_equal(ids.numpy(), want_ids)
    np.testing.assert_array_equal(w.numpy(), want_w)



def test_router_bf16_logits_torch():
    logits = torch.randn(6, 64).to(torch.bfloat16)
    bias = torch.zeros(64)
    ids, w = mxmoe.kimi_k3_router(logits, bias, top_k=8)
    want_ids, want_w = mxmoe.kimi_k3_router(logits.float().numpy(), bias.numpy(), top_k=8)
    np.testing.assert_array_equal(ids.numpy(), want_ids)
    np.testing.assert_array_equal(w.numpy(), want_w)


def test_flashinfer_entry_torch_cpu_and_weight_reload(situ_weights):
    # FlashInfer's dtypes (float8_e4m3fn input, int64 weights as fresh views of a parameter every
    # call, int32 scales) give the numpy path's bits; a write into the weights through torch (a
    # reload) is seen at the next call, which prepares again.
    from mxmoe import ActivationType
    from mxmoe.flashinfer import cutlass_fused_moe
    from test_flashinfer import flashinfer_weights, mxfp8_input, swizzle_128x4

    mxmoe.flashinfer.clear_cache()
    codes, scales, ids, tw = mxfp8_input(7, seed=41)
    fi = flashinfer_weights(situ_weights)
    args = dict(input_sf=scales, swizzled_input_sf=False, use_mxfp8_act_scaling=True,
                activation_type=ActivationType.Situ)
    want = cutlass_fused_moe(codes, ids, tw, output_dtype=np.float32, **fi, **args)[0]

    fc1 = torch.nn.Parameter(torch.from_numpy(fi["fc1_expert_weights"].view(np.uint8).copy()), requires_grad=False)
    fc2 = torch.from_numpy(fi["fc2_expert_weights"])
    quant_scales = [torch.from_numpy(q) for q in fi["quant_scales"]]
    x8 = torch.from_numpy(codes).view(torch.float8_e4m3fn)
    targs = dict(args, input_sf=torch.from_numpy(scales))

    def run():
        return cutlass_fused_moe(x8, torch.from_numpy(ids), torch.from_numpy(tw), fc1.view(torch.long), fc2,
                                 torch.float32, quant_scales, **targs)[0]

    before = mxmoe.flashinfer._CACHE.prepares
    a = run()
    assert a.dtype == torch.float32
    np.testing.assert_array_equal(a.numpy(), want)
    run()
    assert mxmoe.flashinfer._CACHE.prepares == before + 1
    entries = mxmoe.flashinfer.cache_size()
    # Swizzled input scales (FlashInfer's default) as a torch tensor: the same result.
    swizzled = torch.from_numpy(swizzle_128x4(scales[None])[0].reshape(-1))
    c = cutlass_fused_moe(x8, torch.from_numpy(ids), torch.from_numpy(tw), fc1.view(torch.long), fc2, torch.float32,
                          quant_scales, **dict(targs, input_sf=swizzled, swizzled_input_sf=True))[0]
    assert torch.equal(a, c)
    swapped = dict(situ_weights, w1=situ_weights["w3"], w3=situ_weights["w1"], w1_scale=situ_weights["w3_scale"],
                   w3_scale=situ_weights["w1_scale"])
    with torch.no_grad():
        fc1.copy_(torch.from_numpy(flashinfer_weights(swapped)["fc1_expert_weights"].view(np.uint8)))
    b = run()
    assert mxmoe.flashinfer._CACHE.prepares == before + 2
    assert mxmoe.flashinfer.cache_size() == entries  # the reloaded weights' entry replaced the old one
    assert not torch.equal(a, b)
    # The parameter's storage freed: its prepared experts go too (the views passed were temporaries).
    del fc1
    gc.collect()
    assert mxmoe.flashinfer.cache_size() == entries - 1
    mxmoe.flashinfer.clear_cache()

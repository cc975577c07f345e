"""mxmoe.flashinfer.cutlass_fused_moe (FlashInfer's call, MXFP8 x MXFP4) on the CPU: its result is
the reference's for the same weights given in mxmoe's canonical layout. The FlashInfer-side tensors
(int64-packed [up; gate] FC1, int32-packed 128x4-swizzled block scales, swizzled input scales) are
built here from FlashInfer's conventions, independently of the module's own converters. Every
case uses SiTU, whose gate and up are not interchangeable, so a wrong FC1 order fails."""

import gc

import numpy as np
import pytest

import mxmoe
from mxmoe import ActivationType
from mxmoe.flashinfer import cutlass_fused_moe
from conftest import E, I, K, TOPK, make_input


def swizzle_128x4(scales):
    """[E, rows, cols] UE8M0 -> [E, pad128(rows), pad4(cols)] bytes in FlashInfer's 128x4 layout,
    written element by element from the layout's definition (get_sf_out_offset_128x4)."""
    e, rows, cols = scales.shape
    prow, pcol = -(-rows // 128) * 128, -(-cols // 4) * 4
    out = np.zeros((e, prow * pcol), np.uint8)
    for r in range(rows):
        for c in range(cols):
            offset = (r // 128) * (pcol // 4) * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
            out[:, offset] = scales[:, r, c]
    return out.reshape(e, prow, pcol)


def flashinfer_weights(w, experts=slice(None), rows=slice(None)):
    """FlashInfer's fc1 / fc2 / quant_scales for the experts and intermediate rows given of the
    canonical layer w (w1 gate, w3 up, w2 down)."""
    w1, w3 = w["w1"][experts][:, rows], w["w3"][experts][:, rows]
    s1, s3 = w["w1_scale"][experts][:, rows], w["w3_scale"][experts][:, rows]
    cols = np.arange(I)[rows]
    w2 = w["w2"][experts][:, :, cols[0] // 2:(cols[-1] + 1) // 2]
    s2 = w["w2_scale"][experts][:, :, cols[0] // 32:(cols[-1] + 1) // 32]
    fc1 = np.ascontiguousarray(np.concatenate([w3, w1], axis=1))  # [up; gate]
    sf1 = swizzle_128x4(np.concatenate([s3, s1], axis=1))
    e = fc1.shape[0]
    ones = np.ones(e, np.float32)
    return dict(
        fc1_expert_weights=fc1.view(np.int64),
        fc2_expert_weights=np.ascontiguousarray(w2).view(np.int64),
        quant_scales=[sf1.view(np.int32), ones, swizzle_128x4(s2).view(np.int32), ones.copy()],
    )


def mxfp8_input(num_tokens, seed):
    """Random e4m3 codes (no NaN code) and scales in a realistic range; routing from make_input."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 0x7E, size=(num_tokens, K), dtype=np.uint8)
    codes |= rng.integers(0, 2, size=codes.shape, dtype=np.uint8) << 7  # both signs
    codes[codes == 0xFF] = 0xFE
    scales = rng.integers(118, 132, size=(num_tokens, K // 32), dtype=np.uint8)
    _, ids, tw = make_input(num_tokens=num_tokens, seed=seed, pattern="with_invalid")
    return codes, scales, ids, tw


@pytest.fixture(autouse=True)
def fresh_cache():
    mxmoe.flashinfer.clear_cache()
    yield
    mxmoe.flashinfer.clear_cache()


@pytest.mark.parametrize("num_tokens", [0, 1, 13, 130])
@pytest.mark.parametrize("output_dtype", [np.float32, "bfloat16"])
def test_equals_reference_situ(situ_weights, num_tokens, output_dtype):
    codes, scales, ids, tw = mxfp8_input(num_tokens, seed=num_tokens + 1)
    fi = flashinfer_weights(situ_weights)
    # swizzled_input_sf=True (FlashInfer's default): the input scales padded to 128 rows.
    input_sf = swizzle_128x4(scales[None])[0] if num_tokens else np.zeros(0, np.uint8)
    got = cutlass_fused_moe(codes, ids, tw, fi["fc1_expert_weights"], fi["fc2_expert_weights"], output_dtype,
                            fi["quant_scales"], input_sf=input_sf, use_mxfp8_act_scaling=True,
                            activation_type=ActivationType.Situ)
    assert isinstance(got, list) and len(got) == 1
    experts = mxmoe.prepare_experts(**situ_weights, activation="situ", top_k=TOPK)
    want = mxmoe.reference_moe((codes, scales), ids, tw, experts, out_dtype=output_dtype)
    assert got[0].shape == (num_tokens, K) and got[0].dtype == want.dtype
    np.testing.assert_array_equal(got[0], want)


def test_linear_input_scales_output_buffer_and_keywords(situ_weights):
    codes, scales, ids, tw = mxfp8_input(9, seed=3)
    fi = flashinfer_weights(situ_weights)
    output = np.full((9, K), np.nan, np.float32)
    got = cutlass_fused_moe(input=codes, token_selected_experts=ids, token_final_scales=tw, output_dtype=np.float32,
                            input_sf=scales, swizzled_input_sf=False, use_mxfp8_act_scaling=True, output=output,
                            activation_type=int(ActivationType.Situ), tune_max_num_tokens=64, enable_pdl=True,
                            use_fused_finalize=True, **fi)
    assert got[0] is output
    experts = mxmoe.prepare_experts(**situ_weights, activation="situ", top_k=TOPK)
    np.testing.assert_array_equal(output, mxmoe.reference_moe((codes, scales), ids, tw, experts, out_dtype="float32"))


def test_gate_up_order_matters(situ_weights):
    # The same call with FC1 given [gate; up] computes something else: SiTU tells them apart, so
    # the equality above pins FlashInfer's [up; gate] order.
    codes, scales, ids, tw = mxfp8_input(13, seed=5)
    fi = flashinfer_weights(situ_weights)
    swapped = dict(situ_weights, w1=situ_weights["w3"], w3=situ_weights["w1"], w1_scale=situ_weights["w3_scale"],
                   w3_scale=situ_weights["w1_scale"])
    wrong = flashinfer_weights(swapped)
    args = dict(input_sf=scales, swizzled_input_sf=False, use_mxfp8_act_scaling=True,
                activation_type=ActivationType.Situ)
    right = cutlass_fused_moe(codes, ids, tw, output_dtype=np.float32, **fi, **args)[0]
    flipped = cutlass_fused_moe(codes, ids, tw, output_dtype=np.float32, **wrong, **args)[0]
    assert np.abs(right - flipped).max() > 1e-3 * np.abs(right).max()


def test_bf16_input_is_quantized_by_mxmoe(situ_weights):
    x, ids, tw = make_input(num_tokens=11, seed=8)
    fi = flashinfer_weights(situ_weights)
    got = cutlass_fused_moe(x, ids, tw, output_dtype=np.float32, use_mxfp8_act_scaling=True,
                            activation_type=ActivationType.Situ, **fi)[0]
    experts = mxmoe.prepare_experts(**situ_weights, activation="situ", top_k=TOPK)
    np.testing.assert_array_equal(got, mxmoe.reference_moe(x, ids, tw, experts, out_dtype="float32"))


@pytest.mark.parametrize("tp_size,ep_size", [(2, 1), (1, 2), (2, 2)])
def test_tp_ep_ranks_equal_mxmoe_slices(situ_weights, tp_size, ep_size):
    # FlashInfer's weights are the rank's share (E/ep experts, I/tp rows of up and gate, the same
    # columns of down); per-expert SiTU parameters cover the local experts. Each rank's partial sum
    # equals mxmoe's slice of the whole layer, prepared from the canonical weights.
    codes, scales, ids, tw = mxfp8_input(17, seed=tp_size * 10 + ep_size)
    beta = np.linspace(2.0, 6.0, E, dtype=np.float32)
    linear_beta = np.linspace(10.0, 30.0, E, dtype=np.float32)
    e_local, i_local = E // ep_size, I // tp_size
    for er in range(ep_size):
        for tr in range(tp_size):
            experts = slice(er * e_local, (er + 1) * e_local)
            fi = flashinfer_weights(situ_weights, experts, slice(tr * i_local, (tr + 1) * i_local))
            got = cutlass_fused_moe(codes, ids, tw, output_dtype=np.float32, tp_size=tp_size, tp_rank=tr,
                                    ep_size=ep_size, ep_rank=er, input_sf=scales, swizzled_input_sf=False,
                                    use_mxfp8_act_scaling=True, activation_type=ActivationType.Situ,
                                    situ_beta=beta[experts].copy(), situ_linear_beta=linear_beta[experts].copy(),
                                    **fi)[0]
            rank = mxmoe.prepare_experts(**situ_weights, activation="situ", beta=beta, linear_beta=linear_beta,
                                         tp_size=tp_size, tp_rank=tr, ep_size=ep_size, ep_rank=er, top_k=TOPK)
            want = mxmoe.reference_moe((codes, scales), ids, tw, rank, out_dtype="float32")
            np.testing.assert_array_equal(got, want, err_msg=f"tp {tr}/{tp_size} ep {er}/{ep_size}")


def test_prepared_once_per_weights_and_freed_with_them(situ_weights):
    codes, scales, ids, tw = mxfp8_input(5, seed=2)
    fi = flashinfer_weights(situ_weights)
    args = dict(input_sf=scales, swizzled_input_sf=False, use_mxfp8_act_scaling=True,
                activation_type=ActivationType.Situ)
    base = mxmoe.flashinfer._CACHE.prepares
    first = cutlass_fused_moe(codes, ids, tw, output_dtype=np.float32, **fi, **args)[0]
    # Fresh int64 views of the same arrays every call, as engines write `w.view(torch.long)`.
    for _ in range(3):
        again = dict(fi, fc1_expert_weights=fi["fc1_expert_weights"].view(np.int64),
                     fc2_expert_weights=fi["fc2_expert_weights"].view(np.int64))
        np.testing.assert_array_equal(cutlass_fused_moe(codes, ids, tw, output_dtype=np.float32, **again, **args)[0],
                                      first)
    assert mxmoe.flashinfer._CACHE.prepares == base + 1 and mxmoe.flashinfer.cache_size() == 1
    # Other weights (here: another rank's experts of the same shapes) are another entry.
    other = flashinfer_weights(situ_weights, slice(0, E))
    cutlass_fused_moe(codes, ids, tw, output_dtype=np.float32, **other, **args)
    assert mxmoe.flashinfer.cache_size() == 2
    # Freeing the weights frees their prepared experts.
    del other
    gc.collect()
    assert mxmoe.flashinfer.cache_size() == 1
    del fi, again
    gc.collect()
    assert mxmoe.flashinfer.cache_size() == 0


def call_args(situ_weights, **over):
    codes, scales, ids, tw = mxfp8_input(4, seed=9)
    kw = dict(input=codes, token_selected_experts=ids, token_final_scales=tw, output_dtype=np.float32,
              input_sf=scales, swizzled_input_sf=False, use_mxfp8_act_scaling=True,
              activation_type=ActivationType.Situ, **flashinfer_weights(situ_weights))
    kw.update(over)
    return kw


@pytest.mark.parametrize("name,value", [
    ("min_latency_mode", True), ("enable_alltoall", True), ("use_deepseek_fp8_block_scale", True),
    ("use_w4_group_scaling", True), ("use_packed_weights", True), ("use_wfp4afp8_humming", True),
    ("cluster_size", 2), ("fc1_expert_biases", np.zeros((E, 2 * I), np.float32)),
    ("fc2_expert_biases", np.zeros((E, K), np.float32)), ("swiglu_alpha", np.ones(E, np.float32)),
    ("swiglu_beta", np.ones(E, np.float32)), ("swiglu_limit", np.ones(E, np.float32)),
    ("use_mxfp8_act_scaling", False),
])
def test_refuses_unsupported_modes_by_name(situ_weights, name, value):
    with pytest.raises(NotImplementedError, match=rf"^{name}: "):
        cutlass_fused_moe(**call_args(situ_weights, **{name: value}))


@pytest.mark.parametrize("kind", [ActivationType.Gelu, ActivationType.Relu2, ActivationType.Identity,
                                  ActivationType.SwigluStep, ActivationType.SwigluBias])
def test_refuses_activations_it_does_not_serve(situ_weights, kind):
    with pytest.raises(NotImplementedError, match=rf"^activation_type: {kind.name} \({int(kind)}\)"):
        cutlass_fused_moe(**call_args(situ_weights, activation_type=kind))


def test_refuses_global_scales_other_than_one(situ_weights):
    kw = call_args(situ_weights)
    kw["quant_scales"][3] = np.full(E, 2.0, np.float32)
    with pytest.raises(NotImplementedError, match=r"^quant_scales\[3\]: per-expert global scales other than 1.0"):
        cutlass_fused_moe(**kw)


def test_bad_arguments_name_flashinfers_argument(situ_weights):
    kw = call_args(situ_weights)
    with pytest.raises(ValueError, match=r"^token_selected_experts: expected dtype int32"):
        cutlass_fused_moe(**dict(kw, token_selected_experts=kw["token_selected_experts"].astype(np.int64)))
    with pytest.raises(ValueError, match=r"^token_final_scales: expected dtype float32"):
        cutlass_fused_moe(**dict(kw, token_final_scales=kw["token_final_scales"].astype(np.float64)))
    with pytest.raises(ValueError, match=r"^input_sf: 10 bytes, expected \[4, 3\] linear scales"):
        cutlass_fused_moe(**dict(kw, input_sf=kw["input_sf"].reshape(-1)[:10].copy()))
    with pytest.raises(ValueError, match=r"^input_sf: \d+ bytes, expected at least 512"):
        cutlass_fused_moe(**dict(kw, swizzled_input_sf=True))
    with pytest.raises(ValueError, match=r"^input_sf: missing"):
        cutlass_fused_moe(**dict(kw, input_sf=None))
    with pytest.raises(ValueError, match=r"^quant_scales: expected 4 tensors"):
        cutlass_fused_moe(**dict(kw, quant_scales=kw["quant_scales"][:2]))
    with pytest.raises(ValueError, match=r"^quant_scales\[0\]: shape"):
        cutlass_fused_moe(**dict(kw, quant_scales=[kw["quant_scales"][0][:, :128].copy()] + kw["quant_scales"][1:]))
    with pytest.raises(ValueError, match=r"^fc1_expert_weights: 128 rows, expected 2 \* inter_size = 256"):
        cutlass_fused_moe(**dict(kw, fc1_expert_weights=kw["fc1_expert_weights"][:, :128].copy()))
    with pytest.raises(ValueError, match=r"^fc2_expert_weights: hidden_size"):
        cutlass_fused_moe(**dict(kw, fc2_expert_weights=kw["fc2_expert_weights"][:, :64].copy()))
    with pytest.raises(ValueError, match=r"^output_dtype: "):
        cutlass_fused_moe(**dict(kw, output_dtype=np.float16))
    with pytest.raises(ValueError, match=r"^situ_beta: only used by Situ"):
        cutlass_fused_moe(**dict(kw, activation_type=ActivationType.Swiglu, situ_beta=np.ones(E, np.float32)))
    with pytest.raises(ValueError, match=r"^input: expected float8_e4m3fn"):
        cutlass_fused_moe(**dict(kw, input=kw["input"].astype(np.float32)))
    with pytest.raises(ValueError, match=r"^situ_beta: expected shape \[8\]"):
        cutlass_fused_moe(**dict(kw, situ_beta=np.ones(E + 1, np.float32)))


def test_swizzle_helpers_round_trip():
    rng = np.random.default_rng(0)
    for rows, cols in [(1, 1), (33, 3), (128, 4), (300, 7)]:
        linear = rng.integers(0, 255, size=(2, rows, cols), dtype=np.uint8)
        sw = mxmoe.flashinfer.swizzle_block_scales(linear)
        np.testing.assert_array_equal(sw, swizzle_128x4(linear))
        np.testing.assert_array_equal(mxmoe.flashinfer.unswizzle_block_scales(sw, rows, cols), linear)


def test_situ_betas_as_numbers_and_defaults(situ_weights):
    # None means Kimi-K3's 4.0 / 25.0; numbers (an mxmoe extension) apply to every expert.
    kw = call_args(situ_weights)
    default = cutlass_fused_moe(**kw)[0]
    np.testing.assert_array_equal(cutlass_fused_moe(**dict(kw, situ_beta=4.0, situ_linear_beta=25.0))[0], default)
    other = cutlass_fused_moe(**dict(kw, situ_beta=2.0))[0]
    assert np.abs(other - default).max() > 0
    experts = mxmoe.prepare_experts(**situ_weights, activation="situ", beta=2.0, top_k=TOPK)
    want = mxmoe.reference_moe((kw["input"], kw["input_sf"]), kw["token_selected_experts"], kw["token_final_scales"],
                               experts, out_dtype="float32")
    np.testing.assert_array_equal(other, want)

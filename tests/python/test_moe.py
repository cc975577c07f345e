"""prepare_experts + fused_moe against reference_moe (the C++ definition of correct) on small
synthetic layers: the checkpoint layout, each fused FC1 layout, TP / EP slices, MXFP8 input."""

import numpy as np
import pytest

import mxmoe
from mxmoe import ActivationType
from conftest import E, I, K, TOPK, e4m3_to_float, fuse_w13, make_input


def poisoned(shape, dtype):
    # Unwritten outputs must show: NaN bits for both dtypes.
    if dtype == np.float32:
        return np.full(shape, np.nan, np.float32)
    return np.full(shape, 0x7FC1, np.uint16)


def prepare(w, **kw):
    kw.setdefault("top_k", TOPK)
    return mxmoe.prepare_experts(**w, **kw)


@pytest.mark.parametrize("pattern", mxmoe.ROUTING_PATTERNS)
@pytest.mark.parametrize("out_dtype", ["bf16", "float32"])
def test_fused_matches_reference(situ_weights, pattern, out_dtype):
    experts = prepare(situ_weights)
    x, ids, tw = make_input(num_tokens=11, pattern=pattern, seed=5)
    ref = mxmoe.reference_moe(x, ids, tw, experts, out_dtype=out_dtype)
    np_dtype = np.float32 if out_dtype == "float32" else np.uint16
    out = poisoned(ref.shape, np_dtype)
    got = mxmoe.fused_moe(x, ids, tw, experts, out=out)
    assert got is out
    assert got.dtype == np_dtype and got.shape == (11, K)
    # The CPU backend is bitwise the reference.
    np.testing.assert_array_equal(got, ref)
    vals = got if out_dtype == "float32" else mxmoe.bf16_to_float32(got)
    assert np.isfinite(vals).all() and np.abs(vals).max() > 0


def test_prepared_from_checkpoint_layout_equals_synthetic(situ_weights):
    # The same layer built in C++ and passed through numpy: identical results.
    built = mxmoe.synthetic_experts(E, K, I, TOPK, seed=7)
    given = prepare(situ_weights)
    x, ids, tw = make_input()
    np.testing.assert_array_equal(mxmoe.fused_moe(x, ids, tw, built), mxmoe.fused_moe(x, ids, tw, given))


def test_per_expert_lists_and_views(situ_weights):
    stacked = prepare(situ_weights)
    as_lists = mxmoe.prepare_experts(**{k: [v[e] for e in range(E)] for k, v in situ_weights.items()})
    # Non-contiguous weight views are read through their strides.
    w = dict(situ_weights)
    padded = np.zeros((E, I, K // 2 + 16), np.uint8)
    padded[:, :, : K // 2] = w["w1"]
    w["w1"] = padded[:, :, : K // 2]
    w["w3"] = np.asfortranarray(w["w3"])
    strided = prepare(w)
    x, ids, tw = make_input()
    ref = mxmoe.fused_moe(x, ids, tw, stacked)
    np.testing.assert_array_equal(mxmoe.fused_moe(x, ids, tw, as_lists), ref)
    np.testing.assert_array_equal(mxmoe.fused_moe(x, ids, tw, strided), ref)
    assert as_lists.top_k is None and stacked.top_k == TOPK


def test_read_only_weights(situ_weights):
    # Memory-mapped checkpoints arrive read-only.
    w = {k: v.copy() for k, v in situ_weights.items()}
    for v in w.values():
        v.flags.writeable = False
    x, ids, tw = make_input()
    np.testing.assert_array_equal(mxmoe.fused_moe(x, ids, tw, prepare(w)),
                                  mxmoe.fused_moe(x, ids, tw, prepare(situ_weights)))


@pytest.mark.parametrize("layout", ["gate_up", "up_gate", "interleaved"])
def test_fused_layouts_situ(situ_weights, layout):
    w = situ_weights
    base = dict(w2=w["w2"], w2_scale=w["w2_scale"], activation="situ", top_k=TOPK)
    fused = dict(w13=fuse_w13(w["w1"], w["w3"], layout), w13_scale=fuse_w13(w["w1_scale"], w["w3_scale"], layout))
    x, ids, tw = make_input(num_tokens=9)
    want = mxmoe.fused_moe(x, ids, tw, prepare(w))
    got = mxmoe.fused_moe(x, ids, tw, mxmoe.prepare_experts(**fused, layout=layout, **base))
    np.testing.assert_array_equal(got, want)
    # Reading the same tensor in any other layout is wrong, and SiTU (asymmetric) shows it.
    for other in {"gate_up", "up_gate", "interleaved"} - {layout}:
        wrong = mxmoe.fused_moe(x, ids, tw, mxmoe.prepare_experts(**fused, layout=other, **base))
        assert not np.array_equal(wrong, want), (layout, other)


def test_layout_aliases(situ_weights):
    w = situ_weights
    fused = dict(w13=fuse_w13(w["w1"], w["w3"], "up_gate"), w13_scale=fuse_w13(w["w1_scale"], w["w3_scale"], "up_gate"),
                 w2=w["w2"], w2_scale=w["w2_scale"], top_k=TOPK)
    x, ids, tw = make_input(num_tokens=4)
    a = mxmoe.fused_moe(x, ids, tw, mxmoe.prepare_experts(**fused, layout="flashinfer"))
    b = mxmoe.fused_moe(x, ids, tw, mxmoe.prepare_experts(**fused, layout="up_gate"))
    np.testing.assert_array_equal(a, b)
    assert set(mxmoe.FC1_LAYOUTS) == {"gate_up", "up_gate", "interleaved"}


@pytest.mark.parametrize("layout", ["gate_up", "interleaved"])
def test_swiglu_bias_fused_bias(weights, layout):
    w = weights
    params = dict(activation=ActivationType.SwigluBias, alpha=1.702, limit=7.0, top_k=TOPK)
    sep = mxmoe.prepare_experts(**w, **params)
    fused = mxmoe.prepare_experts(
        w13=fuse_w13(w["w1"], w["w3"], layout), w13_scale=fuse_w13(w["w1_scale"], w["w3_scale"], layout),
        w13_bias=fuse_w13(w["gate_bias"][..., None], w["up_bias"][..., None], layout)[..., 0],
        w2=w["w2"], w2_scale=w["w2_scale"], layout=layout, **params)
    no_bias = mxmoe.prepare_experts(**{k: v for k, v in w.items() if not k.endswith("_bias")}, **params)
    x, ids, tw = make_input(num_tokens=7)
    want = mxmoe.fused_moe(x, ids, tw, sep)
    np.testing.assert_array_equal(mxmoe.fused_moe(x, ids, tw, fused), want)
    np.testing.assert_array_equal(mxmoe.reference_moe(x, ids, tw, sep), want)
    assert not np.array_equal(mxmoe.fused_moe(x, ids, tw, no_bias), want)


def test_situ_parameters(situ_weights):
    x, ids, tw = make_input(num_tokens=10)
    default = mxmoe.fused_moe(x, ids, tw, prepare(situ_weights))
    explicit = mxmoe.fused_moe(x, ids, tw, prepare(situ_weights, beta=4.0, linear_beta=25.0))
    per_expert = prepare(situ_weights, beta=np.full(E, 4.0, np.float32), linear_beta=[25.0] * E)
    np.testing.assert_array_equal(explicit, default)
    np.testing.assert_array_equal(mxmoe.fused_moe(x, ids, tw, per_expert), default)
    betas = np.linspace(1.0, 8.0, E).astype(np.float32)
    varied = prepare(situ_weights, beta=betas)
    assert [varied.expert_params(e)["beta"] for e in range(E)] == pytest.approx(betas)
    assert varied.expert_params(0)["linear_beta"] == 25.0
    got = mxmoe.fused_moe(x, ids, tw, varied)
    np.testing.assert_array_equal(got, mxmoe.reference_moe(x, ids, tw, varied))
    assert not np.array_equal(got, default)


def as_f32(a):
    return a if a.dtype == np.float32 else mxmoe.bf16_to_float32(a)


@pytest.mark.parametrize("tp,ep", [(2, 1), (4, 1), (1, 2), (1, 4), (2, 2)])
def test_parallel_slices_sum_to_full(situ_weights, tp, ep):
    x, ids, tw = make_input(num_tokens=12, pattern="with_invalid", seed=11)
    full = mxmoe.fused_moe(x, ids, tw, prepare(situ_weights), out_dtype="float32")
    total = np.zeros_like(full)
    for tr in range(tp):
        for er in range(ep):
            rank = prepare(situ_weights, tp_size=tp, tp_rank=tr, ep_size=ep, ep_rank=er)
            assert rank.num_local_experts == E // ep and rank.local_intermediate == I // tp
            assert rank.first_expert == er * E // ep
            part = mxmoe.fused_moe(x, ids, tw, rank, out_dtype="float32")
            np.testing.assert_array_equal(part, mxmoe.reference_moe(x, ids, tw, rank, out_dtype="float32"))
            # The same rank from synthetic_experts (sliced in C++) and from local weights.
            synth = mxmoe.synthetic_experts(E, K, I, TOPK, seed=7, tp_size=tp, tp_rank=tr, ep_size=ep, ep_rank=er)
            np.testing.assert_array_equal(mxmoe.fused_moe(x, ids, tw, synth, out_dtype="float32"), part)
            local = mxmoe.prepare_experts(**synth.export_weights(), local=True, tp_size=tp, tp_rank=tr,
                                          ep_size=ep, ep_rank=er)
            assert (local.num_experts, local.intermediate) == (E, I)
            np.testing.assert_array_equal(mxmoe.fused_moe(x, ids, tw, local, out_dtype="float32"), part)
            total += part
    # Up to fp32 summation order (SPEC section 1).
    np.testing.assert_allclose(total, full, rtol=1e-5, atol=1e-5 * np.abs(full).max())


def test_mxfp8_input_pair(situ_weights):
    experts = prepare(situ_weights)
    rng = np.random.default_rng(0)
    t = 6
    codes = rng.integers(0, 256, size=(t, K), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x30  # no NaN codes
    codes[:, ::32] = 0x7E | (codes[:, ::32] & 0x80)  # each block's amax is 448: the scale round-trips
    scales = rng.integers(120, 131, size=(t, K // 32), dtype=np.uint8)
    _, ids, tw = make_input(num_tokens=t)
    pair = mxmoe.fused_moe((codes, scales), ids, tw, experts)
    np.testing.assert_array_equal(pair, mxmoe.reference_moe((codes, scales), ids, tw, experts))
    # The same values as bf16 (exact: e4m3 times a power of two fits bf16) quantize back to the pair.
    values = e4m3_to_float(codes) * np.exp2(np.repeat(scales.astype(np.float32) - 127, 32, axis=1))
    bits = mxmoe.float32_to_bf16(values)
    np.testing.assert_array_equal(mxmoe.bf16_to_float32(bits), values)
    np.testing.assert_array_equal(mxmoe.fused_moe(bits, ids, tw, experts), pair)


def test_zero_tokens(situ_weights):
    experts = prepare(situ_weights)
    x = np.zeros((0, K), np.uint16)
    out = mxmoe.fused_moe(x, np.zeros((0, TOPK), np.int32), np.zeros((0, TOPK), np.float32), experts)
    assert out.shape == (0, K)


def test_top_k_from_call(situ_weights):
    experts = mxmoe.prepare_experts(**situ_weights)  # top_k None: taken from each call
    for k in (1, 2, 5):
        x, ids, tw = make_input(num_tokens=5, top_k=k)
        np.testing.assert_array_equal(mxmoe.fused_moe(x, ids, tw, experts), mxmoe.reference_moe(x, ids, tw, experts))


def test_workspace_size_cpu(situ_weights):
    assert mxmoe.workspace_size(prepare(situ_weights), 1024) == 0


def test_repr_and_properties(situ_weights):
    experts = prepare(situ_weights, tp_size=2, tp_rank=1)
    assert (experts.num_experts, experts.hidden, experts.intermediate) == (E, K, I)
    assert experts.activation is ActivationType.Situ and experts.device == "cpu"
    assert "tp=1/2" in repr(experts)
    exported = experts.export_weights()
    assert exported["w1"].shape == (E, I // 2, K // 2) and exported["w2_scale"].shape == (E, K, I // 2 // 32)
    np.testing.assert_array_equal(exported["w1"], situ_weights["w1"][:, I // 2:])
    np.testing.assert_array_equal(exported["w2"], situ_weights["w2"][:, :, I // 4:])


def test_bf16_helpers():
    v = np.array([1.0, -2.5, 3.1415927, np.inf, -0.0, 1.00390625, 1.01171875], np.float32)
    bits = mxmoe.float32_to_bf16(v)
    # Ties to even: 1 + 2^-8 rounds down to 1, 1 + 3*2^-8 up to 1 + 2^-6.
    np.testing.assert_array_equal(mxmoe.bf16_to_float32(bits), [1.0, -2.5, 3.140625, np.inf, -0.0, 1.0, 1.015625])
    assert np.isnan(mxmoe.bf16_to_float32(mxmoe.float32_to_bf16(np.array([np.nan], np.float32))))[0]


def test_per_expert_parameters_follow_the_ep_slice(situ_weights):
    betas = np.linspace(1.0, 8.0, E).astype(np.float32)
    lin = np.linspace(10.0, 40.0, E).astype(np.float32)
    x, ids, tw = make_input(num_tokens=10, seed=2)
    full = mxmoe.fused_moe(x, ids, tw, prepare(situ_weights, beta=betas, linear_beta=lin), out_dtype="float32")
    total = np.zeros_like(full)
    for r in range(2):
        rank = prepare(situ_weights, beta=betas, linear_beta=lin, ep_size=2, ep_rank=r)
        synth = mxmoe.synthetic_experts(E, K, I, TOPK, seed=7, beta=betas, linear_beta=lin, ep_size=2, ep_rank=r)
        for i in range(E // 2):
            assert rank.expert_params(i)["beta"] == pytest.approx(betas[r * E // 2 + i])
            assert synth.expert_params(i)["linear_beta"] == pytest.approx(lin[r * E // 2 + i])
        part = mxmoe.fused_moe(x, ids, tw, rank, out_dtype="float32")
        np.testing.assert_array_equal(part, mxmoe.fused_moe(x, ids, tw, synth, out_dtype="float32"))
        total += part
    np.testing.assert_allclose(total, full, rtol=1e-5, atol=1e-5 * np.abs(full).max())

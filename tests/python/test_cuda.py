"""The CUDA backend through the binding: torch CUDA tensors in and out (skipped without the CUDA
backend in this build, torch or a GPU)."""

import numpy as np
import pytest

import mxmoe
from conftest import E, I, K, TOPK, make_input

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not (mxmoe.cuda_built() and torch.cuda.is_available()), reason="needs the CUDA backend and a GPU")


def dev(a):
    """A numpy array on the GPU; uint16 bf16 bits become torch.bfloat16."""
    if a.dtype == np.uint16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()
    return torch.from_numpy(a).cuda()


def bits(t):
    return t.cpu().view(torch.int16).numpy().view(np.uint16)


@pytest.fixture(scope="module")
def gpu_experts(situ_weights):
    return mxmoe.prepare_experts(**situ_weights, top_k=TOPK, device="cuda")


def test_properties(gpu_experts):
    assert gpu_experts.device == "cuda:0" and gpu_experts.top_k == TOPK
    assert mxmoe.workspace_size(gpu_experts, 64) >= 0


@pytest.mark.parametrize("pattern", mxmoe.ROUTING_PATTERNS)
def test_fused_vs_references(situ_weights, gpu_experts, pattern):
    x, ids, tw = make_input(num_tokens=37, pattern=pattern, seed=9)
    cpu = mxmoe.reference_moe(x, ids, tw, mxmoe.prepare_experts(**situ_weights, top_k=TOPK), out_dtype="float32")
    args = (dev(x), dev(ids), dev(tw))
    fused = mxmoe.fused_moe(*args, gpu_experts, out_dtype=torch.float32)
    gpu_ref = mxmoe.reference_moe(*args, gpu_experts, out_dtype=torch.float32)
    torch.cuda.synchronize()
    assert fused.device.type == "cuda" and fused.dtype == torch.float32
    scale = np.abs(cpu).max()
    np.testing.assert_allclose(gpu_ref.cpu().numpy(), cpu, rtol=1e-3, atol=1e-3 * scale)
    np.testing.assert_allclose(fused.cpu().numpy(), cpu, rtol=1e-3, atol=1e-3 * scale)
    bf16 = mxmoe.fused_moe(*args, gpu_experts)
    assert bf16.dtype == torch.bfloat16


def test_tp_ep_slices(situ_weights):
    x, ids, tw = make_input(num_tokens=16, seed=4)
    full = mxmoe.fused_moe(x, ids, tw, mxmoe.prepare_experts(**situ_weights, top_k=TOPK), out_dtype="float32")
    total = torch.zeros(16, K, device="cuda")
    for tr in range(2):
        for er in range(2):
            rank = mxmoe.prepare_experts(**situ_weights, top_k=TOPK, tp_size=2, tp_rank=tr, ep_size=2, ep_rank=er,
                                         device="cuda")
            total += mxmoe.fused_moe(dev(x), dev(ids), dev(tw), rank, out_dtype=torch.float32)
    np.testing.assert_allclose(total.cpu().numpy(), full, rtol=1e-3, atol=1e-3 * np.abs(full).max())


def test_stream_and_workspace(gpu_experts):
    x, ids, tw = make_input(num_tokens=8)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = mxmoe.fused_moe(dev(x), dev(ids), dev(tw), gpu_experts)
    s.synchronize()
    ws = torch.empty(max(1, mxmoe.workspace_size(gpu_experts, 8)), dtype=torch.uint8, device="cuda")
    out = torch.empty(8, K, dtype=torch.bfloat16, device="cuda")
    b = mxmoe.fused_moe(dev(x), dev(ids), dev(tw), gpu_experts, out=out, workspace=ws, stream=s)
    s.synchronize()
    assert b is out
    np.testing.assert_array_equal(bits(a), bits(b))


def test_device_mismatch(gpu_experts):
    x, ids, tw = make_input(num_tokens=4)
    with pytest.raises(ValueError, match=r"^x: is on cpu but the experts were prepared for cuda:0"):
        mxmoe.fused_moe(x, dev(ids), dev(tw), gpu_experts, out=torch.empty(4, K, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(ValueError, match=r"^top_k: required"):
        mxmoe.prepare_experts(**mxmoe.synthetic_weights(E, K, I), device="cuda")


# ---------------------------------------------------------------------------------------------
# torch.cuda.graph: captured once with static buffers, replayed with new inputs copied into them.


def warm_up(fn):
    # torch's recipe: run once on a side stream before capturing (lazy initialization stays out of
    # the graph).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)


def test_fused_moe_graph_replay_equals_eager(gpu_experts):
    t = 24
    x, ids, tw = make_input(num_tokens=t, seed=21)
    static_x, static_ids, static_tw = dev(x), dev(ids), dev(tw)
    static_out = torch.empty(t, K, dtype=torch.bfloat16, device="cuda")
    static_ws = torch.empty(max(1, mxmoe.workspace_size(gpu_experts, t)), dtype=torch.uint8, device="cuda")

    def step():
        return mxmoe.fused_moe(static_x, static_ids, static_tw, gpu_experts, out=static_out, workspace=static_ws)

    warm_up(step)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed, pattern in [(22, "uniform"), (23, "with_invalid"), (24, "one_expert"), (25, "heavy_hitters")]:
        x2, ids2, tw2 = make_input(num_tokens=t, seed=seed, pattern=pattern)
        static_x.copy_(dev(x2))
        static_ids.copy_(dev(ids2))
        static_tw.copy_(dev(tw2))
        static_out.fill_(float("nan"))
        graph.replay()
        eager = mxmoe.fused_moe(dev(x2), dev(ids2), dev(tw2), gpu_experts)
        torch.cuda.synchronize()
        np.testing.assert_array_equal(bits(static_out), bits(eager), err_msg=pattern)


# ---------------------------------------------------------------------------------------------
# The CUDA router against the CPU router: the same ids and the same weight bits.


def router_inputs(t, e, kind, seed):
    rng = np.random.default_rng(seed)
    if kind == "ties":  # a grid of 1/4 (exact in bf16): many equal scores, resolved by id
        logits = (rng.integers(-20, 21, size=(t, e)) * 0.25).astype(np.float32)
        bias = (rng.integers(0, 2, size=e) * 0.25).astype(np.float32)
    else:
        logits = (rng.normal(size=(t, e)) * 3).astype(np.float32)
        bias = rng.uniform(-0.05, 0.05, size=e).astype(np.float32)
    return logits, bias


@pytest.mark.parametrize("t", [0, 1, 2, 33, 4096])
@pytest.mark.parametrize("e,k", [(896, 16), (1024, 32), (256, 8), (100, 40)])
@pytest.mark.parametrize("kind", ["ties", "continuous"])
def test_router_cuda_equals_cpu(t, e, k, kind):
    logits, bias = router_inputs(t, e, kind, seed=t * 7 + e + k)
    for dtype in (torch.float32, torch.bfloat16):
        lt = torch.from_numpy(logits).cuda().to(dtype)
        want_logits = lt.float().cpu().numpy()  # what the kernel widens (bf16 rounds the continuous ones)
        ids, w = mxmoe.kimi_k3_router(lt, torch.from_numpy(bias).cuda(), top_k=k, routed_scaling_factor=2.5)
        assert ids.device.type == "cuda" and ids.dtype == torch.int32 and w.dtype == torch.float32
        want_ids, want_w = mxmoe.kimi_k3_router(want_logits, bias, top_k=k, routed_scaling_factor=2.5)
        torch.cuda.synchronize()
        np.testing.assert_array_equal(ids.cpu().numpy(), want_ids, err_msg=str(dtype))
        np.testing.assert_array_equal(w.cpu().numpy().view(np.uint32), want_w.view(np.uint32), err_msg=str(dtype))


def test_router_cuda_graph_replay_and_stream():
    t, e, k = 33, 896, 16
    _, bias = router_inputs(t, e, "ties", seed=1)
    static_logits = torch.zeros(t, e, device="cuda")
    static_bias = torch.from_numpy(bias).cuda()
    ids = torch.empty(t, k, dtype=torch.int32, device="cuda")
    w = torch.empty(t, k, dtype=torch.float32, device="cuda")

    def step():
        return mxmoe.kimi_k3_router(static_logits, static_bias, top_k=k, topk_ids=ids, topk_weights=w)

    warm_up(step)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = step()
    assert got[0] is ids and got[1] is w
    for seed in (2, 3):
        logits, _ = router_inputs(t, e, "ties", seed)
        static_logits.copy_(torch.from_numpy(logits))
        ids.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        want_ids, want_w = mxmoe.kimi_k3_router(logits, bias, top_k=k)
        np.testing.assert_array_equal(ids.cpu().numpy(), want_ids)
        np.testing.assert_array_equal(w.cpu().numpy(), want_w)
    # On a stream given explicitly, and on a side stream made current.
    s = torch.cuda.Stream()
    a = mxmoe.kimi_k3_router(static_logits, static_bias, top_k=k, stream=s)
    with torch.cuda.stream(s):
        b = mxmoe.kimi_k3_router(static_logits, static_bias, top_k=k)
    s.synchronize()
    np.testing.assert_array_equal(a[0].cpu().numpy(), b[0].cpu().numpy())


def test_router_cuda_errors():
    logits = torch.zeros(2, 16, device="cuda")
    with pytest.raises(ValueError, match=r"^correction_bias: is on cpu but logits are on cuda:0"):
        mxmoe.kimi_k3_router(logits, torch.zeros(16), top_k=4)
    with pytest.raises(ValueError, match=r"^topk_ids: is on cpu but logits are on cuda:0"):
        mxmoe.kimi_k3_router(logits, torch.zeros(16, device="cuda"), top_k=4,
                             topk_ids=torch.zeros(2, 4, dtype=torch.int32))
    wide = torch.zeros(1, 4097, device="cuda")
    with pytest.raises(NotImplementedError, match=r"num_experts = 4097"):
        mxmoe.kimi_k3_router(wide, torch.zeros(4097, device="cuda"), top_k=4)


# ---------------------------------------------------------------------------------------------
# mxmoe.flashinfer.cutlass_fused_moe with torch CUDA tensors


def test_flashinfer_entry_on_cuda(situ_weights):
    from mxmoe import ActivationType
    from test_flashinfer import flashinfer_weights, mxfp8_input, swizzle_128x4

    mxmoe.flashinfer.clear_cache()
    t = 37
    codes, scales, ids, tw = mxfp8_input(t, seed=31)
    fi = flashinfer_weights(situ_weights)
    fc1, fc2 = dev(fi["fc1_expert_weights"]), dev(fi["fc2_expert_weights"])
    quant_scales = [dev(q) for q in fi["quant_scales"]]
    x_u8, sf = dev(codes), dev(swizzle_128x4(scales[None])[0].reshape(-1))
    x8 = x_u8.view(torch.float8_e4m3fn)
    ids_d, tw_d = dev(ids), dev(tw)

    def call(output_dtype=torch.bfloat16, output=None):
        return mxmoe.flashinfer.cutlass_fused_moe(
            x8, ids_d, tw_d, fc1.view(torch.long), fc2, output_dtype, quant_scales, input_sf=sf,
            use_mxfp8_act_scaling=True, activation_type=ActivationType.Situ, output=output)

    out = call()[0]
    assert out.device.type == "cuda" and out.dtype == torch.bfloat16 and tuple(out.shape) == (t, K)
    experts = mxmoe.prepare_experts(**situ_weights, activation="situ", top_k=TOPK, device="cuda")
    direct = mxmoe.fused_moe((x8, dev(scales)), ids_d, tw_d, experts)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(bits(out), bits(direct))  # the same kernels on the same prepared layout
    cpu = mxmoe.reference_moe((codes, scales), ids, tw, mxmoe.prepare_experts(**situ_weights, top_k=TOPK),
                              out_dtype="float32")
    f32 = call(torch.float32)[0]
    np.testing.assert_allclose(f32.cpu().numpy(), cpu, rtol=1e-3, atol=1e-3 * np.abs(cpu).max())
    assert mxmoe.flashinfer.cache_size() == 1

    # Captured after the warm-up above (preparing happened eagerly), replayed with new inputs.
    static_out = torch.empty(t, K, dtype=torch.bfloat16, device="cuda")
    warm_up(lambda: call(output=static_out))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(output=static_out)
    for seed in (32, 33):
        codes2, scales2, ids2, tw2 = mxfp8_input(t, seed=seed)
        x_u8.copy_(dev(codes2))
        sf.copy_(dev(swizzle_128x4(scales2[None])[0].reshape(-1)))
        ids_d.copy_(dev(ids2))
        tw_d.copy_(dev(tw2))
        static_out.fill_(float("nan"))
        graph.replay()
        eager = mxmoe.fused_moe((dev(codes2).view(torch.float8_e4m3fn), dev(scales2)), dev(ids2), dev(tw2), experts)
        torch.cuda.synchronize()
        np.testing.assert_array_equal(bits(static_out), bits(eager))
    mxmoe.flashinfer.clear_cache()

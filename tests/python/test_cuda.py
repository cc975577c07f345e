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

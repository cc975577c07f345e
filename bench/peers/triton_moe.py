#!/usr/bin/env python3
"""A Triton MXFP4 MoE, timed side by side with mxmoe on the same inputs (issue 5's second peer).

What a Hopper user with the installed Triton and no mxmoe could write: the experts stay in device
memory as the checkpoint stores them (packed E2M1, element 2i in the low nibble, and a UE8M0 scale
per 32 of the reduction), so each call reads a quarter of the bf16 peer's weight bytes; the GEMM
kernels dequantize a weight tile to bf16 in registers and multiply it with bf16 activations on the
tensor cores (x and the intermediate stay bf16: no MXFP8). Per call:
    routing with torch ops (the pairs sorted by expert, a list of tiles of at most BLOCK_M pairs of
    one expert; no host synchronization) -> FC1: gate and up rows of a tile in one kernel, the
    activation in fp32, the intermediate in bf16 -> FC2: times the pair's router weight, one bf16
    row per pair -> the combine: each token's k rows added in slot order.
Block sizes follow the expected pairs per expert (untuned heuristics, `Config.pick`).

Run by bench/run.sh beside the PyTorch peer; timing and the check against mxmoe's output are
peer_common.py's, with a CUDA graph column as well. Under TRITON_INTERPRET=1 the kernels run on the
CPU (tests/python/test_peers.py), where the interpreter's bf16 dot is wrong, so the products
are formed in fp32 there.

    python3 bench/peers/triton_moe.py --dump DIR --csv triton.csv [--repeats 20] [--warmup 3]
"""
import functools
import math
import os

import torch
import triton
import triton.language as tl

from peer_common import PeerLayer, parse_args, run_rows, sort_pairs

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
ACTIVATIONS = {"Situ": 0, "Swiglu": 1, "SwigluBias": 2}


@triton.jit
def _dequant_tile(packed_ptr, scale_ptr, rows, row_ok, k0, row_bytes, row_scales,
                  BN: tl.constexpr, BK: tl.constexpr, OUT: tl.constexpr):
    """The [BN, BK] tile of an MXFP4 matrix at `rows` (int64) and reduction columns [k0, k0 + BK),
    in OUT. Rows outside the matrix (not row_ok) read as zero."""
    half = tl.arange(0, BK // 2)
    p = tl.load(packed_ptr + rows[:, None] * row_bytes + k0 // 2 + half[None, :], mask=row_ok[:, None], other=0)
    codes = tl.reshape(tl.join(p & 0xF, p >> 4), [BN, BK]).to(tl.int32)  # element 2i: the low nibble
    mag = codes & 7
    ex = mag >> 1
    mant = mag & 1
    # E2M1 as fp32 bits: 0 and 0.5 (ex = 0) apart, else 2^(ex - 1) * (1 + mant / 2).
    bits = tl.where(ex > 0, ((ex + 126) << 23) | (mant << 22), mant * 0x3F000000) | ((codes >> 3) << 31)
    values = bits.to(tl.float32, bitcast=True)
    blocks = tl.arange(0, BK // 32)
    s = tl.load(scale_ptr + rows[:, None] * row_scales + k0 // 32 + blocks[None, :], mask=row_ok[:, None],
                other=127).to(tl.int32)
    # 2^(s - 127) as fp32 bits, NaN for 255; s = 0 (2^-127, a subnormal) reads as 0 here.
    scale = tl.where(s == 255, 0x7FC00000, s << 23).to(tl.float32, bitcast=True)
    tile = tl.reshape(values, [BN, BK // 32, 32]) * scale[:, :, None]
    return tl.reshape(tile, [BN, BK]).to(OUT)


@triton.jit
def _tanh(z):
    return 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)


@triton.jit
def _fc1_kernel(x_ptr, order_ptr, tile_expert_ptr, tile_row_ptr, tile_count_ptr, w_ptr, ws_ptr, gb_ptr, ub_ptr,
                a_ptr, beta, linear_beta, alpha, limit, hidden: tl.constexpr, inter: tl.constexpr,
                top_k: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, DOT: tl.constexpr):
    """a[r, n] = act(g, u) for the sorted pairs r of one tile and intermediate columns n of one block:
    g from the expert's gate rows n of w13, u from its up rows I + n."""
    tile = tl.program_id(1)
    expert = tl.load(tile_expert_ptr + tile)
    if expert < 0:
        return
    row0 = tl.load(tile_row_ptr + tile)
    count = tl.load(tile_count_ptr + tile)
    m = tl.arange(0, BM)
    m_ok = m < count
    token = (tl.load(order_ptr + row0 + m, mask=m_ok, other=0) // top_k).to(tl.int64)
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    n_ok = n < inter
    gate_rows = expert.to(tl.int64) * 2 * inter + n
    up_rows = gate_rows + inter
    cols = tl.arange(0, BK)
    g = tl.zeros([BM, BN], dtype=tl.float32)
    u = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, hidden, BK):
        x = tl.load(x_ptr + token[:, None] * hidden + k0 + cols[None, :], mask=m_ok[:, None], other=0.0).to(DOT)
        wg = _dequant_tile(w_ptr, ws_ptr, gate_rows, n_ok, k0, hidden // 2, hidden // 32, BN, BK, DOT)
        wu = _dequant_tile(w_ptr, ws_ptr, up_rows, n_ok, k0, hidden // 2, hidden // 32, BN, BK, DOT)
        g = tl.dot(x, tl.trans(wg), g)
        u = tl.dot(x, tl.trans(wu), u)
    if ACT == 0:  # Situ
        act = beta * _tanh(g / beta) * tl.sigmoid(g) * (linear_beta * _tanh(u / linear_beta))
    elif ACT == 1:  # Swiglu
        act = g * tl.sigmoid(g) * u
    else:  # SwigluBias
        if HAS_BIAS:
            bias_at = expert.to(tl.int64) * inter + n
            g = g + tl.load(gb_ptr + bias_at, mask=n_ok, other=0.0)[None, :]
            u = u + tl.load(ub_ptr + bias_at, mask=n_ok, other=0.0)[None, :]
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
        act = g * tl.sigmoid(alpha * g) * (u + 1.0)
    rows = (row0 + m).to(tl.int64)
    tl.store(a_ptr + rows[:, None] * inter + n[None, :], act.to(tl.bfloat16), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _fc2_kernel(a_ptr, order_ptr, tile_expert_ptr, tile_row_ptr, tile_count_ptr, w_ptr, ws_ptr, tw_ptr, y_ptr,
                hidden: tl.constexpr, inter: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                DOT: tl.constexpr):
    """y[pair, n] = w_pair * (a[r] . W2[e][n]) for the sorted pairs r of one tile (pair = order[r])
    and output columns n of one block. (Its first lines repeat _fc1_kernel's: with the tile read in
    a shared jit function, the kernels of 64- and 128-row tiles took 230-255 registers instead of
    186-202 and the 16-row FC1 113 instead of 96, Triton 3.6, triton_compile_check.py.)"""
    tile = tl.program_id(1)
    expert = tl.load(tile_expert_ptr + tile)
    if expert < 0:
        return
    row0 = tl.load(tile_row_ptr + tile)
    count = tl.load(tile_count_ptr + tile)
    m = tl.arange(0, BM)
    m_ok = m < count
    rows = (row0 + m).to(tl.int64)
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    n_ok = n < hidden
    w_rows = expert.to(tl.int64) * hidden + n
    cols = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, inter, BK):
        a = tl.load(a_ptr + rows[:, None] * inter + k0 + cols[None, :], mask=m_ok[:, None], other=0.0).to(DOT)
        w = _dequant_tile(w_ptr, ws_ptr, w_rows, n_ok, k0, inter // 2, inter // 32, BN, BK, DOT)
        acc = tl.dot(a, tl.trans(w), acc)
    pair = tl.load(order_ptr + rows, mask=m_ok, other=0).to(tl.int64)
    acc = acc * tl.load(tw_ptr + pair, mask=m_ok, other=0.0)[:, None]
    tl.store(y_ptr + pair[:, None] * hidden + n[None, :], acc.to(tl.bfloat16), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _combine_kernel(y_ptr, ids_ptr, out_ptr, num_experts, hidden: tl.constexpr, top_k: tl.constexpr,
                    BLOCK: tl.constexpr):
    """out[t, c] = sum over the token's valid slots j, in order, of y[t k + j, c] (fp32, then bf16)."""
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    c_ok = c < hidden
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in range(0, top_k):
        e = tl.load(ids_ptr + t * top_k + j)
        valid = (e >= 0) & (e < num_experts)
        acc += tl.load(y_ptr + (t * top_k + j) * hidden + c, mask=c_ok & valid, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * hidden + c, acc.to(tl.bfloat16), mask=c_ok)


def _reduction_block(dim, widest):
    """The widest power-of-two step <= widest (and >= 32) that divides dim (a multiple of 32)."""
    b = widest
    while dim % b:
        b //= 2
    return b


class Config:
    """Block sizes and launch shape of one call's GEMMs: BLOCK_M pairs per tile, and for each GEMM
    (block_n, block_k, warps); block_k is lowered to a step that divides the reduction."""

    def __init__(self, block_m, fc1, fc2, stages):
        self.block_m, self.fc1, self.fc2, self.stages = block_m, fc1, fc2, stages

    @staticmethod
    def pick(num_tokens, top_k, num_experts):
        """By the expected pairs per touched expert under uniform routing (as mxmoe's heuristics).
        For the benchmark's shapes each choice compiles for sm_90a with at most 202 registers and no
        spills (Triton 3.6, bench/peers/triton_compile_check.py; a block_k of 64 or 128 in FC1 took
        255 registers or spilled)."""
        pairs = num_tokens * top_k
        touched = max(1.0, num_experts * (1.0 - math.exp(-pairs / num_experts)))
        per_expert = pairs / touched
        if per_expert <= 16:
            return Config(16, (64, 32, 4), (64, 32, 4), 4)
        if per_expert <= 32:
            return Config(32, (64, 32, 4), (64, 32, 4), 4)
        if per_expert <= 64:
            return Config(64, (64, 32, 4), (128, 64, 8), 3)
        return Config(128, (64, 32, 8), (128, 32, 8), 3)


class Layer(PeerLayer):
    """One layer's experts on the device in MXFP4: w13 [E, 2I, K/2] packed and [E, 2I, K/32] scales
    (gate rows, then up rows), w2 [E, K, I/2] and [E, K, I/32]."""

    def __init__(self, spec, device):
        if spec["activation"] not in ACTIVATIONS:
            raise NotImplementedError(f"activation {spec['activation']}: not in this peer")
        super().__init__(spec, device)
        e_count, k_dim, i_dim = self.num_experts, self.hidden, self.intermediate
        u8 = dict(dtype=torch.uint8, device=device)
        self.w13 = torch.empty(e_count, 2 * i_dim, k_dim // 2, **u8)
        self.w13_scale = torch.empty(e_count, 2 * i_dim, k_dim // 32, **u8)
        self.w2 = torch.empty(e_count, k_dim, i_dim // 2, **u8)
        self.w2_scale = torch.empty(e_count, k_dim, i_dim // 32, **u8)

    def set_expert(self, e, t):
        i_dim = self.intermediate
        self.w13[e, :i_dim] = t["w1.weight_packed"]
        self.w13[e, i_dim:] = t["w3.weight_packed"]
        self.w13_scale[e, :i_dim] = t["w1.weight_scale"]
        self.w13_scale[e, i_dim:] = t["w3.weight_scale"]
        self.w2[e] = t["w2.weight_packed"]
        self.w2_scale[e] = t["w2.weight_scale"]
        self.set_biases(e, t)


def route(topk_ids, num_experts, block_m):
    """(order, tile_expert, tile_row, tile_count) on the device, without a host synchronization:
    order lists the pair ids t k + j sorted by expert (stable; pairs of ids outside [0, E) last and
    in no tile), and tile i covers order[tile_row[i] : tile_row[i] + tile_count[i]], all of expert
    tile_expert[i] (-1 for the list's unused tail: its length is a bound from the shapes alone)."""
    _, order, counts = sort_pairs(topk_ids, num_experts)
    pairs = order.numel()
    first_pair = torch.cumsum(counts, 0) - counts
    tiles = (counts + block_m - 1) // block_m
    tiles_end = torch.cumsum(tiles, 0)
    max_tiles = max(1, (pairs + block_m - 1) // block_m + min(num_experts, pairs))
    t = torch.arange(max_tiles, device=order.device)
    expert = torch.searchsorted(tiles_end, t, right=True)  # the first e whose tiles end after t
    used = expert < num_experts
    e = expert.clamp(max=num_experts - 1)
    row = first_pair[e] + (t - (tiles_end[e] - tiles[e])) * block_m
    count = torch.clamp(first_pair[e] + counts[e] - row, max=block_m)
    return (order.to(torch.int32), torch.where(used, e, -1).to(torch.int32), row.to(torch.int32),
            count.to(torch.int32))


def moe_forward(layer, x, topk_ids, topk_weights, config=None):
    """out[t] = sum_j w[t, j] * W2[e] act(W1[e] x[t], W3[e] x[t]), e = topk_ids[t, j] (ids outside
    [0, E): nothing); x [T, K] bf16, out [T, K] bf16."""
    t_count, top_k = topk_ids.shape
    k_dim, i_dim, e_count = layer.hidden, layer.intermediate, layer.num_experts
    cfg = config or Config.pick(t_count, top_k, e_count)
    pairs = t_count * top_k
    out = torch.empty(t_count, k_dim, dtype=torch.bfloat16, device=x.device)
    if pairs == 0:
        return out
    order, tile_expert, tile_row, tile_count = route(topk_ids, e_count, cfg.block_m)
    tiles = tile_expert.numel()
    dot = tl.float32 if INTERPRET else tl.bfloat16
    a = torch.empty(pairs, i_dim, dtype=torch.bfloat16, device=x.device)
    spec = layer.spec
    bias = layer.gate_bias is not None
    block_n, block_k, warps = cfg.fc1
    _fc1_kernel[(triton.cdiv(i_dim, block_n), tiles)](
        x, order, tile_expert, tile_row, tile_count, layer.w13, layer.w13_scale,
        layer.gate_bias if bias else a, layer.up_bias if bias else a, a,
        float(spec["beta"]), float(spec["linear_beta"]), float(spec["alpha"]), float(spec["limit"]),
        hidden=k_dim, inter=i_dim, top_k=top_k, ACT=ACTIVATIONS[spec["activation"]], HAS_BIAS=bias,
        BM=cfg.block_m, BN=block_n, BK=_reduction_block(k_dim, block_k), DOT=dot, num_warps=warps,
        num_stages=cfg.stages)
    y = torch.empty(pairs, k_dim, dtype=torch.bfloat16, device=x.device)
    block_n, block_k, warps = cfg.fc2
    _fc2_kernel[(triton.cdiv(k_dim, block_n), tiles)](
        a, order, tile_expert, tile_row, tile_count, layer.w2, layer.w2_scale, topk_weights.reshape(-1), y,
        hidden=k_dim, inter=i_dim, BM=cfg.block_m, BN=block_n, BK=_reduction_block(i_dim, block_k), DOT=dot,
        num_warps=warps, num_stages=cfg.stages)
    block = 1024
    _combine_kernel[(t_count, triton.cdiv(k_dim, block))](y, topk_ids.reshape(-1), out, e_count, hidden=k_dim,
                                                          top_k=top_k, BLOCK=block, num_warps=4)
    return out


def main():
    args = parse_args(__doc__)
    run_rows("triton", args, f"triton {triton.__version__}, torch {torch.__version__}, MXFP4 weights", Layer.load,
             lambda layer, x, ids, weights: functools.partial(moe_forward, layer, x, ids, weights), graph=True)


if __name__ == "__main__":
    main()

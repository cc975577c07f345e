#!/usr/bin/env python3
"""Predicted time of the Kimi-K3 MoE layer on the RTX PRO 6000 Blackwell (SM120) with the SM120
kernels of src/cuda/sm120/, from their tile counts, bytes and the block-scaled MMA's issue rate.
Prints the arithmetic behind every number, so that the first run on real hardware can be judged
against it (docs/sm120.md). Standard library only.

    python3 scripts/sm120_perf_model.py [--tokens 1,8,32,1024,16384] [--markdown] [--pair-chunks]

Model (each assumption is named where it is used):
  * Routing: uniform, k distinct experts per token (the benchmark's `uniform`). The number of
    pairs n_e an expert gets is Binomial(T_chunk, k/E); the expected count of touched experts and
    of BLOCK_M tiles, E[ceil(n_e / BLOCK_M)], are summed exactly over that distribution.
  * Config: ChooseGemmConfig (m16 up to 16 pairs per touched expert, else m64), and the chunking
    of CudaMoe (workspace target 2 GiB, same per-token bytes as PlanRun).
  * DRAM: every touched expert's weights (codes + scales) are read once per chunk; later token
    tiles of the same expert hit L2 (they run in the same wave: tiles of one expert are adjacent
    in the grid). Activations: x (bf16) read, xq written and read, h written and read, y (fp32)
    written by FC2 and read by the combine, out written. At 1.79 TB/s, no efficiency factor.
  * MMA: one m16n8k32 block-scaled MMA per 16 clocks per SM sub-partition (4 per SM), i.e. the FP8
    dense peak of SPEC section 6 (188 SMs x 4 x 8192 FLOP / 16 clk x 2.617 GHz = 1.007 PFLOP/s).
    kind::mxf8f6f4 with an e2m1 B is taken at the FP8 rate, not the FP4 one (that is kind::mxf4).
    Every MMA a CTA issues counts, padding tokens included.
  * A GEMM takes max(DRAM time, MMA time): the cp.async pipeline overlaps the two. The routing
    kernels (quantize, CUB sort, offsets) and the combine add a fixed latency per chunk.
  * --pair-chunks (the library's default since perf-log v18; without the flag the model takes token
    chunks, MXMOE_PAIR_CHUNKS=0; cuda_moe.cu's RunPairChunks): a call too large for one
    chunk routes all its tokens once (per-token buffers at most half the target) and runs ranges of
    its sorted pairs, as long as the rest of the target allows and of equal length. An expert's
    weights are read once per call, and once more per range boundary that cuts it (range - 1
    experts); its tiles are counted at the call's density. Each range's combine reads its y rows
    and reads and writes the fp32 sums of all the tokens (the first only writes them, the last
    only reads them and writes the output); each range adds the fixed latency.
"""
import argparse
import math

# ---- the machine (SPEC section 6) ------------------------------------------------------------
SMS = 188
DRAM_BPS = 1.79e12
CLOCK_HZ = 2.617e9          # boost clock; with the FP8 dense peak it gives 16 clk per MMA per SMSP
CLK_PER_MMA_PER_SMSP = 16   # 8192 FLOP / 16 clk = 512 FLOP/clk per SMSP
MMA_FLOP = 2 * 16 * 8 * 32
MMA_RATE = SMS * 4 * CLOCK_HZ / CLK_PER_MMA_PER_SMSP  # MMAs per second
FIXED_PER_CHUNK_S = 20e-6   # prepare + sort (~4 CUB kernels) + offsets + combine: ~6 launches
WORKSPACE_TARGET = 2 << 30

# ---- the layer (SPEC section 5) ----------------------------------------------------------------
E, K, I, TOPK = 896, 3584, 3072, 16

# ---- the kernels' configs (src/cuda/sm120/moe_gemm_sm120.cuh) -----------------------------------
CONFIGS = {
    # name: (BLOCK_M tokens, BLOCK_N weight rows)
    "m16": (16, 128),
    "m64": (64, 256),
}
KTILE, GROUP_ROWS = 128, 64


def round_up(v, m):
    return (v + m - 1) // m * m


def expert_bytes():
    """MXFP4 codes + UE8M0 scales of one expert, FC1 (W1, W3) and FC2 (W2)."""
    w13 = 2 * I * K // 2 + 2 * I * K // 32
    w2 = K * I // 2 + K * I // 32
    return w13, w2


def chunking(tokens):
    """CudaMoe's chunks: per-token workspace as PlanRun lays it out for the SM120 path."""
    xs, hs = round_up(K, KTILE), round_up(I, KTILE)
    per_token = (xs + xs // 32) + TOPK * ((hs + hs // 32) + K * 4 + 4 * 4 + 8)
    max_chunk = max(1, WORKSPACE_TARGET // per_token)
    chunks = max(1, -(-tokens // max_chunk))
    return chunks, -(-tokens // chunks), per_token


def binomial_expectations(n, p, block_m):
    """E[#experts with >= 1 pair] / E and E[ceil(n_e / block_m)] for n_e ~ Binomial(n, p)."""
    touched, tiles = 0.0, 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    mean = n * p
    sd = math.sqrt(n * p * (1 - p))
    lo, hi = max(1, int(mean - 12 * sd) - 1), min(n, int(mean + 12 * sd) + 2)
    for x in range(lo, hi + 1):
        log_pmf = math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(n - x + 1) + x * log_p + (n - x) * log_q
        pmf = math.exp(log_pmf)
        touched += pmf
        tiles += pmf * -(-x // block_m)
    return touched, tiles


def choose(pairs_per_expert):
    return "m16" if pairs_per_expert <= 16.0 else "m64"


def chunk_terms(chunk, extra_tiles=0, extra_reads=0):
    """One chunk of `chunk` tokens routed as a whole: its config, tiles, MMAs and DRAM bytes.
    extra_tiles / extra_reads: pair chunks' experts cut by a range boundary (one more tile, their
    weights read once more)."""
    w13_bytes, w2_bytes = expert_bytes()
    p = TOPK / E
    touched_frac, _ = binomial_expectations(chunk, p, 1)
    touched = E * touched_frac
    pairs = chunk * TOPK
    ppe = pairs / touched
    cfg = choose(ppe)
    block_m, block_n = CONFIGS[cfg]
    _, tiles_per_expert = binomial_expectations(chunk, p, block_m)
    tiles = E * tiles_per_expert + extra_tiles  # expected token tiles in the chunk
    n_blocks13 = -(-(2 * I) // block_n)
    n_blocks2 = -(-K // block_n)
    # MMAs: per tile (BLOCK_M / 16) x (rows / 8) x (K / 32); the weight rows are whole groups here.
    mma13 = tiles * (block_m // 16) * (2 * I // 8) * (round_up(K, KTILE) // 32)
    mma2 = tiles * (block_m // 16) * (K // 8) * (round_up(I, KTILE) // 32)
    # DRAM bytes of one chunk.
    xs, hs = round_up(K, KTILE), round_up(I, KTILE)
    read = touched + extra_reads
    return dict(chunk=chunk, touched=touched, pairs=pairs, ppe=ppe, cfg=cfg, block_m=block_m, block_n=block_n,
                tiles=tiles, n_blocks13=n_blocks13, n_blocks2=n_blocks2, mma13=mma13, mma2=mma2,
                b_w13=read * w13_bytes, b_w2=read * w2_bytes,
                b_act13=chunk * (xs + xs // 32) + pairs * (hs + hs // 32),  # xq read once from DRAM, h written
                b_act2=pairs * (hs + hs // 32) + pairs * K * 4,             # h read, y written
                b_prep=chunk * K * 2 + chunk * (xs + xs // 32),             # x read, xq written
                b_comb=pairs * K * 4 + chunk * K * 2)                       # y read, bf16 out written


def finish(r, tokens, parts, fixed_per_part):
    """The call's times from a chunk's terms r, run as `parts` equal parts (chunks, or ranges of one
    outer chunk); every per-part quantity in r is divided by parts."""
    per = {k: r[k] / parts for k in ("mma13", "mma2", "b_w13", "b_w2", "b_act13", "b_act2", "b_prep", "b_comb")}
    t_mma13, t_mma2 = per["mma13"] / MMA_RATE, per["mma2"] / MMA_RATE
    t13 = max((per["b_w13"] + per["b_act13"]) / DRAM_BPS, t_mma13)
    t2 = max((per["b_w2"] + per["b_act2"]) / DRAM_BPS, t_mma2)
    t_other = (per["b_prep"] + per["b_comb"]) / DRAM_BPS + fixed_per_part
    r.update(per, tokens=tokens, ctas13=r["tiles"] / parts * r["n_blocks13"], ctas2=r["tiles"] / parts * r["n_blocks2"],
             t_mma13=t_mma13, t_mma2=t_mma2, t13=t13, t2=t2, t_other=t_other,
             useful_mma=(r["pairs"] * 3 * K * I * 2 / MMA_FLOP) / (r["mma13"] + r["mma2"]), **roofline(tokens))
    return r


def roofline(tokens):
    """A call's useful FLOP, the weight bytes of the experts it touches, and the larger of the two
    times at the machine's rates."""
    w13_bytes, w2_bytes = expert_bytes()
    flop = 2 * tokens * TOPK * 3 * K * I
    roof_bytes = E * (1 - (1 - TOPK / E) ** tokens) * (w13_bytes + w2_bytes)
    return dict(flop=flop, roof_bytes=roof_bytes, roof_s=max(roof_bytes / DRAM_BPS, flop / (MMA_RATE * MMA_FLOP)))


def model(tokens):
    chunks, chunk, per_token = chunking(tokens)
    r = finish(chunk_terms(chunk), tokens, 1, FIXED_PER_CHUNK_S)
    r.update(chunks=chunks, per_token=per_token, total=chunks * (r["t13"] + r["t2"] + r["t_other"]))
    return r


def pair_chunking(tokens):
    """RunPairChunks' plan for the SM120 path (PlanPairs / PlanPairsFor): outer tokens, the range
    capacity, and the per-token and per-pair bytes. (The code measures the per-token bytes from two
    plans, whose 256-byte rounding can hide a little: its outer chunks may be a few % longer.)"""
    xs, hs = round_up(K, KTILE), round_up(I, KTILE)
    per_token = (xs + xs // 32) + 6 * TOPK * 4 + K * 4  # xq, keys / values / positions / weights, sums
    per_pair = (hs + hs // 32) + K * 4 + 4 + 8           # h, y, the FC2 pair ids, the tile list
    outer = min(tokens, max(1, WORKSPACE_TARGET // 2 // per_token))
    fit = (WORKSPACE_TARGET - outer * per_token - 4 * 256) // per_pair
    pairs = outer * TOPK
    cap = min(max(fit, min(256, pairs)), pairs)
    return outer, cap, per_token, per_pair


def outer_chunk(tc, cap):
    """One outer chunk of tc tokens in ranges of at most cap pairs (equal lengths)."""
    pairs = tc * TOPK
    ranges = -(-pairs // cap)
    r = chunk_terms(tc, extra_tiles=ranges - 1, extra_reads=ranges - 1)
    r["b_comb"] += (2 * ranges - 2) * tc * K * 4  # the sums: the first writes, middle ranges read and write, the last reads
    r = finish(r, tc, ranges, FIXED_PER_CHUNK_S)
    r.update(ranges=ranges, step=-(-pairs // ranges), outer_total=ranges * (r["t13"] + r["t2"] + r["t_other"]))
    return r


def model_pairs(tokens):
    """The same layer in pair chunks (only differs from model() for calls that chunk). The details
    printed are the first outer chunk's; the total counts every outer chunk, the last as long as it is."""
    if chunking(tokens)[0] == 1:
        return model(tokens)
    outer, cap, per_token, per_pair = pair_chunking(tokens)
    r = outer_chunk(outer, cap)
    full, rest = divmod(tokens, outer)
    total, chunks = full * r["outer_total"], full * r["ranges"]
    if rest:
        last = outer_chunk(rest, cap)
        total, chunks = total + last["outer_total"], chunks + last["ranges"]
    r.update(tokens=tokens, chunks=chunks, chunk=outer, per_token=per_token, per_pair=per_pair, total=total,
             **roofline(tokens))
    return r


def us(s):
    return f"{s * 1e6:,.0f} us" if s < 1e-2 else f"{s * 1e3:,.2f} ms"


def gb(b):
    return f"{b / 1e9:,.3f} GB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="1,8,32,1024,16384")
    ap.add_argument("--markdown", action="store_true", help="only the summary table, as Markdown")
    ap.add_argument("--pair-chunks", action="store_true", help="calls that chunk run in pair chunks (the default; without it, token chunks as with MXMOE_PAIR_CHUNKS=0)")
    args = ap.parse_args()
    rows = [(model_pairs if args.pair_chunks else model)(int(t)) for t in args.tokens.split(",")]
    w13_bytes, w2_bytes = expert_bytes()
    if not args.markdown:
        print(f"machine: {SMS} SMs, {DRAM_BPS / 1e12:.2f} TB/s, MMA m16n8k32 mxf8f6f4: {CLK_PER_MMA_PER_SMSP} clk/SMSP "
              f"at {CLOCK_HZ / 1e9:.3f} GHz = {MMA_RATE:.3e} MMA/s = {MMA_RATE * MMA_FLOP / 1e15:.3f} PFLOP/s")
        print(f"layer: E={E} K={K} I={I} k={TOPK}; per expert W13 {w13_bytes:,} B + W2 {w2_bytes:,} B "
              f"= {(w13_bytes + w2_bytes) / 1e6:.2f} MB")
        for r in rows:
            if "ranges" in r:
                print(f"\nT = {r['tokens']}: pair chunks: {r['chunks']} range(s) of {r['step']} pairs, outer chunks of "
                      f"{r['chunk']} tokens ({r['per_token']:,} B/token, {r['per_pair']:,} B/pair, 2 GiB target); "
                      "per range:")
            else:
                print(f"\nT = {r['tokens']}: {r['chunks']} chunk(s) of {r['chunk']} tokens "
                      f"(workspace {r['per_token']:,} B/token, 2 GiB target)")
            print(f"  touched experts E*(1-(1-k/E)^T) = {r['touched']:.1f}; pairs/expert = {r['chunk'] * TOPK}/"
                  f"{r['touched']:.1f} = {r['ppe']:.2f} -> config {r['cfg']} (BLOCK_M {r['block_m']}, "
                  f"BLOCK_N {r['block_n']})")
            per = r.get("ranges", 1)
            print(f"  token tiles sum_e E[ceil(n_e/{r['block_m']})] = {r['tiles']:.1f}; CTAs FC1 {r['tiles'] / per:.1f} x "
                  f"{r['n_blocks13']} = {r['ctas13']:,.0f}, FC2 x {r['n_blocks2']} = {r['ctas2']:,.0f}")
            weights = "" if "ranges" in r else f"{r['touched']:.1f} x {w13_bytes:,} = "
            print(f"  FC1: weights {weights}{gb(r['b_w13'])} + activations "
                  f"{gb(r['b_act13'])} -> {us((r['b_w13'] + r['b_act13']) / DRAM_BPS)}; MMAs {r['mma13']:,.0f} -> "
                  f"{us(r['t_mma13'])}; takes {us(r['t13'])}")
            print(f"  FC2: weights {gb(r['b_w2'])} + activations {gb(r['b_act2'])} -> "
                  f"{us((r['b_w2'] + r['b_act2']) / DRAM_BPS)}; MMAs {r['mma2']:,.0f} -> {us(r['t_mma2'])}; "
                  f"takes {us(r['t2'])}")
            print(f"  quantize + combine: {gb(r['b_prep'] + r['b_comb'])} -> "
                  f"{us((r['b_prep'] + r['b_comb']) / DRAM_BPS)} + fixed {us(FIXED_PER_CHUNK_S)}")
            print(f"  predicted: {r['chunks']} x ({us(r['t13'])} + {us(r['t2'])} + {us(r['t_other'])}) = "
                  f"{us(r['total'])}; MMA utilization (useful/issued) {100 * r['useful_mma']:.0f}%; roofline "
                  f"(unique weights once, or useful FLOP at peak) {us(r['roof_s'])} = "
                  f"{100 * r['roof_s'] / r['total']:.0f}% of it")
    print("\n| T | chunks | touched experts | pairs/expert | config | CTAs FC1 / FC2 | DRAM bytes | DRAM time |"
          " MMA time | predicted | roofline |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        dram = r["chunks"] * (r["b_w13"] + r["b_act13"] + r["b_w2"] + r["b_act2"] + r["b_prep"] + r["b_comb"])
        mma = r["chunks"] * (r["t_mma13"] + r["t_mma2"])
        print(f"| {r['tokens']} | {r['chunks']} | {r['touched']:.0f} | {r['ppe']:.1f} | {r['cfg']} | "
              f"{r['chunks'] * r['ctas13']:,.0f} / {r['chunks'] * r['ctas2']:,.0f} | {gb(dram)} | {us(dram / DRAM_BPS)} | "
              f"{us(mma)} | {us(r['total'])} | {us(r['roof_s'])} |")


if __name__ == "__main__":
    main()

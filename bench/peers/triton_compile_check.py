#!/usr/bin/env python3
"""Compiles the Triton peer's kernels (triton_moe.py) for sm_90a without a GPU, for every block
config `Config.pick` gives the benchmark's shapes and token counts, and prints each kernel's
registers, stack (spill) bytes, MMA instructions and shared memory from its cubin (the cuobjdump
that Triton's wheel carries). Exit status 1 if a kernel spills.

    python3 bench/peers/triton_compile_check.py
"""
import os
import re
import subprocess
import sys
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import triton_moe

# The `mxmoe bench` layers (SPEC section 5): (name, K, I, E, k, activation) and the sweep's T.
SHAPES = [("kimi-k3", 3584, 3072, 896, 16, "Situ"), ("gpt-oss-120b", 2880, 2880, 128, 4, "SwigluBias"),
          ("deepseek-v3", 7168, 2048, 256, 8, "Swiglu")]
TOKENS = [1, 8, 32, 128, 1024, 4096, 16384]
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def usage(kernel):
    """(registers, stack bytes, MMA instructions) of a compiled kernel's cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        res = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", res)
    return int(m.group(1)), int(m.group(2)), len(re.findall(r"\bH[G]?MMA\b", sass))


def compile_kernel(fn, signature, constexprs, warps, stages):
    src = ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}}, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))


def main():
    ptrs = dict(order_ptr="*i32", tile_expert_ptr="*i32", tile_row_ptr="*i32", tile_count_ptr="*i32", w_ptr="*u8",
                ws_ptr="*u8")
    fc1_sig = dict(x_ptr="*bf16", **ptrs, gb_ptr="*fp32", ub_ptr="*fp32", a_ptr="*bf16", beta="fp32",
                   linear_beta="fp32", alpha="fp32", limit="fp32")
    fc2_sig = dict(a_ptr="*bf16", **ptrs, tw_ptr="*fp32", y_ptr="*bf16")
    spills = 0
    done = set()
    print(f"triton {triton.__version__}, sm_90a: kernel, shape, BLOCK_M/N/K, warps -> registers, stack bytes, MMA "
          "instructions, shared bytes")
    for name, k_dim, i_dim, e_count, top_k, act in SHAPES:
        for t in TOKENS:
            cfg = triton_moe.Config.pick(t, top_k, e_count)
            for kernel, sig, (block_n, block_k, warps), reduction, extra in (
                    (triton_moe._fc1_kernel, fc1_sig, cfg.fc1, k_dim,
                     dict(top_k=top_k, ACT=triton_moe.ACTIVATIONS[act], HAS_BIAS=act == "SwigluBias")),
                    (triton_moe._fc2_kernel, fc2_sig, cfg.fc2, i_dim, {})):
                bk = triton_moe._reduction_block(reduction, block_k)
                key = (kernel.__name__, name, cfg.block_m, block_n, bk, warps)
                if key in done:
                    continue
                done.add(key)
                constexprs = dict(hidden=k_dim, inter=i_dim, **extra, BM=cfg.block_m, BN=block_n, BK=bk,
                                  DOT=tl.bfloat16)
                compiled = compile_kernel(kernel, sig, constexprs, warps, cfg.stages)
                regs, stack, mma = usage(compiled)
                spills += stack > 0
                print(f"  {kernel.__name__:12s} {name:13s} {cfg.block_m:4d}/{block_n:3d}/{bk:3d} {warps} warps -> "
                      f"{regs:3d} registers, {stack:4d} stack, {mma:3d} MMA, {compiled.metadata.shared:6d} shared"
                      f"{'  SPILLS' if stack else ''}", flush=True)
    print(f"{len(done)} kernels, {spills} with spills")
    sys.exit(1 if spills else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The plain PyTorch MoE of SPEC section 7, timed side by side with mxmoe on the same inputs.

What a Hopper user without mxmoe would run: the MXFP4 experts dequantized once to bf16, and per
call
    sort the (token, slot) pairs by expert -> torch._grouped_mm (gate and up rows) -> the
    activation in fp32 -> torch._grouped_mm (down) -> the router-weighted sum per token.
It reads the directory that `mxmoe bench --dump DIR` wrote (manifest.json, each layer's raw
MXFP4 weights, each row's input and mxmoe's output for it, see bench/sweep.h), so both see the same weights, x, topk_ids and
topk_weights. Timing as mxmoe's: CUDA events around the call, 256 MB written before each run (cold
L2), warm-up runs, the median of the timed ones (one input per row: mxmoe rotates four of the same
shape; the weights, not the activations, dominate the bytes).

Sanity: its output against mxmoe's for the same row. They differ by design: this version keeps x
and the intermediate in bf16 where mxmoe quantizes both to MXFP8 (SPEC section 1); e4m3 rounds to
3 mantissa bits (about 2.5% RMS per quantized value), so the two agree to a few percent normwise:
4.4-4.7% for small layers of each shape against the CPU reference (this file's forward on torch's
CPU grouped_mm), where swapping gate and up gives 68-90%. More than AGREEMENT_NORMWISE is
reported as a mismatch (exit status 1).

    python3 bench/peers/torch_moe.py --dump DIR --csv torch.csv [--repeats 20] [--warmup 3]
"""
import argparse
import csv
import functools
import json
import math
import os
import struct
import sys
import time

import torch

AGREEMENT_NORMWISE = 0.15
FLUSH_BYTES = 256 << 20  # several times GH100's 50 MB of L2

# E2M1 code -> value (SPEC section 2): bit 3 the sign, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
DTYPES = {"U8": torch.uint8, "I32": torch.int32, "F32": torch.float32, "BF16": torch.bfloat16}
DTYPE_BYTES = {"U8": 1, "I32": 4, "F32": 4, "BF16": 2}


def progress(msg):
    print(msg, file=sys.stderr, flush=True)


class SafetensorsReader:
    """The tensors of one safetensors file (u64 header length, JSON header, data), read on demand."""

    def __init__(self, path):
        self.path = path
        self.file = open(path, "rb")
        (n,) = struct.unpack("<Q", self.file.read(8))
        self.header = json.loads(self.file.read(n))
        self.data_start = 8 + n

    def get(self, name):
        if name not in self.header:
            raise KeyError(f"{self.path}: no tensor '{name}'")
        info = self.header[name]
        begin, end = info["data_offsets"]
        buf = bytearray(end - begin)
        self.file.seek(self.data_start + begin)
        if self.file.readinto(buf) != len(buf):
            raise IOError(f"{self.path}: tensor '{name}' is truncated")
        return torch.frombuffer(buf, dtype=DTYPES[info["dtype"]]).view(info["shape"])

    def close(self):
        self.file.close()


def read_experts(path, tensors, num_experts):
    """Yields (expert, {name: CPU tensor}) from the raw weights file of `mxmoe bench --dump`: expert
    after expert, each expert's tensors in the manifest's order."""
    sizes = [DTYPE_BYTES[t["dtype"]] * math.prod(t["shape"]) for t in tensors]
    expected = num_experts * sum(sizes)
    if os.path.getsize(path) != expected:
        raise IOError(f"{path}: {os.path.getsize(path)} bytes, expected {expected} for {num_experts} experts")
    with open(path, "rb") as f:
        for e in range(num_experts):
            buf = bytearray(sum(sizes))
            if f.readinto(buf) != len(buf):
                raise IOError(f"{path}: expert {e} is truncated")
            out, offset = {}, 0
            for t, n in zip(tensors, sizes):
                out[t["name"]] = torch.frombuffer(buf, dtype=DTYPES[t["dtype"]], count=n // DTYPE_BYTES[t["dtype"]],
                                                  offset=offset).view(t["shape"])
                offset += n
            yield e, out


def dequantize_mxfp4(packed, scales, lut):
    """[rows, cols/2] packed E2M1 (element 2i in the low nibble) and [rows, cols/32] UE8M0 scales ->
    [rows, cols] bf16. Exact: every E2M1 value times a power of two fits bf16."""
    rows, half = packed.shape
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).view(rows, 2 * half).long()
    scale = torch.exp2(scales.float() - 127.0)
    scale = torch.where(scales == 0xFF, torch.full_like(scale, float("nan")), scale)  # UE8M0 NaN
    values = lut[codes].view(rows, -1, 32) * scale.unsqueeze(-1)
    return values.view(rows, 2 * half).to(torch.bfloat16)


class Layer:
    """One layer's experts on the GPU in bf16: w13 [E, 2I, K] (gate rows, then up rows), w2 [E, K, I]."""

    def __init__(self, spec, root, device):
        self.spec = spec
        self.num_experts = spec["num_experts"]
        self.hidden = spec["hidden"]
        self.intermediate = spec["intermediate"]
        self.top_k = spec["top_k"]
        self.activation = spec["activation"]
        e_count, k_dim, i_dim = self.num_experts, self.hidden, self.intermediate
        lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
        self.w13 = torch.empty(e_count, 2 * i_dim, k_dim, dtype=torch.bfloat16, device=device)
        self.w2 = torch.empty(e_count, k_dim, i_dim, dtype=torch.bfloat16, device=device)
        self.gate_bias = self.up_bias = None
        if spec["with_bias"]:
            self.gate_bias = torch.empty(e_count, i_dim, dtype=torch.float32, device=device)
            self.up_bias = torch.empty(e_count, i_dim, dtype=torch.float32, device=device)
        path = os.path.join(root, spec["weights"])
        for e, t in read_experts(path, spec["expert_tensors"], e_count):
            t = {name: v.to(device) for name, v in t.items()}
            self.w13[e, :i_dim] = dequantize_mxfp4(t["w1.weight_packed"], t["w1.weight_scale"], lut)
            self.w13[e, i_dim:] = dequantize_mxfp4(t["w3.weight_packed"], t["w3.weight_scale"], lut)
            self.w2[e] = dequantize_mxfp4(t["w2.weight_packed"], t["w2.weight_scale"], lut)
            if self.gate_bias is not None:
                self.gate_bias[e] = t["gate_bias"]
                self.up_bias[e] = t["up_bias"]
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def act(self, g, u, expert_ids):
        """The activation in fp32 (SPEC section 3); expert_ids picks each pair's biases."""
        s = self.spec
        if self.activation == "Situ":
            beta, lin = s["beta"], s["linear_beta"]
            return beta * torch.tanh(g / beta) * torch.sigmoid(g) * (lin * torch.tanh(u / lin))
        if self.activation == "Swiglu":
            return torch.nn.functional.silu(g) * u
        if self.activation == "SwigluBias":
            if self.gate_bias is not None:
                g = g + self.gate_bias[expert_ids]
                u = u + self.up_bias[expert_ids]
            limit = s["limit"]
            g = g.clamp(max=limit)
            u = u.clamp(min=-limit, max=limit)
            return g * torch.sigmoid(s["alpha"] * g) * (u + 1)
        raise NotImplementedError(f"activation {self.activation}: not in this peer")


def grouped_mm_fn():
    """(function, name): torch._grouped_mm, or its public spelling in newer releases."""
    for owner, name in ((torch, "_grouped_mm"), (torch.nn.functional, "grouped_mm")):
        fn = getattr(owner, name, None)
        if fn is not None:
            return fn, f"{owner.__name__}.{name}"
    raise RuntimeError(f"torch {torch.__version__} has neither torch._grouped_mm nor torch.nn.functional.grouped_mm")


def moe_forward(layer, x, topk_ids, topk_weights, grouped_mm):
    """out[t] = sum_j w[t, j] * W2[e] act(W1[e] x[t], W3[e] x[t]), e = topk_ids[t, j] (-1: none)."""
    t_count, k = topk_ids.shape
    e_count, i_dim = layer.num_experts, layer.intermediate
    ids = topk_ids.reshape(-1).long()
    valid = ids >= 0
    keys = torch.where(valid, ids, e_count)  # "no expert" pairs sort after every expert's
    order = torch.argsort(keys, stable=True)
    sorted_keys = keys[order]
    # Per-expert pair counts without a host sync (bincount would read the maximum back).
    counts = torch.zeros(e_count + 1, dtype=torch.int64, device=x.device).scatter_add_(0, keys, torch.ones_like(keys))
    # offs[e] ends expert e's rows; rows past offs[-1] (the "no expert" pairs) are left unwritten.
    offs = torch.cumsum(counts[:e_count], 0).to(torch.int32)
    token_of = order // k
    h = grouped_mm(x[token_of], layer.w13.transpose(-2, -1), offs=offs)  # [pairs, 2I]
    a = layer.act(h[:, :i_dim].float(), h[:, i_dim:].float(), sorted_keys.clamp(max=e_count - 1))
    y = grouped_mm(a.to(torch.bfloat16), layer.w2.transpose(-2, -1), offs=offs)  # [pairs, K]
    w = topk_weights.reshape(-1)[order]
    contrib = torch.where(valid[order].unsqueeze(-1), y.float() * w.unsqueeze(-1), 0.0)
    out = torch.zeros(t_count, layer.hidden, dtype=torch.float32, device=x.device)
    return out.index_add_(0, token_of, contrib).to(torch.bfloat16)


def time_calls(fn, warmup, repeats, flush):
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    ms = []
    for it in range(warmup + repeats):
        flush.fill_(it & 0xFF)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        if it >= warmup:
            ms.append(start.elapsed_time(stop))
    ms.sort()
    return 1e3 * ms[len(ms) // 2]


def compare(got, ref):
    """(max |got - ref| / RMS(ref), ||got - ref|| / ||ref||), in float64."""
    got, ref = got.double(), ref.double()
    diff = got - ref
    rms = ref.pow(2).mean().sqrt().item()
    max_err = diff.abs().max().item() / rms if rms > 0 else math.inf
    normwise = diff.norm().item() / ref.norm().item() if rms > 0 else math.inf
    return max_err, normwise


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dump", required=True, help="the directory `mxmoe bench --dump` wrote")
    ap.add_argument("--csv", required=True, help="where to write this peer's rows")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    if args.repeats < 1 or args.warmup < 0:
        ap.error("--repeats must be >= 1 and --warmup >= 0")
    if not torch.cuda.is_available():
        sys.exit("torch_moe.py: torch sees no CUDA device")
    manifest_path = os.path.join(args.dump, "manifest.json")
    if not os.path.exists(manifest_path):
        sys.exit(f"torch_moe.py: --dump {args.dump}: no manifest.json (run `mxmoe bench --dump {args.dump}` first)")
    with open(manifest_path) as f:
        manifest = json.load(f)
    device = torch.device("cuda", 0)
    grouped_mm, grouped_mm_name = grouped_mm_fn()
    print(f"peer: torch {torch.__version__}, {torch.cuda.get_device_name(device)}, bf16 weights, "
          f"{grouped_mm_name}, median of {args.repeats} after {args.warmup} warm-ups")
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    mismatches = 0
    with open(args.csv, "w", newline="") as out_file:
        out = csv.writer(out_file)
        out.writerow(["layer", "routing", "tokens", "peer", "us", "max_err_of_rms", "normwise_err", "agrees"])
        print(f"\n{'layer':13s} {'routing':13s} {'T':>6s} {'torch us':>10s} {'max|err|/rms':>12s} "
              f"{'normwise':>9s}  vs mxmoe")
        for spec in manifest["layers"]:
            t0 = time.time()
            progress(f"[torch {spec['name']}] dequantizing {spec['num_experts']} experts to bf16 ...")
            layer = Layer(spec, args.dump, device)
            progress(f"[torch {spec['name']}] weights ready in {time.time() - t0:.1f} s "
                     f"({torch.cuda.memory_allocated(device) / 1e9:.1f} GB on the device)")
            for row in manifest["rows"]:
                if row["layer"] != spec["name"]:
                    continue
                t0 = time.time()
                reader = SafetensorsReader(os.path.join(args.dump, row["input"]))
                x = reader.get("hidden_states").to(device)
                ids = reader.get("topk_ids").to(device)
                weights = reader.get("topk_weights").to(device)
                reader.close()
                call = functools.partial(moe_forward, layer, x, ids, weights, grouped_mm)
                result = call()
                us = time_calls(call, args.warmup, args.repeats, flush)
                max_err = normwise = None
                agrees = "no mxmoe output"
                if row.get("output"):
                    reader = SafetensorsReader(os.path.join(args.dump, row["output"]))
                    ref = reader.get("output").to(device)
                    reader.close()
                    max_err, normwise = compare(result.float(), ref)
                    ok = normwise <= AGREEMENT_NORMWISE
                    agrees = "ok" if ok else f"MISMATCH (normwise > {AGREEMENT_NORMWISE})"
                    mismatches += 0 if ok else 1
                print(f"{row['layer']:13s} {row['routing']:13s} {row['tokens']:6d} {us:10.1f} "
                      f"{'-' if max_err is None else f'{max_err:.3f}':>12s} "
                      f"{'-' if normwise is None else f'{normwise:.2e}':>9s}  {agrees}", flush=True)
                out.writerow([row["layer"], row["routing"], row["tokens"], "torch", f"{us:.2f}",
                              "" if max_err is None else f"{max_err:.4f}",
                              "" if normwise is None else f"{normwise:.4e}", agrees])
                out_file.flush()
                progress(f"[torch {row['layer']} {row['routing']} T={row['tokens']}] {time.time() - t0:.1f} s")
            layer = call = x = result = None  # the next layer's bf16 weights need the memory
            torch.cuda.empty_cache()
    print(f"wrote {args.csv}")
    if mismatches:
        sys.exit(f"torch_moe.py: {mismatches} row(s) disagree with mxmoe's output beyond {AGREEMENT_NORMWISE} normwise")


if __name__ == "__main__":
    main()

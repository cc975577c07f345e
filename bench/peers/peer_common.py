"""What the peers of `make bench` share (bench/peers/*.py): reading the directory `mxmoe bench --dump DIR`
wrote (manifest.json, each layer's raw MXFP4 weights, each row's input and mxmoe's output for it, see
bench/sweep.h), timing a call as mxmoe's bench times it, and the loop over the manifest's rows that
writes a peer's CSV and checks its output against mxmoe's.

Timing as mxmoe's: CUDA events around the call, 256 MB written before each run (cold L2), warm-up
runs, the median of the timed ones (one input per row: mxmoe rotates four of the same shape; the
weights, not the activations, dominate the bytes).

The peers differ from mxmoe by design: they keep x and the intermediate in bf16 where mxmoe quantizes
both to MXFP8 (SPEC section 1); e4m3 rounds to 3 mantissa bits (about 2.5% RMS per quantized value),
so a peer and mxmoe agree to a few percent normwise (4.4-4.7% for small layers of each shape against
the CPU reference), where swapping gate and up gives 68-90%. More than AGREEMENT_NORMWISE is reported
as a mismatch (exit status 1).
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


@functools.lru_cache(maxsize=None)
def _e2m1_table(device, dtype):
    return torch.tensor(E2M1_VALUES, dtype=dtype, device=device)


def dequantize_mxfp4(packed, scales, dtype=torch.bfloat16):
    """[rows, cols/2] packed E2M1 (element 2i in the low nibble) and [rows, cols/32] UE8M0 scales ->
    [rows, cols] in `dtype`. Exact in bf16 and wider: every E2M1 value times a power of two fits."""
    rows, half = packed.shape
    lut = _e2m1_table(packed.device, torch.float64 if dtype == torch.float64 else torch.float32)
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).view(rows, 2 * half).long()
    scale = torch.exp2(scales.to(lut.dtype) - 127.0)
    scale = torch.where(scales == 0xFF, torch.full_like(scale, float("nan")), scale)  # UE8M0 NaN
    values = lut[codes].view(rows, -1, 32) * scale.unsqueeze(-1)
    return values.view(rows, 2 * half).to(dtype)


def sort_pairs(topk_ids, num_experts):
    """(keys, order, counts) on the device without a host sync: each (token, slot) pair's expert, or
    num_experts for an id outside [0, E) (those pairs sort last); the pair ids t k + j sorted by key,
    stably; and the pairs per expert [E] (bincount would read the maximum back)."""
    ids = topk_ids.reshape(-1).long()
    keys = torch.where((ids >= 0) & (ids < num_experts), ids, num_experts)
    order = torch.argsort(keys, stable=True)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=ids.device)
    counts = counts.scatter_add_(0, keys, torch.ones_like(keys))[:num_experts]
    return keys, order, counts


def activation(spec, g, u, gate_bias=None, up_bias=None):
    """act(g, u) of SPEC section 3 for a layer of the manifest (`spec`), in g's dtype. The biases
    (SwigluBias only) are per pair, already gathered for the rows of g."""
    kind = spec["activation"]
    if kind == "Situ":
        beta, lin = spec["beta"], spec["linear_beta"]
        return beta * torch.tanh(g / beta) * torch.sigmoid(g) * (lin * torch.tanh(u / lin))
    if kind == "Swiglu":
        return torch.nn.functional.silu(g) * u
    if kind == "SwigluBias":
        if gate_bias is not None:
            g = g + gate_bias
            u = u + up_bias
        limit = spec["limit"]
        g = g.clamp(max=limit)
        u = u.clamp(min=-limit, max=limit)
        return g * torch.sigmoid(spec["alpha"] * g) * (u + 1)
    raise NotImplementedError(f"activation {kind}: not in this peer")


class PeerLayer:
    """What a peer's layer holds besides its weights: the shape and activation of a manifest layer
    (`spec`) and SwigluBias's biases [E, I] in fp32. A subclass stores expert e's weights in
    set_expert(e, tensors), from the checkpoint tensors of the dump (w{1,2,3}.weight_packed and
    weight_scale, gate_bias and up_bias), and calls this __init__ first."""

    def __init__(self, spec, device):
        self.spec = spec
        self.num_experts = spec["num_experts"]
        self.hidden = spec["hidden"]
        self.intermediate = spec["intermediate"]
        self.top_k = spec["top_k"]
        self.gate_bias = self.up_bias = None
        if spec["with_bias"]:
            self.gate_bias = torch.empty(self.num_experts, self.intermediate, dtype=torch.float32, device=device)
            self.up_bias = torch.empty_like(self.gate_bias)

    def set_biases(self, e, tensors):
        if self.gate_bias is not None:
            self.gate_bias[e] = tensors["gate_bias"]
            self.up_bias[e] = tensors["up_bias"]

    @classmethod
    def load(cls, spec, root, device):
        """The layer `spec` of a dump's manifest, its experts read from the dump under `root`."""
        layer = cls(spec, device)
        for e, t in read_experts(os.path.join(root, spec["weights"]), spec["expert_tensors"], spec["num_experts"]):
            layer.set_expert(e, {name: v.to(device) for name, v in t.items()})
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return layer


def time_calls(fn, warmup, repeats, flush):
    """Median µs of fn() between CUDA events, after `warmup` calls; `flush` is overwritten first."""
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


def time_graph(fn, warmup, repeats, flush):
    """time_calls for the replay of a CUDA graph that captured one fn() (on a side stream, as torch
    asks), so that the host's launch gaps drop out as they do for mxmoe's graph column."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # kernels compiled and buffers allocated before the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_calls(graph.replay, warmup, repeats, flush)


def compare(got, ref):
    """(max |got - ref| / RMS(ref), ||got - ref|| / ||ref||), in float64."""
    got, ref = got.double(), ref.double()
    diff = got - ref
    rms = ref.pow(2).mean().sqrt().item()
    max_err = diff.abs().max().item() / rms if rms > 0 else math.inf
    normwise = diff.norm().item() / ref.norm().item() if rms > 0 else math.inf
    return max_err, normwise


def parse_args(doc):
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--dump", required=True, help="the directory `mxmoe bench --dump` wrote")
    ap.add_argument("--csv", required=True, help="where to write this peer's rows")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    if args.repeats < 1 or args.warmup < 0:
        ap.error("--repeats must be >= 1 and --warmup >= 0")
    return args


def run_rows(peer, args, banner, load_layer, make_call, graph=False):
    """The loop of a peer's main: for each layer of the manifest, load_layer(spec, dump_dir, device);
    for each of its rows, make_call(layer, x, topk_ids, topk_weights) gives the call to check and time.
    Writes args.csv (the `us` column is the eager median; with graph=True a `graph_us` column too) and
    exits with status 1 when a row disagrees with mxmoe's output."""
    script = f"{peer}_moe.py"
    if not torch.cuda.is_available():
        sys.exit(f"{script}: torch sees no CUDA device")
    manifest_path = os.path.join(args.dump, "manifest.json")
    if not os.path.exists(manifest_path):
        sys.exit(f"{script}: --dump {args.dump}: no manifest.json (run `mxmoe bench --dump {args.dump}` first)")
    with open(manifest_path) as f:
        manifest = json.load(f)
    device = torch.device("cuda", 0)
    print(f"peer: {banner}, {torch.cuda.get_device_name(device)}, median of {args.repeats} after "
          f"{args.warmup} warm-ups{', eager and CUDA graph replay' if graph else ''}")
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    mismatches = 0
    with open(args.csv, "w", newline="") as out_file:
        out = csv.writer(out_file)
        out.writerow(["layer", "routing", "tokens", "peer", "us", "max_err_of_rms", "normwise_err", "agrees"]
                     + (["graph_us"] if graph else []))
        graph_head = f" {'graph us':>10s}" if graph else ""
        print(f"\n{'layer':13s} {'routing':13s} {'T':>6s} {peer + ' us':>10s}{graph_head} {'max|err|/rms':>12s} "
              f"{'normwise':>9s}  vs mxmoe")
        for spec in manifest["layers"]:
            t0 = time.time()
            progress(f"[{peer} {spec['name']}] loading {spec['num_experts']} experts ...")
            layer = load_layer(spec, args.dump, device)
            progress(f"[{peer} {spec['name']}] weights ready in {time.time() - t0:.1f} s "
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
                call = make_call(layer, x, ids, weights)
                result = call()
                us = time_calls(call, args.warmup, args.repeats, flush)
                graph_us = None
                if graph:
                    try:
                        graph_us = time_graph(call, args.warmup, args.repeats, flush)
                    except RuntimeError as e:  # a capture that fails leaves the column blank
                        progress(f"[{peer} {row['layer']} {row['routing']} T={row['tokens']}] no graph: {e}")
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
                graph_col = "" if not graph else f" {'-':>10s}" if graph_us is None else f" {graph_us:10.1f}"
                print(f"{row['layer']:13s} {row['routing']:13s} {row['tokens']:6d} {us:10.1f}{graph_col} "
                      f"{'-' if max_err is None else f'{max_err:.3f}':>12s} "
                      f"{'-' if normwise is None else f'{normwise:.2e}':>9s}  {agrees}", flush=True)
                out.writerow([row["layer"], row["routing"], row["tokens"], peer, f"{us:.2f}",
                              "" if max_err is None else f"{max_err:.4f}",
                              "" if normwise is None else f"{normwise:.4e}", agrees]
                             + (["" if graph_us is None else f"{graph_us:.2f}"] if graph else []))
                out_file.flush()
                progress(f"[{peer} {row['layer']} {row['routing']} T={row['tokens']}] {time.time() - t0:.1f} s")
            layer = call = x = result = None  # the next layer's weights need the memory
            torch.cuda.empty_cache()
    print(f"wrote {args.csv}")
    if mismatches:
        sys.exit(f"{script}: {mismatches} row(s) disagree with mxmoe's output beyond {AGREEMENT_NORMWISE} normwise")

#!/usr/bin/env python3
"""The plain PyTorch MoE of SPEC section 7, timed side by side with mxmoe on the same inputs.

What a Hopper user without mxmoe would run: the MXFP4 experts dequantized once to bf16, and per
call
    sort the (token, slot) pairs by expert -> torch._grouped_mm (gate and up rows) -> the
    activation in fp32 -> torch._grouped_mm (down) -> the router-weighted sum per token.
It reads the directory that `mxmoe bench --dump DIR` wrote, so both see the same weights, x,
topk_ids and topk_weights; timing and the check against mxmoe's output are peer_common.py's (this
file's forward on torch's CPU grouped_mm agreed with the CPU reference to 4.4-4.7% normwise on small
layers of each shape, where swapping gate and up gives 68-90%).

    python3 bench/peers/torch_moe.py --dump DIR --csv torch.csv [--repeats 20] [--warmup 3]
"""
import functools

import torch

from peer_common import PeerLayer, activation, dequantize_mxfp4, parse_args, run_rows, sort_pairs


class Layer(PeerLayer):
    """One layer's experts on the GPU in bf16: w13 [E, 2I, K] (gate rows, then up rows), w2 [E, K, I]."""

    def __init__(self, spec, device):
        super().__init__(spec, device)
        e_count, k_dim, i_dim = self.num_experts, self.hidden, self.intermediate
        self.w13 = torch.empty(e_count, 2 * i_dim, k_dim, dtype=torch.bfloat16, device=device)
        self.w2 = torch.empty(e_count, k_dim, i_dim, dtype=torch.bfloat16, device=device)

    def set_expert(self, e, t):
        i_dim = self.intermediate
        self.w13[e, :i_dim] = dequantize_mxfp4(t["w1.weight_packed"], t["w1.weight_scale"])
        self.w13[e, i_dim:] = dequantize_mxfp4(t["w3.weight_packed"], t["w3.weight_scale"])
        self.w2[e] = dequantize_mxfp4(t["w2.weight_packed"], t["w2.weight_scale"])
        self.set_biases(e, t)

    def act(self, g, u, expert_ids):
        """The activation in fp32 (SPEC section 3); expert_ids picks each pair's biases."""
        if self.gate_bias is None:
            return activation(self.spec, g, u)
        return activation(self.spec, g, u, self.gate_bias[expert_ids], self.up_bias[expert_ids])


def grouped_mm_fn():
    """(function, name): torch._grouped_mm, or its public spelling in newer releases."""
    for owner, name in ((torch, "_grouped_mm"), (torch.nn.functional, "grouped_mm")):
        fn = getattr(owner, name, None)
        if fn is not None:
            return fn, f"{owner.__name__}.{name}"
    raise RuntimeError(f"torch {torch.__version__} has neither torch._grouped_mm nor torch.nn.functional.grouped_mm")


def moe_forward(layer, x, topk_ids, topk_weights, grouped_mm):
    """out[t] = sum_j w[t, j] * W2[e] act(W1[e] x[t], W3[e] x[t]), e = topk_ids[t, j] (ids outside
    [0, E): nothing)."""
    t_count, k = topk_ids.shape
    e_count, i_dim = layer.num_experts, layer.intermediate
    keys, order, counts = sort_pairs(topk_ids, e_count)
    sorted_keys = keys[order]
    # offs[e] ends expert e's rows; rows past offs[-1] (the "no expert" pairs) are left unwritten.
    offs = torch.cumsum(counts, 0).to(torch.int32)
    token_of = order // k
    h = grouped_mm(x[token_of], layer.w13.transpose(-2, -1), offs=offs)  # [pairs, 2I]
    a = layer.act(h[:, :i_dim].float(), h[:, i_dim:].float(), sorted_keys.clamp(max=e_count - 1))
    y = grouped_mm(a.to(torch.bfloat16), layer.w2.transpose(-2, -1), offs=offs)  # [pairs, K]
    w = topk_weights.reshape(-1)[order]
    contrib = torch.where((sorted_keys < e_count).unsqueeze(-1), y.float() * w.unsqueeze(-1), 0.0)
    out = torch.zeros(t_count, layer.hidden, dtype=torch.float32, device=x.device)
    return out.index_add_(0, token_of, contrib).to(torch.bfloat16)


def main():
    args = parse_args(__doc__)
    grouped_mm, grouped_mm_name = grouped_mm_fn()
    run_rows("torch", args, f"torch {torch.__version__}, bf16 weights, {grouped_mm_name}", Layer.load,
             lambda layer, x, ids, weights: functools.partial(moe_forward, layer, x, ids, weights, grouped_mm))


if __name__ == "__main__":
    main()

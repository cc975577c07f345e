#include "dist_data.h"

#include <memory>

#include "mxmoe/synthetic.h"

namespace mxmoe::dist {

Status LoadSlice(const DistOptions& opts, const ParallelSlice& slice, int threads, ExpertSet* out) {
  if (!opts.checkpoint.empty()) {
    std::unique_ptr<Checkpoint> ckpt;
    MXMOE_RETURN_IF_ERROR(Checkpoint::Open(opts.checkpoint, &ckpt));
    // The shape was read from this config when the options were parsed; a checkpoint rewritten
    // since then would mix slices of two layers.
    const LayerShape& s = ckpt->config().shape;
    if (s.num_experts != opts.shape.num_experts || s.hidden != opts.shape.hidden ||
        s.intermediate != opts.shape.intermediate || s.top_k != opts.shape.top_k)
      return Status::Io(opts.checkpoint + "/config.json changed while mxmoe-dist was running");
    return ckpt->LoadLayer(opts.layer, slice, out);
  }
  SyntheticOptions syn;
  syn.seed = opts.seed;
  syn.num_threads = threads;
  return MakeSyntheticExperts(opts.shape, opts.activation, slice, syn, out);
}

Status LoadInput(const DistOptions& opts, HostMoeInput* out) {
  HostMoeInput in;
  if (!opts.input.empty()) {
    MXMOE_RETURN_IF_ERROR(ReadMoeInputFile(opts.input, opts.shape, &in));
  } else {
    // The seed offset of `mxmoe run`, so that both tools see the same tokens for one --seed.
    SyntheticInput syn;
    MakeSyntheticInput(opts.shape, opts.tokens, opts.routing, opts.seed + 1000003, &syn);
    in.num_tokens = syn.num_tokens;
    in.x_bf16 = std::move(syn.x_bf16);
    in.topk_ids = std::move(syn.topk_ids);
    in.topk_weights = std::move(syn.topk_weights);
  }
  if (in.num_tokens < 1) return Status::Invalid("--input " + opts.input + ": no tokens (T = 0): nothing to all-reduce");
  ExpertSet probe;  // the shape alone, for the call's checks
  probe.shape = opts.shape;
  std::vector<float> out_probe(1);
  MXMOE_RETURN_IF_ERROR(ValidateMoeCall(probe, in.View(), MoeOutput{OutputDType::kF32, out_probe.data()}, true));
  *out = std::move(in);
  return Status::Ok();
}

}  // namespace mxmoe::dist

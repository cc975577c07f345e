// mxmoe make-checkpoint / make-input: synthetic data in the layouts `mxmoe run` reads.
#include <cstdio>

#include "cli_args.h"
#include "commands.h"
#include "mxmoe/checkpoint.h"
#include "mxmoe/synthetic.h"

namespace mxmoe::cli {

namespace {

// The kind whose config spelling (HiddenActName) is `name`.
Status ActivationFromHiddenActName(const std::string& name, ActivationType* out) {
#define MXMOE_X(kind, value, gated, impl)                                        \
  if (HiddenActName(ActivationType::kind) && name == HiddenActName(ActivationType::kind)) { \
    *out = ActivationType::kind;                                                 \
    return Status::Ok();                                                         \
  }
  MXMOE_ACTIVATION_LIST(MXMOE_X)
#undef MXMOE_X
  return Status::Invalid("--activation = '" + name + "': expected situ, silu, gelu or gelu_pytorch_tanh");
}

}  // namespace

Status CmdMakeCheckpoint(const std::vector<std::string>& argv) {
  Args args;
  MXMOE_RETURN_IF_ERROR(Args::Parse(argv,
                                    {"out", "experts", "hidden", "intermediate", "top-k", "layers", "shards",
                                     "activation", "situ-beta", "situ-linear-beta", "seed"},
                                    {"text-config"}, &args));
  if (!args.Has("out")) return Status::Invalid("--out DIR is required");
  int64_t e, k, i, top, layers, shards;
  uint64_t seed;
  MXMOE_RETURN_IF_ERROR(args.Int("experts", 8, 1, 1 << 16, &e));
  MXMOE_RETURN_IF_ERROR(args.Int("hidden", 256, 1, 1 << 20, &k));
  MXMOE_RETURN_IF_ERROR(args.Int("intermediate", 256, 1, 1 << 20, &i));
  MXMOE_RETURN_IF_ERROR(args.Int("top-k", 2, 1, 1 << 16, &top));
  MXMOE_RETURN_IF_ERROR(args.Int("layers", 1, 1, 1024, &layers));
  MXMOE_RETURN_IF_ERROR(args.Int("shards", 1, 1, 1024, &shards));
  MXMOE_RETURN_IF_ERROR(args.U64("seed", 1, &seed));
  ModelConfig config;
  config.shape = LayerShape{e, k, i, top};
  MXMOE_RETURN_IF_ERROR(config.shape.Validate());
  const std::string hidden_act = args.Str("activation", "situ");
  MXMOE_RETURN_IF_ERROR(ActivationFromHiddenActName(hidden_act, &config.activation.type));
  ActParams& p = config.activation.params;
  MXMOE_RETURN_IF_ERROR(args.Float("situ-beta", p.beta, 0.0f, 1e30f, &p.beta));
  MXMOE_RETURN_IF_ERROR(args.Float("situ-linear-beta", p.linear_beta, 0.0f, 1e30f, &p.linear_beta));
  std::vector<ExpertSet> sets(layers);
  for (int64_t l = 0; l < layers; ++l) {
    SyntheticOptions opt;
    opt.seed = seed + static_cast<uint64_t>(l) * 7919;
    MXMOE_RETURN_IF_ERROR(MakeSyntheticExperts(config.shape, config.activation, ParallelSlice{}, opt, &sets[l]));
  }
  MXMOE_RETURN_IF_ERROR(
      WriteCheckpoint(args.Str("out"), config, sets, static_cast<int>(shards), args.Has("text-config")));
  std::printf("wrote %s: %lld layer(s), E=%lld K=%lld I=%lld k=%lld, %s, %lld shard(s)\n", args.Str("out").c_str(),
              (long long)layers, (long long)e, (long long)k, (long long)i, (long long)top, hidden_act.c_str(),
              (long long)shards);
  return Status::Ok();
}

Status CmdMakeInput(const std::vector<std::string>& argv) {
  Args args;
  MXMOE_RETURN_IF_ERROR(
      Args::Parse(argv, {"out", "checkpoint", "experts", "hidden", "top-k", "tokens", "routing", "seed"}, {}, &args));
  if (!args.Has("out")) return Status::Invalid("--out FILE is required");
  LayerShape shape;
  if (args.Has("checkpoint")) {
    if (args.Has("experts") || args.Has("hidden") || args.Has("top-k"))
      return Status::Invalid("--checkpoint gives the shape: drop --experts / --hidden / --top-k");
    ModelConfig config;
    MXMOE_RETURN_IF_ERROR(ReadModelConfig(args.Str("checkpoint") + "/" + kConfigFileName, &config));
    shape = config.shape;
  } else {
    MXMOE_RETURN_IF_ERROR(args.Int("experts", 8, 1, 1 << 16, &shape.num_experts));
    MXMOE_RETURN_IF_ERROR(args.Int("hidden", 256, 1, 1 << 20, &shape.hidden));
    MXMOE_RETURN_IF_ERROR(args.Int("top-k", 2, 1, 1 << 16, &shape.top_k));
    shape.intermediate = 32;  // not part of an input file
  }
  MXMOE_RETURN_IF_ERROR(shape.Validate());
  int64_t tokens;
  uint64_t seed;
  MXMOE_RETURN_IF_ERROR(args.Int("tokens", 4, 0, int64_t{1} << 24, &tokens));
  MXMOE_RETURN_IF_ERROR(args.U64("seed", 1, &seed));
  RoutingPattern routing;
  MXMOE_RETURN_IF_ERROR(RoutingPatternFromName(args.Str("routing", "uniform"), &routing));
  SyntheticInput input;
  MakeSyntheticInput(shape, tokens, routing, seed, &input);
  MoeInput view;
  view.num_tokens = input.num_tokens;
  view.x_bf16 = input.x_bf16.data();
  view.topk_ids = input.topk_ids.data();
  view.topk_weights = input.topk_weights.data();
  MXMOE_RETURN_IF_ERROR(WriteMoeInputFile(args.Str("out"), shape, view));
  std::printf("wrote %s: T=%lld K=%lld k=%lld (%s)\n", args.Str("out").c_str(), (long long)tokens,
              (long long)shape.hidden, (long long)shape.top_k, RoutingPatternName(routing));
  return Status::Ok();
}

}  // namespace mxmoe::cli

// mxmoe bench: the benchmark sweep of bench/ (SPEC sections 5 and 7, issue 5) on device 0, or its
// plan with --dry-run. Every option is checked before any work starts.
#include <cstdio>

#include "bench/sweep.h"
#include "cli_args.h"
#include "commands.h"

namespace mxmoe::cli {

namespace {

Status SelectLayers(const std::string& names, std::vector<bench::BenchLayer>* out) {
  const std::vector<bench::BenchLayer> all = bench::DefaultLayers();
  if (names == "all") {
    *out = all;
    return Status::Ok();
  }
  out->clear();
  for (const std::string& name : SplitList(names)) {
    bool found = false;
    for (const bench::BenchLayer& l : all) {
      if (l.name != name) continue;
      for (const bench::BenchLayer& chosen : *out)
        if (chosen.name == name) return Status::Invalid("--shapes: '" + name + "' given twice");
      out->push_back(l);
      found = true;
    }
    if (!found) {
      std::string known;
      for (const bench::BenchLayer& l : all) known += l.name + ", ";
      return Status::Invalid("--shapes: unknown shape '" + name + "' (expected " + known + "or all)");
    }
  }
  return Status::Ok();
}

}  // namespace

Status CmdBench(const std::vector<std::string>& argv) {
  Args args;
  MXMOE_RETURN_IF_ERROR(Args::Parse(argv,
                                    {"shapes", "tokens", "routing", "experts", "repeats", "warmup", "check-tokens",
                                     "seed", "threads", "csv", "dump"},
                                    {"no-graph", "dry-run"}, &args));
  bench::SweepOptions opt;
  MXMOE_RETURN_IF_ERROR(SelectLayers(args.Str("shapes", "all"), &opt.layers));
  if (args.Has("tokens")) {
    std::vector<int64_t> tokens;
    MXMOE_RETURN_IF_ERROR(args.IntList("tokens", {}, 1, int64_t{1} << 20, &tokens));
    for (bench::BenchLayer& l : opt.layers) l.tokens = tokens;
  }
  if (args.Has("routing")) {
    std::vector<RoutingPattern> routings;
    for (const std::string& name : SplitList(args.Str("routing"))) {
      RoutingPattern p;
      if (Status st = RoutingPatternFromName(name, &p); !st.ok()) return Status::Invalid("--routing: " + st.message());
      routings.push_back(p);
    }
    for (bench::BenchLayer& l : opt.layers) l.routings = routings;
  }
  int64_t experts = 0, repeats = 0, warmup = 0, check_tokens = 0, threads = 0;
  MXMOE_RETURN_IF_ERROR(args.Int("experts", 0, 1, 1 << 20, &experts));
  MXMOE_RETURN_IF_ERROR(args.Int("repeats", opt.repeats, 1, 100000, &repeats));
  MXMOE_RETURN_IF_ERROR(args.Int("warmup", opt.warmup, 0, 1000, &warmup));
  MXMOE_RETURN_IF_ERROR(args.Int("check-tokens", opt.check_tokens, 1, int64_t{1} << 20, &check_tokens));
  MXMOE_RETURN_IF_ERROR(args.Int("threads", 0, 0, 4096, &threads));
  MXMOE_RETURN_IF_ERROR(args.U64("seed", opt.seed, &opt.seed));
  opt.repeats = static_cast<int>(repeats);
  opt.warmup = static_cast<int>(warmup);
  opt.check_tokens = check_tokens;
  opt.threads = static_cast<int>(threads);
  opt.graph = !args.Has("no-graph");
  opt.csv = args.Str("csv");
  opt.dump_dir = args.Str("dump");
  for (bench::BenchLayer& l : opt.layers) {
    if (args.Has("experts")) l.shape.num_experts = experts;
    if (Status st = l.shape.Validate(); !st.ok()) return Status::Invalid("--experts: " + l.name + ": " + st.message());
  }
  // What a row's command repeats besides its shape, routing and T.
  for (const char* name : {"experts", "repeats", "warmup", "check-tokens", "seed"})
    if (args.Has(name)) opt.extra_args += std::string(" --") + name + " " + args.Str(name);
  if (!opt.graph) opt.extra_args += " --no-graph";

  int failures = 0;
  MXMOE_RETURN_IF_ERROR(args.Has("dry-run") ? bench::RunDry(opt, &failures) : bench::RunOnGpu(opt, &failures));
  if (!opt.csv.empty()) std::printf("wrote %s\n", opt.csv.c_str());
  if (!opt.dump_dir.empty()) std::printf("wrote %s/manifest.json and the files it lists\n", opt.dump_dir.c_str());
  if (failures) return Status::Internal(std::to_string(failures) + " failure(s) in the sweep (see the rows above)");
  return Status::Ok();
}

}  // namespace mxmoe::cli

#include "dist_options.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <memory>

#include "cli_args.h"
#include "mxmoe/checkpoint.h"

namespace mxmoe::dist {

const char kUsage[] = R"(mxmoe-dist: one MoE layer split over GPUs (expert or tensor parallel), combined with an
NCCL all-reduce and checked against the unsplit layer on one GPU (SPEC: shared/SPEC.md)

usage: mxmoe-dist [--ep N] [--tp N] [--nproc P] [--checkpoint DIR --layer L | --experts E]
                  [--input FILE | --tokens T --routing PATTERN] [--seed S] [--warmup W]
                  [--repeat R] [--tolerance X] [--output FILE]

The split
  --ep N         expert parallel: slice r holds experts [r*E/N, (r+1)*E/N) (N must divide E)
  --tp N         tensor parallel: slice r holds rows [r*I/N, (r+1)*I/N) of w1, w3 and the same
                 columns of w2 (I/N must be a multiple of 32)
                 Both together make N_ep * N_tp slices (slice s: ep rank s / N_tp, tp rank
                 s % N_tp). Without either: --ep over every process.
  --nproc P      processes, one GPU each (GPU i for rank i), started by mxmoe-dist itself
                 (default: N_ep * N_tp, or every visible GPU when neither --ep nor --tp is
                 given). P must divide the slices: each rank computes N_ep*N_tp/P consecutive
                 slices in turn and sums them on the host before the all-reduce, so one GPU
                 can compute every slice (--ep 4 --nproc 1).
  Under an external launcher (torchrun: RANK, WORLD_SIZE, LOCAL_RANK; Open MPI:
  OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK) each process is one rank, the GPU is the local
  rank, and NCCL_COMM_ID=<host>:<port> (rank 0's host, a free port) must be set so that
  the ranks find each other.

The layer and its input (the same on every rank: tokens are replicated)
  --checkpoint DIR  a Kimi-K3 checkpoint (config.json, *.safetensors); each rank reads only its
                    slice's tensors
  --layer L         the checkpoint's layer (default 0)
  --experts E       experts of the embedded synthetic layer of the Kimi-K3 shape (K 3584,
                    I 3072, k min(16, E), SiTU 4 / 25; default 896, the whole 15.7 GB layer)
  --seed S          seed of the synthetic layer and tokens (default 1; the same data as
                    `mxmoe run --seed S`)
  --input FILE      hidden_states / topk_ids / topk_weights, as `mxmoe run --input` reads them
  --tokens T        synthetic tokens (default 4)
  --routing P       uniform (default), one_expert, few_experts, with_invalid, heavy_hitters

The run
  --warmup W     untimed steps first (default 2)
  --repeat R     timed steps (default 10); a step is the rank's slices then the all-reduce
  --tolerance X  largest accepted max relative error against the unsplit layer (default 1e-5:
                 the two differ only in the order of fp32 additions)
  --output FILE  rank 0 writes the all-reduced output (F32 [T, K]) there

Each rank computes its slices' partial outputs in fp32 (CudaMoe), the ranks sum them with
ncclAllReduce (in place, on each rank's stream), and rank 0 also runs the unsplit layer on its
GPU and compares. Rank 0 prints, per rank, the median time of the MoE slices and of the
all-reduce (and the all-reduce's share of the step), the all-reduce alone after a barrier, and
the max relative error, max_i |sum_i - ref_i| / max(|ref_i|, RMS(ref)). NVLink multicast
(NVLS) is kept off: the ranks run with NCCL_NVLS_ENABLE=0.

Exit status: 0 when the sum matches; 1 when an argument is refused (one line naming it);
2 on device, NCCL or internal errors; 3 when the sum differs from the unsplit result.
)";

ParallelSlice DistOptions::Slice(int idx) const {
  ParallelSlice s;
  s.ep_size = ep;
  s.tp_size = tp;
  s.ep_rank = idx / tp;
  s.tp_rank = idx % tp;
  return s;
}

std::string DistOptions::DescribeSplit() const {
  std::string s = "EP " + std::to_string(ep) + " x TP " + std::to_string(tp) + " = " +
                  std::to_string(NumSlices()) + (NumSlices() == 1 ? " slice" : " slices") + " over " +
                  std::to_string(nproc) + (nproc == 1 ? " process" : " processes");
  s += " (" + std::to_string(SlicesPerRank()) + (SlicesPerRank() == 1 ? " slice" : " slices") + " each)";
  return s;
}

namespace {

// An integer environment variable in [min, max]; *found false when it is unset.
Status EnvInt(const char* name, int min, int max, bool* found, int* out) {
  const char* v = std::getenv(name);
  *found = v != nullptr;
  if (!*found) return Status::Ok();
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || errno == ERANGE || x < min || x > max)
    return Status::Invalid(std::string("environment variable ") + name + " = '" + v + "': expected an integer in [" +
                           std::to_string(min) + ", " + std::to_string(max) + "]");
  *out = static_cast<int>(x);
  return Status::Ok();
}

// One launcher's trio of variables: all of rank and size, or none (the local rank is optional
// and defaults to the rank, as on a single node).
Status ReadTrio(const char* rank_name, const char* size_name, const char* local_name, bool* found,
                ProcessRole* role) {
  bool has_rank = false, has_size = false, has_local = false;
  int rank = 0, size = 0, local = 0;
  MXMOE_RETURN_IF_ERROR(EnvInt(rank_name, 0, 1 << 20, &has_rank, &rank));
  MXMOE_RETURN_IF_ERROR(EnvInt(size_name, 1, 1 << 20, &has_size, &size));
  MXMOE_RETURN_IF_ERROR(EnvInt(local_name, 0, 1 << 20, &has_local, &local));
  *found = has_rank || has_size;
  if (!*found) return Status::Ok();
  if (!has_rank || !has_size)
    return Status::Invalid(std::string("environment: ") + (has_rank ? rank_name : size_name) + " is set but " +
                           (has_rank ? size_name : rank_name) + " is not (both, or neither)");
  if (rank >= size)
    return Status::Invalid(std::string("environment: ") + rank_name + " = " + std::to_string(rank) +
                           " is not below " + size_name + " = " + std::to_string(size));
  role->rank = rank;
  role->world = size;
  role->local_rank = has_local ? local : rank;
  role->source = std::string(rank_name) + "/" + size_name + (has_local ? std::string("/") + local_name : "");
  return Status::Ok();
}

}  // namespace

Status ReadProcessRole(ProcessRole* out) {
  ProcessRole role;
  bool found = false;
  MXMOE_RETURN_IF_ERROR(ReadTrio("MXMOE_DIST_RANK", "MXMOE_DIST_WORLD", "MXMOE_DIST_LOCAL_RANK", &found, &role));
  if (found) {
    bool has_fd = false;
    MXMOE_RETURN_IF_ERROR(EnvInt("MXMOE_DIST_ID_FD", 0, 1 << 20, &has_fd, &role.id_fd));
    if (!has_fd) return Status::Invalid("environment: MXMOE_DIST_RANK is set but MXMOE_DIST_ID_FD is not");
    role.kind = ProcessRole::kOwnRank;
    *out = role;
    return Status::Ok();
  }
  MXMOE_RETURN_IF_ERROR(ReadTrio("RANK", "WORLD_SIZE", "LOCAL_RANK", &found, &role));
  if (!found) MXMOE_RETURN_IF_ERROR(ReadTrio("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", &found, &role));
  if (found) {
    // NOTE: with NCCL_COMM_ID set, ncclGetUniqueId only encodes that address and rank 0's
    // ncclCommInitRank starts the bootstrap root there (NCCL src/init.cc), so no rank has to
    // hand an id to the others.
    const char* comm_id = std::getenv("NCCL_COMM_ID");
    if (comm_id == nullptr || *comm_id == '\0')
      return Status::Invalid("started as rank " + std::to_string(role.rank) + " of " + std::to_string(role.world) +
                             " (" + role.source + ") but NCCL_COMM_ID is not set: set it to <host>:<port> of "
                             "rank 0 and a free port, the same on every rank");
    role.kind = ProcessRole::kExternalRank;
  }
  *out = role;
  return Status::Ok();
}

Status ParseDistOptions(const std::vector<std::string>& argv, const ProcessRole& role, int visible_gpus,
                        DistOptions* out) {
  cli::Args args;
  MXMOE_RETURN_IF_ERROR(cli::Args::Parse(argv,
                                         {"ep", "tp", "nproc", "checkpoint", "layer", "experts", "seed", "input",
                                          "tokens", "routing", "warmup", "repeat", "tolerance", "output"},
                                         {}, &args));
  DistOptions o;
  int64_t ep, tp, nproc, experts, warmup, repeat;
  MXMOE_RETURN_IF_ERROR(args.Int("ep", 1, 1, 1 << 16, &ep));
  MXMOE_RETURN_IF_ERROR(args.Int("tp", 1, 1, 1 << 16, &tp));
  MXMOE_RETURN_IF_ERROR(args.Int("nproc", 1, 1, 1 << 16, &nproc));
  MXMOE_RETURN_IF_ERROR(args.Int("layer", 0, 0, 1 << 20, &o.layer));
  MXMOE_RETURN_IF_ERROR(args.Int("experts", kKimiK3Shape.num_experts, 1, 1 << 20, &experts));
  MXMOE_RETURN_IF_ERROR(args.U64("seed", 1, &o.seed));
  MXMOE_RETURN_IF_ERROR(args.Int("tokens", 4, 1, int64_t{1} << 24, &o.tokens));
  MXMOE_RETURN_IF_ERROR(args.Int("warmup", 2, 0, 100000, &warmup));
  MXMOE_RETURN_IF_ERROR(args.Int("repeat", 10, 1, 100000, &repeat));
  float tolerance;
  MXMOE_RETURN_IF_ERROR(args.Float("tolerance", 1e-5f, 0.0f, 1.0f, &tolerance));
  if (Status st = RoutingPatternFromName(args.Str("routing", "uniform"), &o.routing); !st.ok())
    return Status::Invalid("--routing: " + st.message());
  o.checkpoint = args.Str("checkpoint");
  o.input = args.Str("input");
  o.output = args.Str("output");
  o.warmup = static_cast<int>(warmup);
  o.repeat = static_cast<int>(repeat);
  o.tolerance = tolerance;

  const bool from_checkpoint = args.Has("checkpoint");
  if (args.Has("layer") && !from_checkpoint) return Status::Invalid("--layer needs --checkpoint");
  if (args.Has("experts") && from_checkpoint)
    return Status::Invalid("--experts applies to the synthetic layer only (the checkpoint's config.json gives E)");
  if (args.Has("input") && (args.Has("tokens") || args.Has("routing")))
    return Status::Invalid(std::string("--") + (args.Has("tokens") ? "tokens" : "routing") +
                           " applies to the synthetic input only (--input gives the tokens and their routing)");
  if (from_checkpoint && o.checkpoint.empty()) return Status::Invalid("--checkpoint: empty directory name");
  if (args.Has("input") && o.input.empty()) return Status::Invalid("--input: empty file name");
  if (args.Has("output") && o.output.empty()) return Status::Invalid("--output: empty file name");

  // ---- the layer's shape (config only) ----
  if (from_checkpoint) {
    std::unique_ptr<Checkpoint> ckpt;
    MXMOE_RETURN_IF_ERROR(Checkpoint::Open(o.checkpoint, &ckpt));
    o.shape = ckpt->config().shape;
    o.activation = ckpt->config().activation;
    o.layer_desc = "checkpoint " + o.checkpoint + ", layer " + std::to_string(o.layer);
  } else {
    o.shape = kKimiK3Shape;
    o.shape.num_experts = experts;
    o.shape.top_k = std::min(o.shape.top_k, experts);
    o.activation.type = ActivationType::Situ;
    o.layer_desc = "embedded synthetic layer, Kimi-K3 shape (seed " + std::to_string(o.seed) + ")";
  }
  MXMOE_RETURN_IF_ERROR(o.shape.Validate());

  // ---- the process count ----
  const bool split_given = args.Has("ep") || args.Has("tp");
  if (role.kind == ProcessRole::kLauncher) {
    if (args.Has("nproc")) o.nproc = static_cast<int>(nproc);
    else if (split_given) o.nproc = static_cast<int>(ep * tp);
    else if (visible_gpus > 0) o.nproc = visible_gpus;
    else return Status::Unsupported("no CUDA device is visible (mxmoe-dist runs one process per GPU)");
  } else {
    if (args.Has("nproc") && nproc != role.world)
      return Status::Invalid("--nproc " + std::to_string(nproc) + " but the launcher started " +
                             std::to_string(role.world) + " ranks (" + role.source + ")");
    o.nproc = role.world;
  }

  // ---- the split ----
  o.ep = static_cast<int>(split_given ? ep : o.nproc);
  o.tp = static_cast<int>(tp);
  if (o.shape.num_experts % o.ep != 0)
    return Status::Invalid("--ep " + std::to_string(o.ep) + " does not divide the layer's " +
                           std::to_string(o.shape.num_experts) + " experts" +
                           (split_given ? "" : " (--ep defaults to the process count)"));
  if (o.shape.intermediate % o.tp != 0 || (o.shape.intermediate / o.tp) % 32 != 0)
    return Status::Invalid("--tp " + std::to_string(o.tp) + ": I / tp = " + std::to_string(o.shape.intermediate) +
                           " / " + std::to_string(o.tp) +
                           " is not a multiple of 32 (every MX block of the intermediate must live on one rank)");
  if (int64_t{o.ep} * o.tp > (1 << 16)) return Status::Invalid("--ep x --tp: more than 65536 slices");
  if (o.NumSlices() % o.nproc != 0)
    return Status::Invalid("--nproc " + std::to_string(o.nproc) + " does not divide the " +
                           std::to_string(o.NumSlices()) + " slices (--ep " + std::to_string(o.ep) + " x --tp " +
                           std::to_string(o.tp) + "): every rank computes the same number of slices");

  // ---- the GPUs ----
  if (role.kind == ProcessRole::kLauncher) {
    if (visible_gpus == 0) return Status::Unsupported("no CUDA device is visible (mxmoe-dist runs one process per GPU)");
    if (o.nproc > visible_gpus)
      return Status::Invalid("--nproc " + std::to_string(o.nproc) + ": only " + std::to_string(visible_gpus) +
                             " GPU" + (visible_gpus == 1 ? " is" : "s are") +
                             " visible (one process per GPU; --nproc 1 computes every slice on one GPU in turn)");
  } else if (visible_gpus == 0) {
    return Status::Unsupported("no CUDA device is visible (rank " + std::to_string(role.rank) + ", " + role.source + ")");
  } else if (role.local_rank >= visible_gpus) {
    return Status::Invalid("local rank " + std::to_string(role.local_rank) + " (" + role.source + ") but only " +
                           std::to_string(visible_gpus) + " GPU(s) visible");
  }
  *out = std::move(o);
  return Status::Ok();
}

}  // namespace mxmoe::dist

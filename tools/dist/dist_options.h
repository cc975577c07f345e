// mxmoe-dist's options and its place in a run: which process this is (the launcher, one of the
// ranks it started, or a rank of an external launcher) and which slices of the layer each rank
// computes. Nothing here touches a GPU or NCCL, so every refusal happens before any work starts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mxmoe/moe.h"
#include "mxmoe/status.h"
#include "mxmoe/synthetic.h"

namespace mxmoe::dist {

extern const char kUsage[];

struct DistOptions {
  // The layer: a checkpoint's layer, or the embedded Kimi-K3-shaped synthetic layer.
  std::string checkpoint;  // empty: synthetic
  int64_t layer = 0;
  uint64_t seed = 1;
  // The input, replicated on every rank: a file, or synthetic tokens.
  std::string input;  // empty: synthetic
  int64_t tokens = 4;
  RoutingPattern routing = RoutingPattern::kUniform;
  // The split: ep * tp slices, slice s = (ep rank s / tp, tp rank s % tp); nproc processes, each
  // computing slices_per_rank consecutive slices.
  int ep = 1;
  int tp = 1;
  int nproc = 1;
  int warmup = 2;
  int repeat = 10;
  double tolerance = 1e-5;  // bound on the max relative error (see report.h)
  std::string output;       // rank 0 writes the all-reduced sum (F32) here when given

  // From the checkpoint's config.json or the synthetic default (and --experts).
  LayerShape shape;
  ActivationSpec activation;
  std::string layer_desc;

  int NumSlices() const { return ep * tp; }
  int SlicesPerRank() const { return NumSlices() / nproc; }
  // Slice `idx` of [0, NumSlices()).
  ParallelSlice Slice(int idx) const;
  // The slices rank `rank` computes: [rank * SlicesPerRank(), (rank + 1) * SlicesPerRank()).
  int FirstSlice(int rank) const { return rank * SlicesPerRank(); }
  // "EP 2 x TP 1 = 2 slices over 2 processes (1 slice each)"
  std::string DescribeSplit() const;
};

// How this process was started.
struct ProcessRole {
  enum Kind { kLauncher, kOwnRank, kExternalRank } kind = kLauncher;
  int rank = 0;
  int world = 1;
  int local_rank = 0;  // the GPU index, among the visible ones
  int id_fd = -1;      // kOwnRank: the pipe the launcher writes the ncclUniqueId to
  std::string source;  // which variables said so ("RANK/WORLD_SIZE/LOCAL_RANK", ...)
};

// Our own ranks first (MXMOE_DIST_RANK, MXMOE_DIST_WORLD, MXMOE_DIST_ID_FD, set by the
// launcher), then torchrun's RANK / WORLD_SIZE / LOCAL_RANK, then Open MPI's
// OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK; a launcher when none is set. Malformed or
// inconsistent values are refused by name.
Status ReadProcessRole(ProcessRole* out);

// Parses argv (without the program name) and fills the layer's shape and activation (a
// checkpoint's config.json is read; its tensors are not). Every flag is checked against the
// shape and the role: --ep must divide E, I / --tp must be a multiple of 32, the process count
// must divide the slices; a launcher may not start more ranks than `visible_gpus` (what the CUDA
// runtime sees here), a rank's GPU (its local rank) must be one of them.
Status ParseDistOptions(const std::vector<std::string>& argv, const ProcessRole& role,
                        int visible_gpus, DistOptions* out);

}  // namespace mxmoe::dist

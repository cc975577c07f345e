// One rank of a distributed run: its slices on its GPU, the NCCL all-reduce of the partial
// outputs, the timings, and on rank 0 the unsplit layer and the report.
#pragma once

#include <nccl.h>

#include "dist_options.h"

namespace mxmoe::dist {

// Joins the communicator of role.world ranks named by `id` as role.rank on GPU role.local_rank,
// and runs opts' slices for this rank (see mxmoe-dist --help). *sum_matches is false when rank 0
// found the all-reduced sum off the unsplit layer's output by more than opts.tolerance, or the
// ranks holding different sums (other ranks leave it true).
Status RunRank(const DistOptions& opts, const ProcessRole& role, const ncclUniqueId& id, bool* sum_matches);

}  // namespace mxmoe::dist

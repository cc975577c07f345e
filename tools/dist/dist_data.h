// The data of a distributed run, the same on every rank: the layer (one slice, or the whole
// layer for rank 0's reference) and the replicated input.
#pragma once

#include "dist_options.h"
#include "mxmoe/checkpoint.h"

namespace mxmoe::dist {

// `slice` of the checkpoint's layer (only that slice's tensors are read) or of the synthetic
// layer; ParallelSlice{} gives the unsplit layer. `threads` host threads build a synthetic one.
Status LoadSlice(const DistOptions& opts, const ParallelSlice& slice, int threads, ExpertSet* out);

// The input file, or the synthetic tokens `mxmoe run` makes from the same seed; checked
// against the shape (every id in [-1, E)).
Status LoadInput(const DistOptions& opts, HostMoeInput* out);

}  // namespace mxmoe::dist

// The CUDA router in a build without CUDA: it says so (the CPU KimiK3Route is always there).
#include "mxmoe/router.h"

namespace mxmoe {

Status KimiK3RouteCuda(const void*, RouterLogits, const float*, int64_t, int64_t, const RouterOptions&, int32_t*,
                       float*, int, void*) {
  return Status::Unsupported("this build of mxmoe has no CUDA backend: KimiK3RouteCuda needs it (KimiK3Route "
                             "runs on the CPU)");
}

}  // namespace mxmoe

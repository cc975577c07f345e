// ReadModelConfig on arbitrary config.json bytes: refused, or a shape that validates and activation
// parameters of the right count.
#include "fuzz_util.h"
#include "mxmoe/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mxmoe;
  const std::string path = fuzz::WriteScratch("config.json", data, size);
  ModelConfig config;
  if (!ReadModelConfig(path, &config).ok()) return 0;
  if (!config.shape.Validate().ok()) fuzz::Fail("an accepted config has an invalid shape");
  if (!config.per_expert_global.empty() &&
      static_cast<int64_t>(config.per_expert_global.size()) != config.shape.num_experts)
    fuzz::Fail("per-expert parameters do not match num_experts");
  return 0;
}

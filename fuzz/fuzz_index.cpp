// Checkpoint::Open with a valid config.json and arbitrary model.safetensors.index.json bytes, then
// LoadLayer (the shards named there do not exist, or are the scratch files themselves): refused or
// loaded, never a crash and never a path outside the checkpoint directory.
#include <filesystem>

#include "fuzz_util.h"
#include "mxmoe/checkpoint.h"

namespace {
const char kConfig[] =
    R"({"routed_expert_hidden_size": 32, "moe_intermediate_size": 32, "num_experts": 2,
        "num_experts_per_token": 1, "hidden_act": "situ"})";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mxmoe;
  static const bool config_written = [] {
    fuzz::WriteScratch("config.json", reinterpret_cast<const uint8_t*>(kConfig), sizeof(kConfig) - 1);
    return true;
  }();
  (void)config_written;
  fuzz::WriteScratch("model.safetensors.index.json", data, size);
  std::unique_ptr<Checkpoint> ckpt;
  if (!Checkpoint::Open(fuzz::ScratchDir().string(), &ckpt).ok()) return 0;
  ExpertSet experts;
  if (ckpt->LoadLayer(0, ParallelSlice{}, &experts).ok() && !experts.Validate().ok())
    fuzz::Fail("LoadLayer returned an invalid expert set");
  return 0;
}

// The CPU operator's argument validation: shapes, slices, activation kind and routing drawn from
// the fuzzer's bytes, on tiny synthetic layers. A call is refused or computes; ReferenceMoe and
// CpuMoe agree bitwise whenever they compute, and ids outside [-1, E) are always refused.
#include <cstring>
#include <vector>

#include "fuzz_util.h"
#include "mxmoe/moe.h"
#include "mxmoe/synthetic.h"

namespace {

struct Bytes {
  const uint8_t* p;
  size_t n;
  uint8_t Next() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  int32_t Next32() {
    int32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | Next();
    return v;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mxmoe;
  Bytes b{data, size};
  LayerShape shape;
  shape.num_experts = static_cast<int8_t>(b.Next()) % 9;  // may be <= 0
  shape.hidden = (static_cast<int8_t>(b.Next()) % 5) * 16;
  shape.intermediate = (static_cast<int8_t>(b.Next()) % 5) * 16;
  shape.top_k = static_cast<int8_t>(b.Next()) % 5;
  ParallelSlice slice;
  slice.tp_size = static_cast<int8_t>(b.Next()) % 4;
  slice.tp_rank = static_cast<int8_t>(b.Next()) % 4;
  slice.ep_size = static_cast<int8_t>(b.Next()) % 4;
  slice.ep_rank = static_cast<int8_t>(b.Next()) % 4;
  ActivationSpec act;
  act.type = static_cast<ActivationType>(static_cast<int8_t>(b.Next()) % 14);
  act.params.beta = static_cast<float>(static_cast<int8_t>(b.Next())) / 8;
  const bool shape_ok = shape.Validate().ok() && slice.Validate(shape).ok();
  SyntheticOptions opt;
  opt.num_threads = 1;
  opt.seed = b.Next();
  ExpertSet experts;
  const Status made = MakeSyntheticExperts(shape, act, slice, opt, &experts);
  const bool layer_ok = shape_ok && IsImplemented(act.type) &&
                        (act.type != ActivationType::Situ || act.params.beta > 0);
  if (made.ok() && !layer_ok) fuzz::Fail("an invalid layer was accepted");
  if (!made.ok()) return 0;

  const int64_t t = b.Next() % 4, k = shape.top_k, K = shape.hidden;
  std::vector<uint16_t> x(t * K);
  for (auto& v : x) v = static_cast<uint16_t>(b.Next() | (b.Next() << 8));
  std::vector<int32_t> ids(t * k);
  bool ids_ok = true;
  for (auto& id : ids) {
    const uint8_t c = b.Next();
    id = c < 200 ? static_cast<int32_t>(c % (shape.num_experts + 1)) - 1 : b.Next32();
    ids_ok = ids_ok && id >= -1 && id < shape.num_experts;
  }
  std::vector<float> w(t * k);
  for (auto& v : w) v = static_cast<float>(b.Next()) / 64;
  MoeInput in;
  in.num_tokens = t;
  in.x_bf16 = b.Next() % 8 ? x.data() : nullptr;
  in.topk_ids = ids.data();
  in.topk_weights = w.data();
  std::vector<float> y1(t * K), y2(t * K);
  const Status s1 = ReferenceMoe(experts, in, MoeOutput{OutputDType::kF32, y1.data()});
  const Status s2 = CpuMoe(experts, in, MoeOutput{OutputDType::kF32, y2.data()}, 2);
  if (s1.ok() != s2.ok()) fuzz::Fail("reference and CPU backend disagree on refusing");
  if (s1.ok() && !ids_ok && t > 0) fuzz::Fail("an id outside [-1, E) was accepted");
  if (s1.ok() && !y1.empty() && std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)) != 0)
    fuzz::Fail("CPU backend differs from the reference");
  return 0;
}

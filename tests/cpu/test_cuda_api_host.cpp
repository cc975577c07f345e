// The CUDA API on a machine without a GPU (CI, this suite): every entry point answers with a Status,
// never a crash, whether the build has the CUDA backend or the stub.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/moe_run.h"
#include "mxmoe/cuda.h"

namespace mxmoe {
namespace {

TEST(CudaApiHost, CreateWithoutAGpuIsRefusedWithAReason) {
  if (!CudaDevices().empty()) GTEST_SKIP() << "a GPU is present: the GPU suite covers CudaMoe::Create";
  const ExpertSet set = test::SyntheticSet({4, 64, 64, 2}, test::Act(ActivationType::Situ), 1);
  std::unique_ptr<CudaMoe> moe;
  const Status st = CudaMoe::Create(set, 0, &moe);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.ToString();
  EXPECT_FALSE(st.message().empty());
  EXPECT_FALSE(moe);
  if (CudaBuilt()) {
    // Arguments are checked before the device is looked for.
    EXPECT_EQ(CudaMoe::Create(set, 0, nullptr).code(), StatusCode::kInvalidArgument);
    ExpertSet bad = set;
    bad.experts.pop_back();
    const Status refused = CudaMoe::Create(bad, 0, &moe);
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.ToString();
    EXPECT_NE(refused.message().find("experts"), std::string::npos) << refused.message();
  } else {
    EXPECT_TRUE(CudaArchsCompiled().empty());
  }
}

}  // namespace
}  // namespace mxmoe

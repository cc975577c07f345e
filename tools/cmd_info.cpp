// mxmoe info: the build and the devices seen.
#include <cstdio>

#include "cli_args.h"
#include "commands.h"
#include "mxmoe/activation.h"
#include "mxmoe/cuda.h"

namespace mxmoe::cli {

Status CmdInfo(const std::vector<std::string>& argv) {
  Args args;
  MXMOE_RETURN_IF_ERROR(Args::Parse(argv, {}, {}, &args));
  std::printf("mxmoe %s\n", MXMOE_VERSION);
  std::printf("backends: cpu (reference, cpu)%s\n", CudaBuilt() ? ", cuda" : "");
  std::printf("cuda: %s\n", CudaBuilt() ? ("built for " + CudaArchsCompiled()).c_str() : "not built");
  std::printf("activations implemented:");
#define MXMOE_X(name, value, gated, impl) \
  if (impl) std::printf(" %s(%d)", #name, value);
  MXMOE_ACTIVATION_LIST(MXMOE_X)
#undef MXMOE_X
  std::printf("\n");
  const auto devices = CudaDevices();
  if (devices.empty()) std::printf("devices: none seen (CPU backend only)\n");
  for (const CudaDeviceInfo& d : devices) {
    std::printf("device %d: %s, compute capability %d.%d, %d SMs, %.1f GiB\n", d.index, d.name.c_str(),
                d.major, d.minor, d.sm_count, static_cast<double>(d.total_memory) / (1 << 30));
  }
  return Status::Ok();
}

}  // namespace mxmoe::cli

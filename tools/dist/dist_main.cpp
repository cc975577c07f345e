// mxmoe-dist: one MoE layer split over GPUs by expert or tensor parallelism, the partial outputs
// summed with an NCCL all-reduce and checked against the unsplit layer (mxmoe-dist --help).
//
// One program, three roles: run plainly it is the launcher (checks every argument, then starts
// one rank per GPU, this program again); started by it, or by torchrun / mpirun, it is a rank.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dist_data.h"
#include "dist_options.h"
#include "launcher.h"
#include "mxmoe/cuda.h"
#include "rank.h"

namespace {

int ExitStatus(const mxmoe::Status& st) {
  const bool refused = st.code() == mxmoe::StatusCode::kInvalidArgument ||
                       st.code() == mxmoe::StatusCode::kIoError ||
                       st.code() == mxmoe::StatusCode::kUnsupported;
  return refused ? 1 : 2;
}

int Fail(const mxmoe::dist::ProcessRole& role, const mxmoe::Status& st) {
  if (role.kind == mxmoe::dist::ProcessRole::kLauncher)
    std::fprintf(stderr, "mxmoe-dist: %s\n", st.ToString().c_str());
  else
    std::fprintf(stderr, "mxmoe-dist rank %d: %s\n", role.rank, st.ToString().c_str());
  return ExitStatus(st);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mxmoe::dist;
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  ProcessRole role;
  mxmoe::Status st = ReadProcessRole(&role);
  if (!st.ok()) return Fail(role, st);
  const int visible_gpus = static_cast<int>(mxmoe::CudaDevices().size());
  DistOptions opts;
  st = ParseDistOptions(args, role, visible_gpus, &opts);
  if (!st.ok()) return Fail(role, st);

  if (role.kind == ProcessRole::kLauncher) {
    if (!opts.input.empty()) {  // refused here once, rather than by every rank
      mxmoe::HostMoeInput probe;
      st = LoadInput(opts, &probe);
      if (!st.ok()) return Fail(role, st);
    }
    return LaunchRanks(opts, argv);
  }

  // A rank. The launcher set this already; an external launcher may not have.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  ncclUniqueId id;
  if (role.kind == ProcessRole::kOwnRank) {
    st = ReadUniqueIdFromLauncher(role.id_fd, &id);
  } else {
    // NCCL_COMM_ID is set (ReadProcessRole checked): the id is that address on every rank.
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      st = mxmoe::Status::Cuda(std::string("NCCL ncclGetUniqueId (NCCL_COMM_ID=") + std::getenv("NCCL_COMM_ID") +
                               "): " + ncclGetErrorString(r));
  }
  if (!st.ok()) return Fail(role, st);
  bool sum_matches = true;
  st = RunRank(opts, role, id, &sum_matches);
  if (!st.ok()) return Fail(role, st);
  return sum_matches ? 0 : 3;
}

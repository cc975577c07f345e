// mxmoe-dist's own launcher: one child process per rank (this program again, through exec), the
// ncclUniqueId handed to each through a pipe, and the ranks' exit statuses folded into one.
#pragma once

#include <nccl.h>

#include "dist_options.h"

namespace mxmoe::dist {

// Starts opts.nproc ranks with the same arguments (`argv` is main's) and waits for them. When a
// rank fails the others are stopped (SIGTERM, then SIGKILL after 10 s): they would wait in a
// collective forever. Returns the exit status of the run: 0, or the first failing rank's.
int LaunchRanks(const DistOptions& opts, char** argv);

// A rank started by LaunchRanks: the id from the launcher's pipe (read whole, then closed).
Status ReadUniqueIdFromLauncher(int fd, ncclUniqueId* out);

}  // namespace mxmoe::dist

#pragma once

#include <string>
#include <vector>

#include "mxmoe/status.h"

namespace mxmoe::cli {

Status CmdRun(const std::vector<std::string>& args);
Status CmdInfo(const std::vector<std::string>& args);
Status CmdMakeCheckpoint(const std::vector<std::string>& args);
Status CmdMakeInput(const std::vector<std::string>& args);
Status CmdBench(const std::vector<std::string>& args);

}  // namespace mxmoe::cli

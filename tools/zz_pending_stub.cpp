// TEMPORARY while src/io lands: replaced by cmd_run.cpp and cmd_make.cpp.
#include "commands.h"
namespace mxmoe::cli {
Status CmdRun(const std::vector<std::string>&) { return Status::Unsupported("pending"); }
Status CmdMakeCheckpoint(const std::vector<std::string>&) { return Status::Unsupported("pending"); }
Status CmdMakeInput(const std::vector<std::string>&) { return Status::Unsupported("pending"); }
}

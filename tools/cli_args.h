// A small strict command-line parser: `--name value` or `--name=value`, flags without values, no
// positional arguments after the subcommand. Unknown options and malformed numbers are errors.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "mxmoe/status.h"

namespace mxmoe::cli {

// "a,b,,c" -> {"a", "b", "", "c"}: the items of a list-valued option.
std::vector<std::string> SplitList(const std::string& value);

class Args {
 public:
  // `valued` take a value, `flags` take none; anything else is refused by name.
  static Status Parse(const std::vector<std::string>& argv, const std::set<std::string>& valued,
                      const std::set<std::string>& flags, Args* out);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Str(const std::string& name, const std::string& fallback = "") const;
  Status Int(const std::string& name, int64_t fallback, int64_t min, int64_t max, int64_t* out) const;
  // A comma-separated list of integers in [min, max] ("1,8,32"); `fallback` when not given.
  Status IntList(const std::string& name, const std::vector<int64_t>& fallback, int64_t min, int64_t max,
                 std::vector<int64_t>* out) const;
  Status U64(const std::string& name, uint64_t fallback, uint64_t* out) const;
  // A finite number in (min, max].
  Status Float(const std::string& name, float fallback, float min, float max, float* out) const;

 private:
  // The option's value, or null when it was not given.
  const std::string* Find(const std::string& name) const;

  std::map<std::string, std::string> values_;
};

}  // namespace mxmoe::cli

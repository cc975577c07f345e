#include "cli_args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace mxmoe::cli {

std::vector<std::string> SplitList(const std::string& value) {
  std::vector<std::string> items;
  size_t pos = 0;
  while (true) {
    const size_t comma = value.find(',', pos);
    items.push_back(value.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) return items;
    pos = comma + 1;
  }
}

Status Args::Parse(const std::vector<std::string>& argv, const std::set<std::string>& valued,
                   const std::set<std::string>& flags, Args* out) {
  Args a;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.size() < 3)
      return Status::Invalid("unexpected argument '" + arg + "' (options start with --; see --help)");
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (a.values_.count(name)) return Status::Invalid("option --" + name + " given twice");
    if (flags.count(name)) {
      if (has_value) return Status::Invalid("option --" + name + " takes no value");
      a.values_[name] = "1";
    } else if (valued.count(name)) {
      if (!has_value) {
        if (i + 1 >= argv.size()) return Status::Invalid("option --" + name + " needs a value");
        value = argv[++i];
      }
      a.values_[name] = value;
    } else {
      return Status::Invalid("unknown option --" + name + " (see --help)");
    }
  }
  *out = std::move(a);
  return Status::Ok();
}

const std::string* Args::Find(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

std::string Args::Str(const std::string& name, const std::string& fallback) const {
  const std::string* v = Find(name);
  return v ? *v : fallback;
}

namespace {

// `s`, the value (or one item of the value) of --name, as an integer in [min, max].
Status ParseInt(const std::string& name, const std::string& s, int64_t min, int64_t max, int64_t* out) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE)
    return Status::Invalid("--" + name + " = '" + s + "' is not an integer");
  if (v < min || v > max)
    return Status::Invalid("--" + name + " = " + s + " is outside [" + std::to_string(min) + ", " +
                           std::to_string(max) + "]");
  *out = v;
  return Status::Ok();
}

}  // namespace

Status Args::Int(const std::string& name, int64_t fallback, int64_t min, int64_t max, int64_t* out) const {
  const std::string* value = Find(name);
  if (value == nullptr) {
    *out = fallback;
    return Status::Ok();
  }
  return ParseInt(name, *value, min, max, out);
}

Status Args::IntList(const std::string& name, const std::vector<int64_t>& fallback, int64_t min, int64_t max,
                     std::vector<int64_t>* out) const {
  const std::string* value = Find(name);
  if (value == nullptr) {
    *out = fallback;
    return Status::Ok();
  }
  std::vector<int64_t> items;
  for (const std::string& item : SplitList(*value)) {
    int64_t v = 0;
    MXMOE_RETURN_IF_ERROR(ParseInt(name, item, min, max, &v));
    items.push_back(v);
  }
  *out = std::move(items);
  return Status::Ok();
}

Status Args::U64(const std::string& name, uint64_t fallback, uint64_t* out) const {
  const std::string* value = Find(name);
  if (value == nullptr) {
    *out = fallback;
    return Status::Ok();
  }
  const std::string& s = *value;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || s[0] == '-' || *end != '\0' || errno == ERANGE)
    return Status::Invalid("--" + name + " = '" + s + "' is not a non-negative integer");
  *out = v;
  return Status::Ok();
}

Status Args::Float(const std::string& name, float fallback, float min, float max, float* out) const {
  const std::string* value = Find(name);
  if (value == nullptr) {
    *out = fallback;
    return Status::Ok();
  }
  const std::string& s = *value;
  char* end = nullptr;
  errno = 0;
  const float v = std::strtof(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    return Status::Invalid("--" + name + " = '" + s + "' is not a finite number");
  if (!(v > min && v <= max))
    return Status::Invalid("--" + name + " = " + s + " is outside (" + std::to_string(min) + ", " +
                           std::to_string(max) + "]");
  *out = v;
  return Status::Ok();
}

}  // namespace mxmoe::cli

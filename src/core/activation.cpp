#include <cctype>
#include <string>

#include "mxmoe/activation.h"

namespace mxmoe {

const char* ActivationName(ActivationType t) {
  switch (t) {
#define MXMOE_X(name, value, gated, impl) \
  case ActivationType::name:              \
    return #name;
    MXMOE_ACTIVATION_LIST(MXMOE_X)
#undef MXMOE_X
  }
  return "InvalidType";
}

std::optional<ActivationType> ActivationFromName(std::string_view name) {
  auto equal_ci = [](std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(a[i])) !=
          std::tolower(static_cast<unsigned char>(b[i])))
        return false;
    }
    return true;
  };
#define MXMOE_X(n, value, gated, impl) \
  if (equal_ci(name, #n)) return ActivationType::n;
  MXMOE_ACTIVATION_LIST(MXMOE_X)
#undef MXMOE_X
  return std::nullopt;
}

Status ActivationFromInt(int64_t value, ActivationType* out) {
  switch (value) {
#define MXMOE_X(name, v, gated, impl) \
  case v:                             \
    *out = ActivationType::name;      \
    return Status::Ok();
    MXMOE_ACTIVATION_LIST(MXMOE_X)
#undef MXMOE_X
  }
  return Status::Invalid("activation_type = " + std::to_string(value) +
                         " is not an ActivationType (0..11, FlashInfer numbering)");
}

Status CheckActivationSupported(ActivationType t) {
  if (IsImplemented(t)) return Status::Ok();
  const int v = static_cast<int>(t);
  std::string why = IsGated(t) ? "is not implemented" : "is not a gated activation";
  return Status::Unsupported(std::string("activation ") + ActivationName(t) + " (" +
                             std::to_string(v) + ") " + why +
                             "; implemented: Situ, Swiglu, SwigluBias, Geglu, GegluTanh");
}

}  // namespace mxmoe

// Activation kinds: the single source of truth, numbered as FlashInfer's ActivationType so that the
// values cross every API unchanged (SPEC section 3). Everything else (names, the gated predicate,
// what the kernels implement, the Python IntEnum) is derived from MXMOE_ACTIVATION_LIST.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "mxmoe/status.h"

namespace mxmoe {

//   X(name, value, gated, implemented)
#define MXMOE_ACTIVATION_LIST(X)  \
  X(Gelu, 0, false, false)        \
  X(Relu, 1, false, false)        \
  X(Silu, 2, false, false)        \
  X(Swiglu, 3, true, true)        \
  X(Geglu, 4, true, true)         \
  X(SwigluBias, 5, true, true)    \
  X(Relu2, 6, false, false)       \
  X(SwigluStep, 7, true, false)   \
  X(GegluTanh, 8, true, true)     \
  X(Identity, 9, false, false)    \
  X(Situ, 10, true, true)         \
  X(InvalidType, 11, false, false)

enum class ActivationType : int32_t {
#define MXMOE_X(name, value, gated, impl) name = value,
  MXMOE_ACTIVATION_LIST(MXMOE_X)
#undef MXMOE_X
};

// FC1 has 2*I rows (gate and up) for gated kinds.
constexpr bool IsGated(ActivationType t) {
  switch (t) {
#define MXMOE_X(name, value, gated, impl) \
  case ActivationType::name:              \
    return gated;
    MXMOE_ACTIVATION_LIST(MXMOE_X)
#undef MXMOE_X
  }
  return false;
}

// Whether the reference and every kernel implement this kind.
constexpr bool IsImplemented(ActivationType t) {
  switch (t) {
#define MXMOE_X(name, value, gated, impl) \
  case ActivationType::name:              \
    return impl;
    MXMOE_ACTIVATION_LIST(MXMOE_X)
#undef MXMOE_X
  }
  return false;
}

// "Situ"; "InvalidType" for values outside the enum.
const char* ActivationName(ActivationType t);
// Case-insensitive lookup of the enum name ("situ", "Swiglu").
std::optional<ActivationType> ActivationFromName(std::string_view name);
// From an integer (e.g. a Python or FlashInfer value); error naming the value if unknown.
Status ActivationFromInt(int64_t value, ActivationType* out);
// Ok for implemented kinds; otherwise an error naming the kind, never a silent fallback.
Status CheckActivationSupported(ActivationType t);

// Kimi-K3's SiTU parameters (config fields activation_situ_beta, activation_situ_linear_beta).
inline constexpr float kSituDefaultBeta = 4.0f;
inline constexpr float kSituDefaultLinearBeta = 25.0f;
// GPT-OSS's SwigluBias parameters.
inline constexpr float kSwigluBiasDefaultAlpha = 1.702f;
inline constexpr float kSwigluBiasDefaultLimit = 7.0f;

// The parameters of one expert's activation (each kind reads the fields it has).
struct ActParams {
  float beta = kSituDefaultBeta;               // Situ, gate
  float linear_beta = kSituDefaultLinearBeta;  // Situ, up ("linear")
  float alpha = kSwigluBiasDefaultAlpha;       // SwigluBias
  float limit = kSwigluBiasDefaultLimit;       // SwigluBias
};

}  // namespace mxmoe

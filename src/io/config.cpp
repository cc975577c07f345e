// config.json: the layer shape and activation of a checkpoint (SPEC section 4).
#include <cmath>
#include <initializer_list>
#include <string>

#include "mxmoe/checkpoint.h"
#include "mxmoe/json.h"

namespace mxmoe {

namespace {

std::string Lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

// A short rendering of a JSON value for error messages.
std::string Describe(const JsonValue& v) {
  std::string s;
  if (!WriteJson(v, &s).ok()) s = JsonTypeName(v.type());
  if (s.size() > 48) s = s.substr(0, 45) + "...";
  return s;
}

class ConfigFields {
 public:
  ConfigFields(std::string path, const JsonValue* text, const JsonValue* top)
      : path_(std::move(path)), text_(text), top_(top) {}

  // The first of `names` present, text_config before the top level; null if none is.
  const JsonValue* Lookup(std::initializer_list<const char*> names, std::string* found) const {
    for (const JsonValue* scope : {text_, top_}) {
      if (scope == nullptr) continue;
      for (const char* n : names) {
        if (const JsonValue* v = scope->Find(n)) {
          *found = n;
          return v;
        }
      }
    }
    return nullptr;
  }

  Status Missing(const char* name) const {
    return Status::Io(path_ + ": missing field '" + name + "' (top level or text_config)");
  }

  Status PositiveInt(std::initializer_list<const char*> names, int64_t* out) const {
    std::string found;
    const JsonValue* v = Lookup(names, &found);
    if (v == nullptr) return Missing(*names.begin());
    if (!v->is_integer() || v->AsInt() < 1)
      return Status::Io(path_ + ": field '" + found + "' is " + Describe(*v) + ", expected a positive integer");
    *out = v->AsInt();
    return Status::Ok();
  }

  // A positive finite number, or an array of `count` of them. Absent: `*scalar` keeps its default.
  Status Beta(const char* name, int64_t count, float* scalar, std::vector<float>* per_expert) const {
    std::string found;
    const JsonValue* v = Lookup({name}, &found);
    if (v == nullptr) return Status::Ok();
    const auto positive = [](const JsonValue& x) {
      return x.is_number() && std::isfinite(x.AsDouble()) && x.AsDouble() > 0 &&
             std::isfinite(static_cast<float>(x.AsDouble()));
    };
    if (v->is_array()) {
      const auto& a = v->AsArray();
      if (static_cast<int64_t>(a.size()) != count)
        return Status::Io(path_ + ": field '" + found + "' has " + std::to_string(a.size()) +
                          " entries, expected num_experts = " + std::to_string(count));
      for (size_t i = 0; i < a.size(); ++i) {
        if (!positive(a[i]))
          return Status::Io(path_ + ": field '" + found + "'[" + std::to_string(i) + "] is " + Describe(a[i]) +
                            ", expected a finite number > 0");
        per_expert->push_back(static_cast<float>(a[i].AsDouble()));
      }
      return Status::Ok();
    }
    if (!positive(*v))
      return Status::Io(path_ + ": field '" + found + "' is " + Describe(*v) +
                        ", expected a finite number > 0 or an array of num_experts of them");
    *scalar = static_cast<float>(v->AsDouble());
    return Status::Ok();
  }

 private:
  std::string path_;
  const JsonValue* text_;
  const JsonValue* top_;
};

}  // namespace

const char* HiddenActName(ActivationType t) {
  switch (t) {
    case ActivationType::Situ: return "situ";
    case ActivationType::Swiglu: return "silu";
    case ActivationType::Geglu: return "gelu";
    case ActivationType::GegluTanh: return "gelu_pytorch_tanh";
    default: return nullptr;
  }
}

Status ReadModelConfig(const std::string& path, ModelConfig* out) {
  JsonValue root;
  MXMOE_RETURN_IF_ERROR(ReadJsonFile(path, &root));
  if (!root.is_object()) return Status::Io(path + ": a JSON " + std::string(JsonTypeName(root.type())) + ", expected an object");
  const JsonValue* text = root.Find("text_config");
  if (text != nullptr && !text->is_object())
    return Status::Io(path + ": field 'text_config' is a " + JsonTypeName(text->type()) + ", expected an object");
  const ConfigFields f(path, text, &root);

  ModelConfig c;
  MXMOE_RETURN_IF_ERROR(f.PositiveInt({"routed_expert_hidden_size"}, &c.shape.hidden));
  MXMOE_RETURN_IF_ERROR(f.PositiveInt({"moe_intermediate_size"}, &c.shape.intermediate));
  MXMOE_RETURN_IF_ERROR(f.PositiveInt({"num_experts", "n_routed_experts", "num_local_experts"}, &c.shape.num_experts));
  MXMOE_RETURN_IF_ERROR(
      f.PositiveInt({"num_experts_per_token", "num_experts_per_tok", "experts_per_token"}, &c.shape.top_k));
  Status st = c.shape.Validate();
  if (!st.ok()) return Status(st.code(), path + ": " + st.message());

  std::string found;
  const JsonValue* act = f.Lookup({"hidden_act"}, &found);
  if (act == nullptr) return f.Missing("hidden_act");
  if (!act->is_string()) return Status::Io(path + ": field 'hidden_act' is " + Describe(*act) + ", expected a string");
  const std::string name = Lower(act->AsString());
  if (name == "situ") c.activation.type = ActivationType::Situ;
  else if (name == "silu" || name == "swiglu") c.activation.type = ActivationType::Swiglu;
  else if (name == "gelu") c.activation.type = ActivationType::Geglu;
  else if (name == "gelu_tanh" || name == "gelu_pytorch_tanh") c.activation.type = ActivationType::GegluTanh;
  else
    return Status::Unsupported(path + ": hidden_act \"" + act->AsString() +
                               "\" is not supported (expected situ, silu, swiglu, gelu, gelu_tanh or gelu_pytorch_tanh)");

  if (c.activation.type == ActivationType::Situ) {
    std::vector<float> beta, linear_beta;
    MXMOE_RETURN_IF_ERROR(f.Beta("activation_situ_beta", c.shape.num_experts, &c.activation.params.beta, &beta));
    MXMOE_RETURN_IF_ERROR(f.Beta("activation_situ_linear_beta", c.shape.num_experts,
                                 &c.activation.params.linear_beta, &linear_beta));
    if (!beta.empty() || !linear_beta.empty()) {
      c.per_expert_global.assign(static_cast<size_t>(c.shape.num_experts), c.activation.params);
      for (size_t e = 0; e < c.per_expert_global.size(); ++e) {
        if (!beta.empty()) c.per_expert_global[e].beta = beta[e];
        if (!linear_beta.empty()) c.per_expert_global[e].linear_beta = linear_beta[e];
      }
    }
  }
  *out = std::move(c);
  return Status::Ok();
}

Status WriteModelConfig(const std::string& path, const ModelConfig& config, bool under_text_config) {
  MXMOE_RETURN_IF_ERROR(config.shape.Validate());
  const char* act = HiddenActName(config.activation.type);
  if (act == nullptr)
    return Status::Unsupported(path + ": activation " + std::string(ActivationName(config.activation.type)) +
                               " has no config.json hidden_act spelling");
  const int64_t e = config.shape.num_experts;
  if (!config.per_expert_global.empty() && static_cast<int64_t>(config.per_expert_global.size()) != e)
    return Status::Invalid(path + ": per_expert_global has " + std::to_string(config.per_expert_global.size()) +
                           " entries, expected num_experts = " + std::to_string(e));
  JsonValue fields = JsonValue::MakeObject();
  fields.Set("routed_expert_hidden_size", JsonValue::Integer(config.shape.hidden));
  fields.Set("moe_intermediate_size", JsonValue::Integer(config.shape.intermediate));
  fields.Set("num_experts", JsonValue::Integer(e));
  fields.Set("num_experts_per_token", JsonValue::Integer(config.shape.top_k));
  fields.Set("hidden_act", JsonValue::String(act));
  if (config.activation.type == ActivationType::Situ) {
    if (config.per_expert_global.empty()) {
      fields.Set("activation_situ_beta", JsonValue::Number(config.activation.params.beta));
      fields.Set("activation_situ_linear_beta", JsonValue::Number(config.activation.params.linear_beta));
    } else {
      JsonValue beta = JsonValue::MakeArray(), linear = JsonValue::MakeArray();
      for (const ActParams& p : config.per_expert_global) {
        beta.Append(JsonValue::Number(p.beta));
        linear.Append(JsonValue::Number(p.linear_beta));
      }
      fields.Set("activation_situ_beta", std::move(beta));
      fields.Set("activation_situ_linear_beta", std::move(linear));
    }
  }
  if (!under_text_config) return WriteJsonFile(path, fields);
  JsonValue root = JsonValue::MakeObject();
  root.Set("model_type", JsonValue::String("mxmoe_checkpoint"));
  root.Set("text_config", std::move(fields));
  return WriteJsonFile(path, root);
}

}  // namespace mxmoe

// A small strict JSON (RFC 8259) value, parser and writer: enough for safetensors headers,
// model.safetensors.index.json and config.json. Objects keep their members in insertion order, so
// a written safetensors header lists tensors in the order they were given.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mxmoe/status.h"

namespace mxmoe {

class JsonValue {
 public:
  enum class Type : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };
  using Array = std::vector<JsonValue>;
  using Member = std::pair<std::string, JsonValue>;
  using Object = std::vector<Member>;

  JsonValue() = default;  // null
  static JsonValue Bool(bool b);
  static JsonValue Number(double d);
  static JsonValue Integer(int64_t i);
  static JsonValue String(std::string s);
  static JsonValue MakeArray(Array items = {});
  static JsonValue MakeObject();

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }
  // A number whose value is an integer that int64 holds exactly: an integer literal in int64 range,
  // or a literal such as 3.0 or 1e3 whose double value is integral and at most 2^53 in magnitude.
  bool is_integer() const { return type_ == Type::kNumber && has_int_; }

  // Accessors of the wrong type return false / 0 / empty; check the type first.
  bool AsBool() const { return type_ == Type::kBool && bool_; }
  double AsDouble() const { return type_ == Type::kNumber ? double_ : 0.0; }
  int64_t AsInt() const { return is_integer() ? int_ : 0; }
  const std::string& AsString() const;
  const Array& AsArray() const;
  const Object& AsObject() const;

  // Object member by key (a linear scan), or null when absent or not an object.
  const JsonValue* Find(std::string_view key) const;
  // Object: replace the member `key` or append it. Turns a null value into an object first.
  JsonValue& Set(std::string key, JsonValue value);
  // Array: append. Turns a null value into an array first.
  void Append(JsonValue value);

  bool operator==(const JsonValue& other) const;

 private:
  friend class JsonParser;
  Type type_ = Type::kNull;
  bool bool_ = false;
  bool has_int_ = false;
  double double_ = 0.0;
  int64_t int_ = 0;
  std::string string_;
  Array array_;
  Object object_;
};

// "null", "bool", "number", "string", "array", "object".
const char* JsonTypeName(JsonValue::Type t);

inline constexpr int kJsonMaxDepth = 64;

// Parses one JSON text. Refused (kInvalidArgument, message "invalid JSON at byte N: ..."): trailing
// non-whitespace, a duplicate key within an object, nesting deeper than kJsonMaxDepth, control
// characters or invalid UTF-8 in strings, unpaired surrogates, numbers outside the double range.
Status ParseJson(std::string_view text, JsonValue* out);

// Serializes `value`; indent < 0 writes it on one line, indent >= 0 pretty-prints with that many
// spaces per level. NaN and infinities have no JSON form and are refused, naming their path.
Status WriteJson(const JsonValue& value, std::string* out, int indent = -1);

// Reads and parses a file; errors name the path.
Status ReadJsonFile(const std::string& path, JsonValue* out);
// Writes pretty-printed JSON and a newline, through a temporary file renamed over `path`.
Status WriteJsonFile(const std::string& path, const JsonValue& value);

}  // namespace mxmoe

#include "mxmoe/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <unordered_set>

#include "io/file_util.h"

namespace mxmoe {

// ---------------------------------------------------------------------------------------------
// JsonValue

JsonValue JsonValue::Bool(bool b) {
  JsonValue v;
  v.type_ = Type::kBool;
  v.bool_ = b;
  return v;
}

JsonValue JsonValue::Number(double d) {
  JsonValue v;
  v.type_ = Type::kNumber;
  v.double_ = d;
  // The same exactness rule as the parser's, so a written and re-read value compares equal.
  if (std::isfinite(d) && std::trunc(d) == d && std::fabs(d) <= 9007199254740992.0) {
    v.has_int_ = true;
    v.int_ = static_cast<int64_t>(d);
  }
  return v;
}

JsonValue JsonValue::Integer(int64_t i) {
  JsonValue v;
  v.type_ = Type::kNumber;
  v.double_ = static_cast<double>(i);
  v.has_int_ = true;
  v.int_ = i;
  return v;
}

JsonValue JsonValue::String(std::string s) {
  JsonValue v;
  v.type_ = Type::kString;
  v.string_ = std::move(s);
  return v;
}

JsonValue JsonValue::MakeArray(Array items) {
  JsonValue v;
  v.type_ = Type::kArray;
  v.array_ = std::move(items);
  return v;
}

JsonValue JsonValue::MakeObject() {
  JsonValue v;
  v.type_ = Type::kObject;
  return v;
}

const std::string& JsonValue::AsString() const {
  static const std::string kEmpty;
  return type_ == Type::kString ? string_ : kEmpty;
}

const JsonValue::Array& JsonValue::AsArray() const {
  static const Array kEmpty;
  return type_ == Type::kArray ? array_ : kEmpty;
}

const JsonValue::Object& JsonValue::AsObject() const {
  static const Object kEmpty;
  return type_ == Type::kObject ? object_ : kEmpty;
}

const JsonValue* JsonValue::Find(std::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const Member& m : object_)
    if (m.first == key) return &m.second;
  return nullptr;
}

JsonValue& JsonValue::Set(std::string key, JsonValue value) {
  if (type_ == Type::kNull) type_ = Type::kObject;
  for (Member& m : object_) {
    if (m.first == key) {
      m.second = std::move(value);
      return m.second;
    }
  }
  object_.emplace_back(std::move(key), std::move(value));
  return object_.back().second;
}

void JsonValue::Append(JsonValue value) {
  if (type_ == Type::kNull) type_ = Type::kArray;
  array_.push_back(std::move(value));
}

bool JsonValue::operator==(const JsonValue& o) const {
  if (type_ != o.type_) return false;
  switch (type_) {
    case Type::kNull: return true;
    case Type::kBool: return bool_ == o.bool_;
    case Type::kNumber:
      if (has_int_ != o.has_int_) return false;
      return has_int_ ? int_ == o.int_ : double_ == o.double_;
    case Type::kString: return string_ == o.string_;
    case Type::kArray: return array_ == o.array_;
    case Type::kObject: return object_ == o.object_;
  }
  return false;
}

const char* JsonTypeName(JsonValue::Type t) {
  switch (t) {
    case JsonValue::Type::kNull: return "null";
    case JsonValue::Type::kBool: return "bool";
    case JsonValue::Type::kNumber: return "number";
    case JsonValue::Type::kString: return "string";
    case JsonValue::Type::kArray: return "array";
    case JsonValue::Type::kObject: return "object";
  }
  return "invalid";
}

// ---------------------------------------------------------------------------------------------
// Parser

class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : s_(text) {}

  Status ParseDocument(JsonValue* out) {
    SkipWhitespace();
    if (pos_ == s_.size()) return Error("empty document, expected a value");
    MXMOE_RETURN_IF_ERROR(ParseValue(out, 0));
    SkipWhitespace();
    if (pos_ != s_.size()) return Error("trailing characters after the value");
    return Status::Ok();
  }

 private:
  Status Error(const std::string& what) const { return ErrorAt(pos_, what); }
  static Status ErrorAt(size_t at, const std::string& what) {
    return Status::Invalid("invalid JSON at byte " + std::to_string(at) + ": " + what);
  }

  // A printable rendering of the byte at pos_ for messages.
  std::string Here() const {
    if (pos_ >= s_.size()) return "end of input";
    const unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c >= 0x20 && c < 0x7F) return std::string("'") + static_cast<char>(c) + "'";
    char buf[16];
    std::snprintf(buf, sizeof(buf), "byte 0x%02X", c);
    return buf;
  }

  void SkipWhitespace() {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  bool Consume(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) != lit) return false;
    pos_ += lit.size();
    return true;
  }

  Status ParseValue(JsonValue* out, int depth) {
    if (pos_ >= s_.size()) return Error("unexpected end of input, expected a value");
    switch (s_[pos_]) {
      case '{': return ParseObject(out, depth + 1);
      case '[': return ParseArray(out, depth + 1);
      case '"':
        out->type_ = JsonValue::Type::kString;
        return ParseString(&out->string_);
      case 't':
        if (!Consume("true")) return Error("invalid literal, expected 'true'");
        *out = JsonValue::Bool(true);
        return Status::Ok();
      case 'f':
        if (!Consume("false")) return Error("invalid literal, expected 'false'");
        *out = JsonValue::Bool(false);
        return Status::Ok();
      case 'n':
        if (!Consume("null")) return Error("invalid literal, expected 'null'");
        *out = JsonValue();
        return Status::Ok();
      default: {
        const char c = s_[pos_];
        if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(out);
        return Error("unexpected " + Here() + ", expected a value");
      }
    }
  }

  Status ParseObject(JsonValue* out, int depth) {
    if (depth > kJsonMaxDepth)
      return Error("nesting deeper than " + std::to_string(kJsonMaxDepth) + " levels");
    ++pos_;  // '{'
    JsonValue obj = JsonValue::MakeObject();
    std::unordered_set<std::string> keys;
    SkipWhitespace();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      *out = std::move(obj);
      return Status::Ok();
    }
    while (true) {
      SkipWhitespace();
      if (pos_ >= s_.size() || s_[pos_] != '"')
        return Error("unexpected " + Here() + ", expected a string key");
      const size_t key_pos = pos_;
      std::string key;
      MXMOE_RETURN_IF_ERROR(ParseString(&key));
      if (!keys.insert(key).second) return ErrorAt(key_pos, "duplicate key \"" + key + "\" in object");
      SkipWhitespace();
      if (pos_ >= s_.size() || s_[pos_] != ':')
        return Error("unexpected " + Here() + ", expected ':' after an object key");
      ++pos_;
      SkipWhitespace();
      JsonValue value;
      MXMOE_RETURN_IF_ERROR(ParseValue(&value, depth));
      obj.object_.emplace_back(std::move(key), std::move(value));
      SkipWhitespace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        break;
      }
      return Error("unexpected " + Here() + ", expected ',' or '}' in object");
    }
    *out = std::move(obj);
    return Status::Ok();
  }

  Status ParseArray(JsonValue* out, int depth) {
    if (depth > kJsonMaxDepth)
      return Error("nesting deeper than " + std::to_string(kJsonMaxDepth) + " levels");
    ++pos_;  // '['
    JsonValue arr = JsonValue::MakeArray();
    SkipWhitespace();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      *out = std::move(arr);
      return Status::Ok();
    }
    while (true) {
      SkipWhitespace();
      JsonValue value;
      MXMOE_RETURN_IF_ERROR(ParseValue(&value, depth));
      arr.array_.push_back(std::move(value));
      SkipWhitespace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        break;
      }
      return Error("unexpected " + Here() + ", expected ',' or ']' in array");
    }
    *out = std::move(arr);
    return Status::Ok();
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  // Four hex digits at pos_ (after "\u").
  Status ParseHex4(uint32_t* cp) {
    if (s_.size() - pos_ < 4) return Error("truncated \\u escape, expected 4 hex digits");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_ + i];
      uint32_t d;
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else return ErrorAt(pos_ + i, "invalid hex digit in \\u escape");
      v = v * 16 + d;
    }
    pos_ += 4;
    *cp = v;
    return Status::Ok();
  }

  // One UTF-8 sequence starting at pos_ (a byte >= 0x80), checked per RFC 3629: no overlong forms,
  // no surrogates, nothing above U+10FFFF.
  Status CopyUtf8Sequence(std::string* out) {
    const auto byte = [&](size_t i) { return static_cast<unsigned char>(s_[i]); };
    const unsigned char c0 = byte(pos_);
    int len;
    uint32_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c0 >= 0xC2 && c0 <= 0xDF) {
      len = 2;
    } else if (c0 >= 0xE0 && c0 <= 0xEF) {
      len = 3;
      if (c0 == 0xE0) lo = 0xA0;
      if (c0 == 0xED) hi = 0x9F;
    } else if (c0 >= 0xF0 && c0 <= 0xF4) {
      len = 4;
      if (c0 == 0xF0) lo = 0x90;
      if (c0 == 0xF4) hi = 0x8F;
    } else {
      return Error("invalid UTF-8 lead " + Here() + " in string");
    }
    if (s_.size() - pos_ < static_cast<size_t>(len)) return Error("truncated UTF-8 sequence in string");
    for (int i = 1; i < len; ++i) {
      const unsigned char c = byte(pos_ + i);
      const uint32_t want_lo = i == 1 ? lo : 0x80, want_hi = i == 1 ? hi : 0xBF;
      if (c < want_lo || c > want_hi) return ErrorAt(pos_ + i, "invalid UTF-8 continuation byte in string");
    }
    out->append(s_.substr(pos_, len));
    pos_ += len;
    return Status::Ok();
  }

  Status ParseString(std::string* out) {
    const size_t start = pos_;
    ++pos_;  // opening quote
    out->clear();
    while (true) {
      if (pos_ >= s_.size()) return ErrorAt(start, "unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return Status::Ok();
      }
      if (c < 0x20) return Error("unescaped control character " + Here() + " in string");
      if (c >= 0x80) {
        MXMOE_RETURN_IF_ERROR(CopyUtf8Sequence(out));
        continue;
      }
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        ++pos_;
        continue;
      }
      const size_t esc_pos = pos_;
      ++pos_;
      if (pos_ >= s_.size()) return ErrorAt(start, "unterminated string");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          MXMOE_RETURN_IF_ERROR(ParseHex4(&cp));
          if (cp >= 0xDC00 && cp <= 0xDFFF) return ErrorAt(esc_pos, "unpaired low surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!Consume("\\u")) return ErrorAt(esc_pos, "unpaired high surrogate in \\u escape");
            uint32_t low;
            MXMOE_RETURN_IF_ERROR(ParseHex4(&low));
            if (low < 0xDC00 || low > 0xDFFF)
              return ErrorAt(esc_pos, "high surrogate not followed by a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default: return ErrorAt(esc_pos, "invalid escape '\\" + std::string(1, e) + "' in string");
      }
    }
  }

  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }

  Status ParseNumber(JsonValue* out) {
    const size_t start = pos_;
    const auto digits = [&] {
      size_t n = 0;
      while (pos_ < s_.size() && IsDigit(s_[pos_])) ++pos_, ++n;
      return n;
    };
    if (s_[pos_] == '-') ++pos_;
    if (pos_ >= s_.size() || !IsDigit(s_[pos_])) return Error("expected a digit in number");
    if (s_[pos_] == '0') {
      ++pos_;
      if (pos_ < s_.size() && IsDigit(s_[pos_])) return Error("leading zero in number");
    } else {
      digits();
    }
    bool integral_literal = true;
    if (pos_ < s_.size() && s_[pos_] == '.') {
      integral_literal = false;
      ++pos_;
      if (digits() == 0) return Error("expected a digit after the decimal point");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      integral_literal = false;
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (digits() == 0) return Error("expected a digit in the exponent");
    }
    const std::string_view lit = s_.substr(start, pos_ - start);
    JsonValue v;
    v.type_ = JsonValue::Type::kNumber;
    double d = 0;
    const auto r = std::from_chars(lit.data(), lit.data() + lit.size(), d);
    if (r.ec == std::errc::result_out_of_range) {
      if (MagnitudeIsHuge(lit)) return ErrorAt(start, "number " + std::string(lit) + " is outside the double range");
      d = lit[0] == '-' ? -0.0 : 0.0;  // underflow: the nearest double is zero
    } else if (r.ec != std::errc() || r.ptr != lit.data() + lit.size()) {
      return ErrorAt(start, "malformed number " + std::string(lit));
    }
    v.double_ = d;
    if (integral_literal) {
      int64_t i = 0;
      const auto ri = std::from_chars(lit.data(), lit.data() + lit.size(), i);
      if (ri.ec == std::errc() && ri.ptr == lit.data() + lit.size()) {
        v.has_int_ = true;
        v.int_ = i;
      }
    } else if (std::trunc(d) == d && std::fabs(d) <= 9007199254740992.0) {
      v.has_int_ = true;
      v.int_ = static_cast<int64_t>(d);
    }
    *out = std::move(v);
    return Status::Ok();
  }

  // Whether an out-of-range literal overflowed (rather than underflowed): its decimal magnitude,
  // the count of significant integer digits plus the exponent, is positive.
  static bool MagnitudeIsHuge(std::string_view lit) {
    size_t i = lit[0] == '-' ? 1 : 0;
    int64_t int_digits = 0, frac_zeros = 0;
    bool seen_nonzero = false;
    for (; i < lit.size() && IsDigit(lit[i]); ++i) {
      if (lit[i] != '0') seen_nonzero = true;
      if (seen_nonzero) ++int_digits;
    }
    if (i < lit.size() && lit[i] == '.') {
      for (++i; i < lit.size() && IsDigit(lit[i]); ++i) {
        if (!seen_nonzero && lit[i] == '0') ++frac_zeros;
        else seen_nonzero = true;
      }
    }
    int64_t exp = 0;
    if (i < lit.size() && (lit[i] == 'e' || lit[i] == 'E')) {
      ++i;
      bool neg = false;
      if (lit[i] == '+' || lit[i] == '-') neg = lit[i++] == '-';
      for (; i < lit.size(); ++i) exp = std::min<int64_t>(exp * 10 + (lit[i] - '0'), int64_t{1} << 40);
      if (neg) exp = -exp;
    }
    const int64_t magnitude = int_digits > 0 ? int_digits + exp : exp - frac_zeros;
    return magnitude > 0;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

Status ParseJson(std::string_view text, JsonValue* out) {
  JsonParser p(text);
  JsonValue v;
  MXMOE_RETURN_IF_ERROR(p.ParseDocument(&v));
  *out = std::move(v);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

void WriteString(std::string_view s, std::string* out) {
  out->push_back('"');
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04X", c);
          *out += buf;
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

void Newline(int indent, int level, std::string* out) {
  if (indent < 0) return;
  out->push_back('\n');
  out->append(static_cast<size_t>(indent) * level, ' ');
}

Status WriteValue(const JsonValue& v, int indent, int level, const std::string& path, std::string* out) {
  switch (v.type()) {
    case JsonValue::Type::kNull: *out += "null"; break;
    case JsonValue::Type::kBool: *out += v.AsBool() ? "true" : "false"; break;
    case JsonValue::Type::kNumber: {
      char buf[32];
      std::to_chars_result r;
      if (v.is_integer()) {
        r = std::to_chars(buf, buf + sizeof(buf), v.AsInt());
      } else {
        const double d = v.AsDouble();
        if (!std::isfinite(d)) return Status::Invalid("cannot write " + std::to_string(d) + " as JSON at " + path);
        r = std::to_chars(buf, buf + sizeof(buf), d);  // shortest form that reads back exactly
        // A double beyond 2^53 may print as a bare integer ("26122248226122482"), which would read
        // back as an exact int64: keep it a double literal. (Found by fuzz_json.)
        if (std::string_view(buf, r.ptr - buf).find_first_of(".eE") == std::string_view::npos) {
          *r.ptr++ = '.';
          *r.ptr++ = '0';
        }
      }
      out->append(buf, r.ptr);
      break;
    }
    case JsonValue::Type::kString: WriteString(v.AsString(), out); break;
    case JsonValue::Type::kArray: {
      const auto& a = v.AsArray();
      out->push_back('[');
      for (size_t i = 0; i < a.size(); ++i) {
        if (i > 0) out->push_back(',');
        Newline(indent, level + 1, out);
        MXMOE_RETURN_IF_ERROR(WriteValue(a[i], indent, level + 1, path + "[" + std::to_string(i) + "]", out));
      }
      if (!a.empty()) Newline(indent, level, out);
      out->push_back(']');
      break;
    }
    case JsonValue::Type::kObject: {
      const auto& o = v.AsObject();
      out->push_back('{');
      for (size_t i = 0; i < o.size(); ++i) {
        if (i > 0) out->push_back(',');
        Newline(indent, level + 1, out);
        WriteString(o[i].first, out);
        *out += indent < 0 ? ":" : ": ";
        MXMOE_RETURN_IF_ERROR(WriteValue(o[i].second, indent, level + 1, path + "." + o[i].first, out));
      }
      if (!o.empty()) Newline(indent, level, out);
      out->push_back('}');
      break;
    }
  }
  return Status::Ok();
}

}  // namespace

Status WriteJson(const JsonValue& value, std::string* out, int indent) {
  std::string s;
  MXMOE_RETURN_IF_ERROR(WriteValue(value, indent, 0, "$", &s));
  *out = std::move(s);
  return Status::Ok();
}

Status ReadJsonFile(const std::string& path, JsonValue* out) {
  std::string text;
  MXMOE_RETURN_IF_ERROR(io::ReadFileToString(path, &text));
  Status st = ParseJson(text, out);
  if (!st.ok()) return Status::Io(path + ": " + st.message());
  return Status::Ok();
}

Status WriteJsonFile(const std::string& path, const JsonValue& value) {
  std::string text;
  Status st = WriteJson(value, &text, 2);
  if (!st.ok()) return Status(st.code(), path + ": " + st.message());
  text.push_back('\n');
  return io::AtomicWriteFile(path, {text});
}

}  // namespace mxmoe

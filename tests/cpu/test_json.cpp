// The strict JSON parser and writer (src/io/json.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "mxmoe/json.h"

namespace mxmoe {
namespace {

JsonValue Parse(const std::string& text) {
  JsonValue v;
  const Status st = ParseJson(text, &v);
  EXPECT_TRUE(st.ok()) << "input: " << text << "\n" << st.ToString();
  return v;
}

// The parse is refused, and the message mentions `needle`.
void ExpectRefused(const std::string& text, const std::string& needle) {
  JsonValue v;
  const Status st = ParseJson(text, &v);
  ASSERT_FALSE(st.ok()) << "accepted: " << text;
  EXPECT_NE(st.message().find(needle), std::string::npos)
      << "input: " << text << "\nmessage: " << st.message() << "\nexpected to mention: " << needle;
}

TEST(Json, Literals) {
  EXPECT_TRUE(Parse("null").is_null());
  EXPECT_TRUE(Parse("true").AsBool());
  EXPECT_TRUE(Parse("false").is_bool());
  EXPECT_FALSE(Parse("false").AsBool());
  EXPECT_TRUE(Parse(" \t\r\n null \n").is_null());
}

TEST(Json, Numbers) {
  const JsonValue zero = Parse("0");
  EXPECT_TRUE(zero.is_integer());
  EXPECT_EQ(zero.AsInt(), 0);
  EXPECT_EQ(Parse("-12").AsInt(), -12);
  EXPECT_EQ(Parse("9223372036854775807").AsInt(), INT64_MAX);
  EXPECT_EQ(Parse("-9223372036854775808").AsInt(), INT64_MIN);
  // Beyond 2^53 an integer literal is still exact.
  EXPECT_EQ(Parse("9007199254740993").AsInt(), 9007199254740993LL);
  // Outside int64: a double only.
  const JsonValue big = Parse("9223372036854775808");
  EXPECT_TRUE(big.is_number());
  EXPECT_FALSE(big.is_integer());
  EXPECT_DOUBLE_EQ(big.AsDouble(), 9223372036854775808.0);
  // Integral values in other notations.
  EXPECT_TRUE(Parse("3.0").is_integer());
  EXPECT_EQ(Parse("3.0").AsInt(), 3);
  EXPECT_EQ(Parse("1e3").AsInt(), 1000);
  EXPECT_EQ(Parse("25E+0").AsInt(), 25);
  EXPECT_FALSE(Parse("1.5").is_integer());
  EXPECT_DOUBLE_EQ(Parse("1.5").AsDouble(), 1.5);
  EXPECT_DOUBLE_EQ(Parse("-0.125e-2").AsDouble(), -0.00125);
  EXPECT_DOUBLE_EQ(Parse("0.1").AsDouble(), 0.1);
  EXPECT_DOUBLE_EQ(Parse("1.7976931348623157e308").AsDouble(), 1.7976931348623157e308);
  EXPECT_EQ(Parse("1e-400").AsDouble(), 0.0);  // underflows to zero, not an error
}

// A non-integral literal whose double is an integer beyond 2^53 stays a double through a write and
// a read (fuzz_json found it printed as a bare integer, which reads back as an exact int64).
TEST(Json, BigDoubleRoundTripsAsDouble) {
  const JsonValue v = Parse("26122248226122482.4");
  EXPECT_FALSE(v.is_integer());
  std::string text;
  ASSERT_TRUE(WriteJson(v, &text).ok());
  const JsonValue back = Parse(text);
  EXPECT_FALSE(back.is_integer()) << text;
  EXPECT_TRUE(back == v) << text;
}

TEST(Json, Strings) {
  EXPECT_EQ(Parse(R"("")").AsString(), "");
  EXPECT_EQ(Parse(R"("abc")").AsString(), "abc");
  EXPECT_EQ(Parse(R"("\"\\\/\b\f\n\r\t")").AsString(), "\"\\/\b\f\n\r\t");
  EXPECT_EQ(Parse(R"("\u0041\u00e9\u20AC")").AsString(), "A\xC3\xA9\xE2\x82\xAC");
  EXPECT_EQ(Parse(R"("\u0000")").AsString(), std::string(1, '\0'));
  // A surrogate pair: U+1F600.
  EXPECT_EQ(Parse(R"("\ud83d\ude00")").AsString(), "\xF0\x9F\x98\x80");
  // Raw UTF-8 passes through.
  EXPECT_EQ(Parse("\"\xC3\xA9\xF0\x9F\x98\x80\"").AsString(), "\xC3\xA9\xF0\x9F\x98\x80");
}

TEST(Json, ArraysAndObjects) {
  const JsonValue v = Parse(R"({"a": [1, 2, {"b": null}], "c": {}, "d": [], "e": "x"})");
  ASSERT_TRUE(v.is_object());
  ASSERT_EQ(v.AsObject().size(), 4u);
  // Insertion order is kept.
  EXPECT_EQ(v.AsObject()[0].first, "a");
  EXPECT_EQ(v.AsObject()[3].first, "e");
  const JsonValue* a = v.Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->AsArray().size(), 3u);
  EXPECT_EQ(a->AsArray()[1].AsInt(), 2);
  EXPECT_TRUE(a->AsArray()[2].Find("b")->is_null());
  EXPECT_TRUE(v.Find("c")->is_object());
  EXPECT_TRUE(v.Find("d")->AsArray().empty());
  EXPECT_EQ(v.Find("missing"), nullptr);
}

TEST(Json, DepthLimit) {
  const auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  Parse(nested(kJsonMaxDepth));
  ExpectRefused(nested(kJsonMaxDepth + 1), "nesting deeper than 64");
  std::string objects;
  for (int i = 0; i < kJsonMaxDepth + 1; ++i) objects += "{\"a\":";
  objects += "1" + std::string(kJsonMaxDepth + 1, '}');
  ExpectRefused(objects, "nesting deeper");
}

TEST(Json, Invalid) {
  ExpectRefused("", "empty document");
  ExpectRefused("   ", "empty document");
  ExpectRefused("{", "expected a string key");
  ExpectRefused("[", "expected a value");
  ExpectRefused("[1,]", "expected a value");
  ExpectRefused("[1 2]", "expected ',' or ']'");
  ExpectRefused(R"({"a":1,})", "expected a string key");
  ExpectRefused(R"({"a" 1})", "expected ':'");
  ExpectRefused(R"({1: 2})", "expected a string key");
  ExpectRefused(R"({'a': 2})", "expected a string key");
  ExpectRefused("[1] x", "trailing characters");
  ExpectRefused("{} {}", "trailing characters");
  ExpectRefused("tru", "expected 'true'");
  ExpectRefused("nul", "expected 'null'");
  ExpectRefused("NaN", "expected a value");
  ExpectRefused("Infinity", "expected a value");
  ExpectRefused("01", "leading zero");
  ExpectRefused("-", "expected a digit");
  ExpectRefused("1.", "after the decimal point");
  ExpectRefused(".5", "expected a value");
  ExpectRefused("+1", "expected a value");
  ExpectRefused("1e", "exponent");
  ExpectRefused("1e400", "outside the double range");
  ExpectRefused("-1e400", "outside the double range");
  ExpectRefused("\"abc", "unterminated string");
  ExpectRefused("\"a\nb\"", "control character");
  ExpectRefused("\"a\x01\"", "control character");
  ExpectRefused(R"("\x")", "invalid escape");
  ExpectRefused(R"("\u12")", "hex digit");
  ExpectRefused(R"("\u12G4")", "hex digit");
  ExpectRefused(R"("\ud800")", "unpaired high surrogate");
  ExpectRefused(R"("\ud800\u0041")", "not followed by a low surrogate");
  ExpectRefused(R"("\udc00")", "unpaired low surrogate");
  ExpectRefused("\"\xFF\"", "invalid UTF-8");
  ExpectRefused("\"\xC0\xAF\"", "invalid UTF-8");      // overlong '/'
  ExpectRefused("\"\xED\xA0\x80\"", "invalid UTF-8");  // encoded surrogate
  ExpectRefused("\"\xF4\x90\x80\x80\"", "invalid UTF-8");  // above U+10FFFF
  ExpectRefused("\"\xE2\x82\"", "UTF-8");
  ExpectRefused("\xEF\xBB\xBF{}", "expected a value");  // a byte-order mark is not JSON
}

TEST(Json, DuplicateKeys) {
  ExpectRefused(R"({"a": 1, "a": 2})", "duplicate key \"a\"");
  // Keys compare after unescaping.
  ExpectRefused(R"({"a": 1, "\u0061": 2})", "duplicate key");
  // The same key in different objects is fine.
  Parse(R"({"a": {"a": 1}, "b": {"a": 2}})");
}

TEST(Json, ErrorsGiveByteOffsets) {
  ExpectRefused("[1, x]", "at byte 4");
  ExpectRefused(R"({"k": 1, "k": 2})", "at byte 9");
  ExpectRefused("\n\n  tru", "at byte 4");
}

TEST(Json, WriteRoundTrip) {
  const std::string text =
      R"({"name": "x\"\\\n\u0001\u00e9", "ints": [0, -1, 9223372036854775807, -9223372036854775808],)"
      R"( "reals": [0.1, -2.5e-300, 1.7976931348623157e308, 1.5], "nested": {"t": true, "f": false,)"
      R"( "n": null, "e": [], "o": {}}})";
  const JsonValue v = Parse(text);
  for (int indent : {-1, 0, 2}) {
    std::string out;
    ASSERT_TRUE(WriteJson(v, &out, indent).ok());
    EXPECT_EQ(Parse(out), v) << out;
    if (indent < 0) {
      EXPECT_EQ(out.find('\n'), std::string::npos);
      EXPECT_NE(out.find("\\u0001"), std::string::npos);  // control characters escaped
    }
  }
}

TEST(Json, WriteBuilt) {
  JsonValue obj;
  obj.Set("b", JsonValue::Integer(2));
  obj.Set("a", JsonValue::String("s"));
  obj.Set("b", JsonValue::Number(3.25));  // replaces, keeping the position
  JsonValue arr;
  arr.Append(JsonValue::Bool(true));
  arr.Append(JsonValue());
  obj.Set("c", arr);
  std::string out;
  ASSERT_TRUE(WriteJson(obj, &out).ok());
  EXPECT_EQ(out, R"({"b":3.25,"a":"s","c":[true,null]})");
  ASSERT_TRUE(WriteJson(JsonValue::Number(4.0), &out).ok());
  EXPECT_EQ(out, "4");
}

TEST(Json, WriteRefusesNonFinite) {
  JsonValue obj;
  JsonValue arr;
  arr.Append(JsonValue::Number(1.0));
  arr.Append(JsonValue::Number(std::nan("")));
  obj.Set("beta", arr);
  std::string out;
  const Status st = WriteJson(obj, &out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("$.beta[1]"), std::string::npos) << st.message();
  EXPECT_FALSE(WriteJson(JsonValue::Number(std::numeric_limits<double>::infinity()), &out).ok());
}

// Random corruptions of a valid document: each is refused with a one-line message or accepted,
// and whatever is accepted writes back and re-reads to the same value.
TEST(Json, CorruptedInputsRoundTripOrFail) {
  const std::string base =
      R"({"a": [1, -2.5e3, true, null, "x\u00e9\ud83d\ude00"], "b": {"c": "\n", "d": [[], {}]}, "e": 0})";
  const char kInteresting[] = {'{', '}', '[', ']', '"', ',', ':', '-', '.', 'e', '0', '\\', 'u', ' ', '\x80', '\xc3'};
  std::mt19937_64 rng(99);
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string m = base;
    for (int n = 1 + static_cast<int>(rng() % 3); n > 0; --n) {
      const size_t at = rng() % m.size();
      switch (rng() % 3) {
        case 0: m[at] = kInteresting[rng() % sizeof(kInteresting)]; break;
        case 1: m.erase(at, 1); break;
        default: m.insert(at, 1, kInteresting[rng() % sizeof(kInteresting)]); break;
      }
    }
    JsonValue v;
    const Status st = ParseJson(m, &v);
    if (!st.ok()) {
      EXPECT_EQ(st.message().rfind("invalid JSON at byte ", 0), 0u) << st.message();
      EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
      continue;
    }
    ++accepted;
    std::string out;
    ASSERT_TRUE(WriteJson(v, &out).ok()) << m;
    JsonValue back;
    ASSERT_TRUE(ParseJson(out, &back).ok()) << out;
    EXPECT_EQ(back, v) << m;
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace mxmoe

// ParseJson on arbitrary bytes; whatever parses must survive WriteJson and parse back equal.
#include <string>

#include "fuzz_util.h"
#include "mxmoe/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mxmoe;
  JsonValue v;
  if (!ParseJson(std::string_view(reinterpret_cast<const char*>(data), size), &v).ok()) return 0;
  for (int indent : {-1, 2}) {
    std::string text;
    if (!WriteJson(v, &text, indent).ok()) fuzz::Fail("a parsed value could not be written");
    JsonValue back;
    if (!ParseJson(text, &back).ok()) fuzz::Fail("written JSON does not parse");
    if (!(back == v)) fuzz::Fail("JSON round trip changed the value");
  }
  return 0;
}

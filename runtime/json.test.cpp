// Tests of the JSON writers: strings escape what JSON requires (quotes,
// backslash, control bytes) and pass valid UTF-8 through; invalid UTF-8 turns
// into U+FFFD so the output stays valid JSON; numbers and base64.
#include "runtime/json.hpp"

#include <cmath>
#include <limits>
#include <string>

#include <doctest/doctest.h>

using namespace dsec;

namespace {

std::string quoted(std::string_view s) { return json_quoted(s); }

} // namespace

TEST_CASE("json_string: quotes and backslash are escaped") {
  CHECK(quoted("") == R"("")");
  CHECK(quoted("plain text") == R"("plain text")");
  CHECK(quoted(R"(a"b)") == R"("a\"b")");
  CHECK(quoted(R"(a\b)") == R"("a\\b")");
  CHECK(quoted(R"(\")") == R"("\\\"")");
}

TEST_CASE("json_string: control bytes are escaped, by name where JSON has one") {
  CHECK(quoted("a\nb\rc\td") == R"("a\nb\rc\td")");
  CHECK(quoted(std::string_view("\0", 1)) == R"("\u0000")");
  CHECK(quoted("\x01\x1f") == R"("\u0001\u001f")");
  CHECK(quoted("\x7f") == R"("\u007f")");
  CHECK(quoted("\x08\x0c") == R"("\u0008\u000c")");
  // Every byte below 0x20 comes out escaped: none is left raw.
  for (int c = 0; c < 0x20; ++c) {
    auto out = quoted(std::string(1, static_cast<char>(c)));
    CHECK(out.size() > 3);
    CHECK(out[1] == '\\');
  }
}

TEST_CASE("json_string: valid UTF-8 passes through, invalid UTF-8 becomes U+FFFD") {
  CHECK(quoted("é ü") == "\"é ü\"");                  // 2-byte sequences
  CHECK(quoted("€ 日本") == "\"€ 日本\"");               // 3-byte
  CHECK(quoted("\xf0\x9f\x98\x80") == "\"\xf0\x9f\x98\x80\""); // 4-byte (an emoji)
  CHECK(quoted("\xff") == R"("\ufffd")");              // never a UTF-8 byte
  CHECK(quoted("a\xc3") == R"("a\ufffd")");            // truncated sequence
  CHECK(quoted("\xc0\xaf") == R"("\ufffd\ufffd")");    // overlong '/'
  CHECK(quoted("\xed\xa0\x80") == R"("\ufffd\ufffd\ufffd")"); // a surrogate
  CHECK(quoted("\xf4\x90\x80\x80") == R"("\ufffd\ufffd\ufffd\ufffd")"); // above U+10FFFF
}

TEST_CASE("json_string appends to what is there") {
  std::string out = "{\"k\":";
  json_string(out, "v");
  CHECK(out == R"({"k":"v")");
}

TEST_CASE("utf8_sequence: lengths of valid sequences, 0 for the rest") {
  auto len = [](std::string_view s) {
    return utf8_sequence(reinterpret_cast<const unsigned char*>(s.data()), s.size());
  };
  CHECK(len("a") == 1);
  CHECK(len("é") == 2);
  CHECK(len("€") == 3);
  CHECK(len("\xf0\x9f\x98\x80") == 4);
  CHECK(len("\x80") == 0);
  CHECK(len("\xe2\x82") == 0);
  CHECK(len("\xe0\x80\x80") == 0);
}

TEST_CASE("json_number: shortest round-trip form, null for what JSON cannot hold") {
  auto num = [](double v) {
    std::string out;
    json_number(out, v);
    return out;
  };
  CHECK(num(0) == "0");
  CHECK(num(1.5) == "1.5");
  CHECK(num(-2) == "-2");
  CHECK(num(0.1) == "0.1");
  CHECK(num(std::nan("")) == "null");
  CHECK(num(std::numeric_limits<double>::infinity()) == "null");
  CHECK(num(-std::numeric_limits<double>::infinity()) == "null");
}

TEST_CASE("json_base64: the RFC 4648 test vectors, quoted") {
  auto b64 = [](std::string_view s) {
    std::string out;
    json_base64(out, s);
    return out;
  };
  CHECK(b64("") == R"("")");
  CHECK(b64("f") == R"("Zg==")");
  CHECK(b64("fo") == R"("Zm8=")");
  CHECK(b64("foo") == R"("Zm9v")");
  CHECK(b64("foob") == R"("Zm9vYg==")");
  CHECK(b64("fooba") == R"("Zm9vYmE=")");
  CHECK(b64("foobar") == R"("Zm9vYmFy")");
  CHECK(b64(std::string_view("\0\xff", 2)) == R"("AP8=")");
}

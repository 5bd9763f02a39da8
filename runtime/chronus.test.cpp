#include "runtime/chronus.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <doctest/doctest.h>

using namespace dsec;

namespace {

const chronus_token& test_token() {
  static const chronus_token t = *chronus_token::from_hex(
      "0f1e2d3c4b5a69788796a5b4c3d2e1f00123456789abcdeffedcba9876543210");
  return t;
}

chronus_request stage(std::string name) {
  chronus_request r;
  r.kind = chronus_kind::stage;
  r.text = std::move(name);
  return r;
}

chronus_request log_line(std::string text) {
  chronus_request r;
  r.kind = chronus_kind::log;
  r.text = std::move(text);
  return r;
}

chronus_request report(std::vector<chronus_metric> metrics) {
  chronus_request r;
  r.kind = chronus_kind::report;
  r.metrics = std::move(metrics);
  return r;
}

chronus_request ask(std::string payload, uint32_t timeout_ms) {
  chronus_request r;
  r.kind = chronus_kind::feedback;
  r.payload = std::move(payload);
  r.timeout_ms = timeout_ms;
  return r;
}

expected<chronus_request> decode(const std::string& frame,
                                 const chronus_token& token = test_token()) {
  return decode_request(as_bytes(frame), token);
}

// The error code of a failed decode (and that it failed at all).
template <class T>
errc code_of(const expected<T>& r) {
  REQUIRE_FALSE(r);
  return r.error_value().code;
}

template <class T>
std::string message_of(const expected<T>& r) {
  REQUIRE_FALSE(r);
  return r.error_value().message;
}

// Builds a single-segment frame by hand: the segment table, then `words`.
std::string raw_frame(const std::vector<uint64_t>& words) {
  std::string f(8 + 8 * words.size(), '\0');
  uint32_t n = static_cast<uint32_t>(words.size());
  std::memcpy(f.data() + 4, &n, 4);
  std::memcpy(f.data() + 8, words.data(), 8 * words.size());
  return f;
}

uint64_t struct_ptr(int64_t offset, uint64_t data, uint64_t ptrs) {
  return (static_cast<uint64_t>(offset) << 2 & 0xffffffffu) | data << 32 | ptrs << 48;
}

uint64_t list_ptr(int64_t offset, uint64_t size_code, uint64_t count) {
  return 1 | (static_cast<uint64_t>(offset) << 2 & 0xffffffffu) | size_code << 32 |
         count << 35;
}

// Words of a Request with the test token at 4..7 and the union pointer at 3 (to
// be filled in), tag `tag`.
std::vector<uint64_t> request_head(uint16_t tag) {
  std::vector<uint64_t> w(8, 0);
  w[0] = struct_ptr(0, 1, 2);
  w[1] = tag;
  w[2] = list_ptr(1, 2, 32);
  std::memcpy(&w[4], test_token().bytes().data(), 32);
  return w;
}

void set_word_bytes(std::string& frame, size_t word, const void* p, size_t n) {
  std::memcpy(frame.data() + 8 + 8 * word, p, n);
}

} // namespace

TEST_CASE("chronus tokens are random, print as hex and parse back") {
  auto a = chronus_token::generate();
  auto b = chronus_token::generate();
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->to_hex() != b->to_hex());
  CHECK(a->to_hex().size() == 64);
  auto again = chronus_token::from_hex(a->to_hex());
  REQUIRE(again);
  CHECK(again->to_hex() == a->to_hex());
  CHECK(again->matches(a->bytes()));
  CHECK_FALSE(b->matches(a->bytes()));
  CHECK_FALSE(a->matches(a->bytes().first(31)));

  auto upper = chronus_token::from_hex(
      "0F1E2D3C4B5A69788796A5B4C3D2E1F00123456789ABCDEFFEDCBA9876543210");
  REQUIRE(upper);
  CHECK(upper->to_hex() == test_token().to_hex());

  CHECK(code_of(chronus_token::from_hex("abc")) == errc::invalid_argument);
  auto bad = chronus_token::from_hex(std::string(63, 'a') + "g");
  CHECK(message_of(bad).find("offset 63") != std::string::npos);
}

TEST_CASE("requests of every kind round-trip") {
  std::vector<chronus_request> all = {
      stage("plan"),
      stage(std::string(chronus_max_stage, 'x')),
      stage(" !\"#$%&'()*+,-./0123456789:;<=>?@AZ[\\]^_`az{|}~"),
      report({{"loss", 0.25}}),
      report({{"a", -1e300}, {"b", 0.0}, {"c", 5e-324}, {"d=e", 42}}),
      log_line(""),
      log_line("héllo, wörld ✓ 🎉\ttab\nnewline"),
      log_line(std::string(chronus_max_log, 'l')),
      ask("", 0),
      ask(std::string("\0\1\2\xff", 4), 1500),
      ask(std::string(chronus_max_payload, '\xab'), 0xffffffff),
  };
  std::vector<chronus_metric> many;
  for (size_t i = 0; i < chronus_max_metrics; ++i)
    many.push_back({std::to_string(i) + std::string(chronus_max_key - 3, 'k'),
                    static_cast<double>(i) / 3});
  all.push_back(report(many));

  for (const auto& r : all) {
    CAPTURE(to_string(r.kind));
    auto frame = encode_request(test_token(), r);
    CHECK(frame.size() <= chronus_max_frame);
    auto back = decode(frame);
    REQUIRE_MESSAGE(back, back.error_value().to_string());
    CHECK(*back == r);
  }
}

TEST_CASE("decode_request reads unaligned frames the same") {
  auto frame = encode_request(test_token(), report({{"x", 1.5}, {"y", 2}}));
  std::string shifted = "." + frame;
  auto back = decode_request(as_bytes(shifted).subspan(1), test_token());
  REQUIRE(back);
  CHECK(back->metrics == std::vector<chronus_metric>{{"x", 1.5}, {"y", 2}});
}

TEST_CASE("decode_request refuses malformed frames") {
  auto good = encode_request(test_token(), stage("edit"));
  REQUIRE(decode(good));

  SUBCASE("empty and short") {
    CHECK(code_of(decode("")) == errc::malformed);
    CHECK(code_of(decode(std::string(8, '\0'))) == errc::malformed);
    CHECK(code_of(decode(std::string(13, '\0'))) == errc::malformed);
  }
  SUBCASE("every truncation") {
    for (size_t n = 0; n < good.size(); ++n) {
      CAPTURE(n);
      CHECK(code_of(decode(good.substr(0, n))) == errc::malformed);
    }
  }
  SUBCASE("trailing bytes") {
    auto msg = message_of(decode(good + std::string(8, '\0')));
    CHECK(msg.find("trailing") != std::string::npos);
  }
  SUBCASE("a segment table that claims too much") {
    auto f = good;
    uint32_t many = 0xffffffff;
    std::memcpy(f.data(), &many, 4); // 2^32 segments
    CHECK(message_of(decode(f)).find("segments") != std::string::npos);
    f = good;
    std::memcpy(f.data() + 4, &many, 4); // a huge first segment
    CHECK(code_of(decode(f)) == errc::malformed);
    f = good;
    uint32_t zero = 0;
    std::memcpy(f.data() + 4, &zero, 4);
    CHECK(code_of(decode(f)) == errc::malformed);
  }
  SUBCASE("a root pointer outside the segment") {
    auto f = good;
    uint64_t p = struct_ptr(1000, 1, 2);
    set_word_bytes(f, 0, &p, 8);
    CHECK(code_of(decode(f)) == errc::malformed);
    p = struct_ptr(-5, 1, 2);
    set_word_bytes(f, 0, &p, 8);
    CHECK(code_of(decode(f)) == errc::malformed);
  }
  SUBCASE("a far pointer to a segment that does not exist") {
    auto f = good;
    uint64_t far = 2 | uint64_t{7} << 32;
    set_word_bytes(f, 0, &far, 8);
    CHECK(code_of(decode(f)) == errc::malformed);
  }
  SUBCASE("a text without its NUL") {
    auto w = request_head(0);
    w[3] = list_ptr(4, 2, 8); // 8 bytes, the last one not NUL
    w.push_back(0x4141414141414141);
    CHECK(message_of(decode(raw_frame(w))).find("NUL") != std::string::npos);
  }
  SUBCASE("a union tag this schema does not know") {
    auto w = request_head(9);
    CHECK(message_of(decode(raw_frame(w))).find("unknown kind") != std::string::npos);
  }
  SUBCASE("a token that is a struct") {
    auto w = request_head(0);
    w[2] = struct_ptr(1, 4, 0);
    CHECK(code_of(decode(raw_frame(w))) == errc::malformed);
  }
}

TEST_CASE("decode_request is bounded by the frame's size") {
  SUBCASE("over the frame limit") {
    std::string big(chronus_max_frame + 8, '\0');
    CHECK(code_of(decode(big)) == errc::too_large);
    auto huge = encode_request(test_token(), log_line(std::string(70000, 'x')));
    auto msg = message_of(decode(huge));
    CHECK(msg.find("65536") != std::string::npos);
  }
  SUBCASE("many metrics pointing at the same key") {
    // 2,000 metrics whose keys all point at one 4 KiB text: 36 KiB on the wire, 8
    // MiB if each key were read. The traversal limit stops it.
    constexpr size_t n = 2000, text_words = 512;
    auto w = request_head(1);
    w[3] = list_ptr(4, 7, 2 * n);
    w.push_back(struct_ptr(static_cast<int64_t>(n), 1, 1)); // the list's tag word
    size_t text_at = 9 + 2 * n;
    for (size_t i = 0; i < n; ++i) {
      size_t ptr_at = 9 + 2 * i + 1;
      w.push_back(0);
      w.push_back(list_ptr(static_cast<int64_t>(text_at - ptr_at - 1), 2, 8 * text_words));
    }
    w.resize(w.size() + text_words, 0x6161616161616161);
    w.back() = 0x0061616161616161; // NUL-terminated
    auto f = raw_frame(w);
    REQUIRE(f.size() <= chronus_max_frame);
    CHECK(code_of(decode(f)) == errc::malformed);
  }
  SUBCASE("a list of a million empty structs") {
    auto w = request_head(1);
    w[3] = list_ptr(4, 7, 0);
    w.push_back(struct_ptr(1 << 20, 0, 0));
    CHECK(code_of(decode(raw_frame(w))) == errc::malformed);
  }
}

TEST_CASE("decode_request checks the token before anything else") {
  auto frame = encode_request(test_token(), stage("test"));
  auto other = *chronus_token::generate();
  auto r = decode(frame, other);
  CHECK(code_of(r) == errc::unauthenticated);
  CHECK(message_of(r).find("wrong token") != std::string::npos);
  CHECK(message_of(r).find(test_token().to_hex()) == std::string::npos);
  CHECK(message_of(r).find(other.to_hex()) == std::string::npos);

  // An invalid field with a wrong token is still unauthenticated.
  CHECK(code_of(decode(encode_request(other, stage("")))) == errc::unauthenticated);

  auto w = request_head(0);
  w[2] = list_ptr(1, 2, 31); // 31 bytes
  w.resize(9, 0);
  w[3] = list_ptr(4, 2, 2);
  w[8] = 'a';
  CHECK(message_of(decode(raw_frame(w))).find("31 bytes") != std::string::npos);
  w[2] = 0; // no token at all
  CHECK(code_of(decode(raw_frame(w))) == errc::unauthenticated);
  // A single bit off.
  auto f = frame;
  f[8 + 4 * 8 + 31] ^= 1;
  CHECK(code_of(decode(f)) == errc::unauthenticated);
}

TEST_CASE("decode_request checks each field") {
  struct bad_case {
    chronus_request request;
    const char* names;
  };
  double nan = std::numeric_limits<double>::quiet_NaN();
  double inf = std::numeric_limits<double>::infinity();
  std::vector<chronus_metric> too_many;
  for (size_t i = 0; i <= chronus_max_metrics; ++i)
    too_many.push_back({"m" + std::to_string(i), 1});
  std::vector<bad_case> cases = {
      {stage(""), "stage name is empty"},
      {stage(std::string(chronus_max_stage + 1, 's')), "stage name of 129 bytes"},
      {stage("tab\there"), "stage name has byte 0x09 at offset 3"},
      {stage("caf\xc3\xa9"), "stage name has byte 0xc3"},
      {report({}), "report has no metrics"},
      {report(too_many), "report has 65 metrics"},
      {report({{"", 1}}), "report metric 0's key is empty"},
      {report({{"ok", 1}, {std::string(chronus_max_key + 1, 'k'), 1}}),
       "report metric 1's key of 129 bytes"},
      {report({{"new\nline", 1}}), "report metric 0's key has byte 0x0a"},
      {report({{"loss", nan}}), "report metric 'loss' is not a finite number"},
      {report({{"loss", -inf}}), "report metric 'loss' is not a finite number"},
      {report({{"a", 1}, {"b", 2}, {"a", 3}}), "report metric 'a' appears twice"},
      {log_line(std::string(chronus_max_log + 1, 'l')), "log line of 16385 bytes"},
      {log_line(std::string("nul\0byte", 8)), "log line has a NUL byte at offset 3"},
      {log_line("bad \xff utf8"), "log line is not valid UTF-8 at offset 4"},
      {log_line("overlong \xc0\xaf"), "log line is not valid UTF-8 at offset 9"},
      {log_line("surrogate \xed\xa0\x80"), "log line is not valid UTF-8"},
      {log_line("cut \xe2\x9c"), "log line is not valid UTF-8 at offset 4"},
      {ask(std::string(chronus_max_payload + 1, 'p'), 0), "feedback payload of 32769 bytes"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.names);
    auto r = decode(encode_request(test_token(), c.request));
    CHECK(code_of(r) == errc::invalid_argument);
    CHECK_MESSAGE(message_of(r).find(c.names) != std::string::npos, message_of(r));
    CHECK_FALSE(check_request(c.request));
  }
}

TEST_CASE("events carry a request with its sandbox, seq and time") {
  std::vector<chronus_request> all = {stage("test"), report({{"reward", 0.5}}),
                                      log_line("line"), ask("payload", 30000)};
  uint64_t seq = 1;
  for (const auto& r : all) {
    auto bytes = encode_event("ab12cd34ef56", seq, 123456789012345, r);
    auto e = decode_event(as_bytes(bytes));
    REQUIRE_MESSAGE(e, e.error_value().to_string());
    CHECK(e->sandbox_id == "ab12cd34ef56");
    CHECK(e->seq == seq);
    CHECK(e->monotonic_ns == 123456789012345);
    CHECK(e->kind == r.kind);
    CHECK(e->text == r.text);
    CHECK(e->metrics == r.metrics);
    CHECK(e->payload == r.payload);
    ++seq;
  }
  // Unaligned bytes read the same.
  auto bytes = "x" + encode_event("sb", 9, 1, stage("go"));
  auto e = decode_event(as_bytes(bytes).subspan(1));
  REQUIRE(e);
  CHECK(e->text == "go");
}

TEST_CASE("the node's own events, lost and denied, have seq 0 and are no request") {
  auto lost = decode_event(as_bytes(encode_lost_event("sb1", 7, "its node died")));
  REQUIRE_MESSAGE(lost, lost.error_value().to_string());
  CHECK(lost->kind == chronus_kind::lost);
  CHECK(lost->seq == 0);
  CHECK(lost->text == "its node died");
  auto denied = decode_event(as_bytes(encode_denied_event("sb2", 8, "tcp 198.18.0.3:80")));
  REQUIRE_MESSAGE(denied, denied.error_value().to_string());
  CHECK(denied->kind == chronus_kind::denied);
  CHECK(denied->sandbox_id == "sb2");
  CHECK(denied->seq == 0);
  CHECK(denied->monotonic_ns == 8);
  CHECK(denied->text == "tcp 198.18.0.3:80");
  CHECK(std::string{to_string(chronus_kind::denied)} == "denied");
  CHECK(event_to_json(*denied)
        == R"({"sandbox":"sb2","seq":0,"monotonic_ns":8,"kind":"denied",)"
           R"("destination":"tcp 198.18.0.3:80"})");
  chronus_request r;
  r.kind = chronus_kind::denied;
  r.text = "tcp 1.2.3.4:80";
  CHECK(message_of(check_request(r)).find("not a request") != std::string::npos);
}

TEST_CASE("decode_event refuses events that break the contract") {
  CHECK(message_of(decode_event(as_bytes(encode_event("sb", 0, 1, stage("x")))))
            .find("seq 0") != std::string::npos);
  CHECK(message_of(decode_event(as_bytes(encode_event("", 1, 1, stage("x")))))
            .find("sandbox id is empty") != std::string::npos);
  CHECK(code_of(decode_event(as_bytes(encode_event("a b\n", 1, 1, stage("x"))))) ==
        errc::invalid_argument);
  CHECK(code_of(decode_event(as_bytes(encode_event("sb", 1, 1, stage("")))) ) ==
        errc::invalid_argument);
  CHECK(code_of(decode_event(as_bytes(std::string(24, '\0')))) == errc::malformed);
  CHECK(code_of(decode_event(as_bytes(std::string(chronus_max_frame + 8, '\0')))) ==
        errc::too_large);

  // A feedback request whose id is not the event's seq. Event: data words seq,
  // monotonicNs, tag; pointers sandboxId, union.
  auto bytes = encode_event("sb", 5, 1, ask("p", 0));
  REQUIRE(decode_event(as_bytes(bytes)));
  // FeedbackRequest.id is the first data word of the struct after the Event's
  // text; find it as the second occurrence of the value 5.
  uint64_t five = 5, six = 6;
  size_t first = bytes.find(std::string(reinterpret_cast<char*>(&five), 8));
  size_t second = bytes.find(std::string(reinterpret_cast<char*>(&five), 8), first + 8);
  REQUIRE(second != std::string::npos);
  std::memcpy(bytes.data() + second, &six, 8);
  CHECK(message_of(decode_event(as_bytes(bytes))).find("must be equal") != std::string::npos);
}

TEST_CASE("feedback round-trips and is checked") {
  chronus_feedback f{42, -0.75, "well done ✓", std::string("\0\x01\xfe", 3), true};
  auto back = decode_feedback(as_bytes(encode_feedback(f)));
  REQUIRE(back);
  CHECK(*back == f);
  CHECK(check_feedback(f));

  auto bad = f;
  bad.reward = std::numeric_limits<double>::quiet_NaN();
  CHECK_FALSE(check_feedback(bad));
  CHECK(code_of(decode_feedback(as_bytes(encode_feedback(bad)))) == errc::invalid_argument);
  bad = f;
  bad.text = std::string(chronus_max_feedback_text + 1, 't');
  CHECK(message_of(decode_feedback(as_bytes(encode_feedback(bad)))).find("feedback text") !=
        std::string::npos);
  bad = f;
  bad.data = std::string(chronus_max_feedback_data + 1, 'd');
  CHECK(message_of(decode_feedback(as_bytes(encode_feedback(bad)))).find("feedback data") !=
        std::string::npos);
  CHECK(code_of(decode_feedback(as_bytes(std::string(16, '\xff')))) == errc::malformed);
}

TEST_CASE("replies of every kind round-trip in one segment") {
  chronus_feedback big{7, 1.0, std::string(chronus_max_feedback_text, 't'),
                       std::string(chronus_max_feedback_data, 'd'), false};
  struct one {
    std::string bytes;
    chronus_reply want;
  };
  std::vector<one> all = {
      {encode_reply_ack(), {chronus_reply_kind::ack, {}, {}}},
      {encode_reply_feedback({3, 0.5, "ok", "data", true}),
       {chronus_reply_kind::feedback, {3, 0.5, "ok", "data", true}, {}}},
      {encode_reply_feedback(big), {chronus_reply_kind::feedback, big, {}}},
      {encode_reply_rejected("stage name is empty"),
       {chronus_reply_kind::rejected, {}, "stage name is empty"}},
      {encode_reply_rejected(""), {chronus_reply_kind::rejected, {}, ""}},
      {encode_reply_timed_out(), {chronus_reply_kind::timed_out, {}, {}}},
      {encode_reply_session_gone(), {chronus_reply_kind::session_gone, {}, {}}},
  };
  for (const auto& o : all) {
    CAPTURE(static_cast<int>(o.want.kind));
    CHECK(o.bytes.size() <= chronus_max_frame);
    uint32_t segments_minus_one;
    std::memcpy(&segments_minus_one, o.bytes.data(), 4);
    CHECK(segments_minus_one == 0);
    auto r = decode_reply(as_bytes(o.bytes));
    REQUIRE_MESSAGE(r, r.error_value().to_string());
    CHECK(*r == o.want);
  }
}

TEST_CASE("event_to_json writes one escaped line") {
  chronus_event e;
  e.sandbox_id = "ab12";
  e.seq = 3;
  e.monotonic_ns = 123;
  e.kind = chronus_kind::stage;
  e.text = "test";
  CHECK(event_to_json(e) ==
        R"({"sandbox":"ab12","seq":3,"monotonic_ns":123,"kind":"stage","stage":"test"})");

  e.kind = chronus_kind::report;
  e.metrics = {{"loss", 0.1}, {"n", 3}, {"big", 1e300}, {"q\"", -2.5},
               {"nan", std::numeric_limits<double>::quiet_NaN()}};
  CHECK(event_to_json(e) ==
        R"({"sandbox":"ab12","seq":3,"monotonic_ns":123,"kind":"report","metrics":)"
        R"({"loss":0.1,"n":3,"big":1e+300,"q\"":-2.5,"nan":null}})");

  e.kind = chronus_kind::log;
  e.text = "a\"b\\c\nd\te\x01 é \xff\x7f";
  CHECK(event_to_json(e) ==
        R"({"sandbox":"ab12","seq":3,"monotonic_ns":123,"kind":"log",)"
        R"("log":"a\"b\\c\nd\te\u0001 é \ufffd\u007f"})");

  e.kind = chronus_kind::feedback;
  for (auto [payload, b64] : std::vector<std::pair<std::string, std::string>>{
           {"", ""}, {"h", "aA=="}, {"hi", "aGk="}, {"hi!", "aGkh"},
           {std::string("\0\xff\x10\x80", 4), "AP8QgA=="}}) {
    e.payload = payload;
    CHECK(event_to_json(e) ==
          R"({"sandbox":"ab12","seq":3,"monotonic_ns":123,"kind":"feedback","id":3,)"
          R"("payload_base64":")" + b64 + R"("})");
  }
}

TEST_CASE("the rate limiter allows bursts and a sustained rate") {
  constexpr uint64_t ms = 1'000'000, s = 1000 * ms;
  uint64_t t0 = 5 * s;
  chronus_rate_limiter limit({1000, 2000}, t0);
  CHECK(limit.available(t0) == 2000);
  for (int i = 0; i < 2000; ++i)
    REQUIRE(limit.admit(t0));
  CHECK_FALSE(limit.admit(t0));
  CHECK(limit.available(t0) == 0);
  // 1,000 a second: one more every millisecond.
  CHECK_FALSE(limit.admit(t0 + ms / 2));
  CHECK(limit.admit(t0 + ms));
  CHECK_FALSE(limit.admit(t0 + ms));
  CHECK(limit.available(t0 + ms + 10 * ms) == 10);
  // Sustained: 10 s at 2,000 a second admits about 10,000.
  int admitted = 0;
  for (uint64_t t = t0 + 2 * ms; t < t0 + 2 * ms + 10 * s; t += s / 2000)
    admitted += limit.admit(t) ? 1 : 0;
  CHECK(admitted >= 9999);
  CHECK(admitted <= 10001);
  // A long pause fills the bucket to its burst, no further.
  CHECK(limit.available(t0 + 1000 * s) == 2000);
  CHECK(limit.available(UINT64_MAX) == 2000);
  // A clock that steps back refills nothing and does not break the bucket.
  chronus_rate_limiter back({10, 1}, 10 * s);
  CHECK(back.admit(10 * s));
  CHECK_FALSE(back.admit(5 * s));
  CHECK_FALSE(back.admit(10 * s + 50 * ms));
  CHECK(back.admit(10 * s + 100 * ms));
  // No rate: the burst, then nothing ever again.
  chronus_rate_limiter none({0, 3}, 0);
  CHECK(none.admit(0));
  CHECK(none.admit(0));
  CHECK(none.admit(0));
  CHECK_FALSE(none.admit(1000 * s));
  // The defaults: 1,000 a second, bursts of 2,000.
  chronus_rate_limiter def;
  CHECK(def.available(0) == 2000);
}

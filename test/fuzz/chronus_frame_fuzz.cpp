// libFuzzer target: every input is tried as a Chronus Request, Event, Feedback and
// Reply frame, by runtime/chronus.cpp and by the sandbox's C decoder
// (tools/chronus/chronus.h), with AddressSanitizer and UndefinedBehaviorSanitizer.
// Beyond "never crash", it checks properties:
//   - what decodes, re-encodes and decodes to the same value;
//   - a checked request becomes an Event that decodes to the same body;
//   - the answer does not depend on the frame's alignment (the copy path);
//   - where both reply decoders accept a frame, they agree;
//   - a checked feedback encodes into a Reply that the C decoder reads back;
//   - event_to_json is one line;
//   - refusals are short printable ASCII (they go back to the sender).
// Built by test/fuzz/meson.build with clang++ from the sources themselves (not the
// g++ library), seeded with test/fuzz/corpus/chronus (whose frames carry
// fuzz_token_hex; test/chronus/client.test.cpp regenerates and checks them).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/chronus.hpp"
#include "tools/chronus/chronus.h"

namespace {

using namespace dsec;

constexpr const char* fuzz_token_hex =
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

// A property does not hold: a bug. abort() makes libFuzzer save the input.
void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "chronus_frame_fuzz: property failed: %s\n", what);
    std::abort();
  }
}

// Refusals go back to the sender and into logs: short, printable ASCII.
template <class T>
void check_refusal(const expected<T>& r) {
  if (r)
    return;
  const auto& m = r.error_value().message;
  require(!m.empty() && m.size() < 512, "refusal message empty or long");
  for (char c : m)
    require(c >= 0x20 && c <= 0x7e, "refusal message not printable ASCII");
}

template <class T>
bool same_outcome(const expected<T>& a, const expected<T>& b) {
  if (a.has_value() != b.has_value())
    return false;
  if (a)
    return *a == *b;
  return a.error_value().code == b.error_value().code &&
         a.error_value().message == b.error_value().message;
}

void check_json(const chronus_event& e) {
  auto json = event_to_json(e);
  require(json.find('\n') == std::string::npos, "event_to_json is one line");
  require(json.size() >= 2 && json.front() == '{' && json.back() == '}',
          "event_to_json is an object");
}

void fuzz_request(std::span<const std::byte> in, std::span<const std::byte> unaligned,
                  const chronus_token& token) {
  auto r = decode_request(in, token);
  check_refusal(r);
  require(same_outcome(r, decode_request(unaligned, token)), "request: alignment matters");
  if (!r)
    return;
  require(static_cast<bool>(check_request(*r)), "request: decoded but fails check_request");
  auto again = encode_request(token, *r);
  auto r2 = decode_request(as_bytes(again), token);
  require(r2 && *r2 == *r, "request: re-encoded request decodes differently");

  auto ev = encode_event("sb-fuzz", 7, 123456789, *r);
  auto e = decode_event(as_bytes(ev));
  require(static_cast<bool>(e), "event of a checked request does not decode");
  require(e->sandbox_id == "sb-fuzz" && e->seq == 7 && e->monotonic_ns == 123456789 &&
              e->kind == r->kind && e->text == r->text && e->metrics == r->metrics &&
              e->payload == r->payload,
          "event of a checked request decodes differently");
  check_json(*e);
}

void fuzz_event(std::span<const std::byte> in, std::span<const std::byte> unaligned) {
  auto e = decode_event(in);
  check_refusal(e);
  require(same_outcome(e, decode_event(unaligned)), "event: alignment matters");
  if (!e)
    return;
  chronus_request body{e->kind, e->text, e->metrics, e->payload, 0};
  auto again = encode_event(e->sandbox_id, e->seq, e->monotonic_ns, body);
  auto e2 = decode_event(as_bytes(again));
  require(e2 && *e2 == *e, "event: re-encoded event decodes differently");
  check_json(*e);
}

void fuzz_feedback(std::span<const std::byte> in, std::span<const std::byte> unaligned) {
  auto f = decode_feedback(in);
  check_refusal(f);
  require(same_outcome(f, decode_feedback(unaligned)), "feedback: alignment matters");
  if (!f)
    return;
  auto again = encode_feedback(*f);
  auto f2 = decode_feedback(as_bytes(again));
  require(f2 && *f2 == *f, "feedback: re-encoded feedback decodes differently");
  // The node wraps it in a Reply, which the sandbox's C decoder must read.
  auto reply = encode_reply_feedback(*f);
  require(reply.size() <= chronus_max_frame, "feedback reply over the frame limit");
  {
    ::chronus_reply c;
    require(chronus_decode_reply(reinterpret_cast<const unsigned char*>(reply.data()),
                                 reply.size(), &c) == 0,
            "C decoder refuses an encoded feedback reply");
    require(c.kind == CHRONUS_REPLY_FEEDBACK && c.request_id == f->request_id &&
                std::memcmp(&c.reward, &f->reward, sizeof c.reward) == 0 &&
                (c.done != 0) == f->done &&
                std::string(c.text, c.text_len) == f->text &&
                std::string(reinterpret_cast<const char*>(c.data), c.data_len) == f->data,
            "C decoder reads an encoded feedback reply differently");
  }
}

void fuzz_reply(std::span<const std::byte> in, std::span<const std::byte> unaligned) {
  auto r = decode_reply(in);
  check_refusal(r);
  require(same_outcome(r, decode_reply(unaligned)), "reply: alignment matters");
  ::chronus_reply c;
  int rc = chronus_decode_reply(reinterpret_cast<const unsigned char*>(in.data()), in.size(),
                                &c);
  if (rc == 0) {
    // Whatever it accepted lies inside the frame.
    auto inside = [&](const void* p, size_t n) {
      auto b = reinterpret_cast<const unsigned char*>(in.data());
      auto q = static_cast<const unsigned char*>(p);
      return q >= b && q + n <= b + in.size();
    };
    if (c.kind == CHRONUS_REPLY_FEEDBACK) {
      require(c.text_len == 0 || inside(c.text, c.text_len + 1), "C decoder: text outside");
      require(c.data_len == 0 || inside(c.data, c.data_len), "C decoder: data outside");
      require(c.text[c.text_len] == 0, "C decoder: text without its NUL");
    }
    if (c.kind == CHRONUS_REPLY_REJECTED) {
      require(c.reason_len == 0 || inside(c.reason, c.reason_len + 1),
              "C decoder: reason outside");
      require(c.reason[c.reason_len] == 0, "C decoder: reason without its NUL");
    }
  }
  if (!r || rc != 0)
    return; // each may refuse what the other takes (multiple segments, field checks)
  require(static_cast<int>(r->kind) == c.kind, "reply decoders disagree on the kind");
  if (c.kind == CHRONUS_REPLY_FEEDBACK)
    require(c.request_id == r->feedback.request_id &&
                std::memcmp(&c.reward, &r->feedback.reward, sizeof c.reward) == 0 &&
                (c.done != 0) == r->feedback.done &&
                std::string(c.text, c.text_len) == r->feedback.text &&
                std::string(reinterpret_cast<const char*>(c.data), c.data_len) ==
                    r->feedback.data,
            "reply decoders disagree on the feedback");
  if (c.kind == CHRONUS_REPLY_REJECTED)
    require(std::string(c.reason, c.reason_len) == r->reason,
            "reply decoders disagree on the reason");
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const chronus_token token = *chronus_token::from_hex(fuzz_token_hex);
  auto in = std::span{reinterpret_cast<const std::byte*>(data), size};
  // The same bytes at an odd address: the decoders must copy them to read them.
  std::vector<std::byte> shifted(size + 1);
  if (size)
    std::memcpy(shifted.data() + 1, data, size);
  auto unaligned = std::span{shifted}.subspan(1);

  fuzz_request(in, unaligned, token);
  fuzz_event(in, unaligned);
  fuzz_feedback(in, unaligned);
  fuzz_reply(in, unaligned);
  return 0;
}

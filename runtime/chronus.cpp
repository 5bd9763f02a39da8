// Chronus frames (see chronus.hpp): the Cap'n Proto framing checks and the
// encoders and decoders of requests, replies, events and feedback. The checks of
// the decoded values are chronus_values.cpp, the token and rate limit
// chronus_token.cpp.
#include "runtime/chronus.hpp"

#include <bit>
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include "capnp/chronus.capnp.h"
#include "runtime/chronus_detail.hpp"

namespace dsec {

// The framing and tools/chronus/chronus.h assume little-endian words, as Cap'n
// Proto's own fast path does.
static_assert(std::endian::native == std::endian::little);

using namespace chronus_detail;

namespace {

// Most segments a frame may have. Our encoders and the C client write one; other
// Cap'n Proto writers may split a large message, so allow a few.
constexpr uint32_t max_segments = 16;
// Request -> List(Metric) -> Metric -> Text is three levels deep.
constexpr int nesting_limit = 8;

// ---- framing ----------------------------------------------------------------------

uint32_t load_u32(const std::byte* p) noexcept {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v; // little-endian (static_assert above)
}

// The words of a checked frame: the caller's bytes when they are 8-byte aligned,
// else an aligned copy.
class frame_words {
public:
  kj::ArrayPtr<const capnp::word> words() const noexcept { return words_; }

  static expected<frame_words> check(std::span<const std::byte> f, std::string_view what) {
    if (f.size() > chronus_max_frame)
      return make_error(errc::too_large, std::string{what} + " of " +
                                             std::to_string(f.size()) +
                                             " bytes is over the limit of " +
                                             std::to_string(chronus_max_frame));
    if (f.size() < 16 || f.size() % 8 != 0)
      return make_error(errc::malformed, std::string{what} + " of " +
                                             std::to_string(f.size()) +
                                             " bytes is not a Cap'n Proto message (it needs "
                                             "a whole number of 8-byte words, at least 2)");
    uint64_t segments = uint64_t{load_u32(f.data())} + 1;
    if (segments > max_segments)
      return make_error(errc::malformed, std::string{what} + " claims " +
                                             std::to_string(segments) +
                                             " segments; at most " +
                                             std::to_string(max_segments) + " are accepted");
    uint64_t table_bytes = (4 * (1 + segments) + 7) / 8 * 8;
    if (table_bytes > f.size())
      return make_error(errc::malformed, std::string{what} + " is truncated in its segment table");
    uint64_t total = table_bytes;
    for (uint64_t i = 0; i < segments; ++i) {
      uint32_t words = load_u32(f.data() + 4 + 4 * i);
      if (i == 0 && words == 0)
        return make_error(errc::malformed, std::string{what} + " has an empty first segment");
      total += uint64_t{words} * 8; // at most 16 * 2^35: no overflow
    }
    if (total != f.size())
      return make_error(errc::malformed,
                        std::string{what} + "'s segment table describes " +
                            std::to_string(total) + " bytes but it has " +
                            std::to_string(f.size()) +
                            (total > f.size() ? " (truncated)" : " (trailing bytes)"));
    frame_words out;
    if (reinterpret_cast<uintptr_t>(f.data()) % alignof(capnp::word) == 0) {
      out.words_ = {reinterpret_cast<const capnp::word*>(f.data()), f.size() / 8};
    } else {
      out.copy_ = std::make_unique<uint64_t[]>(f.size() / 8);
      std::memcpy(out.copy_.get(), f.data(), f.size());
      out.words_ = {reinterpret_cast<const capnp::word*>(out.copy_.get()), f.size() / 8};
    }
    return out;
  }

private:
  std::unique_ptr<uint64_t[]> copy_;
  kj::ArrayPtr<const capnp::word> words_;
};

capnp::ReaderOptions reader_options(const frame_words& f) noexcept {
  capnp::ReaderOptions o;
  // A message that is read once, field by field, traverses fewer words than it
  // has; pointers aimed at the same bytes again and again run out of this.
  o.traversalLimitInWords = f.words().size();
  o.nestingLimit = nesting_limit;
  return o;
}

// Cap'n Proto's description of what it refused. It may quote bytes of the frame
// (even NUL), so keep it short and printable: it goes back to the sender and into
// logs.
error malformed_by(const kj::Exception& e, std::string_view what) {
  auto desc = e.getDescription();
  std::string out = std::string{what} + " is malformed: ";
  size_t n = std::min<size_t>(desc.size(), 240);
  for (size_t i = 0; i < n; ++i) {
    auto c = static_cast<unsigned char>(desc[i]);
    out += c >= 0x20 && c <= 0x7e ? static_cast<char>(c) : '?';
  }
  if (n < desc.size())
    out += "...";
  return make_error(errc::malformed, std::move(out));
}

std::string copy_text(capnp::Text::Reader t) { return {t.cStr(), t.size()}; }
std::string copy_data(capnp::Data::Reader d) {
  return {reinterpret_cast<const char*>(d.begin()), d.size()};
}

std::vector<chronus_metric> copy_metrics(capnp::List<wire::Metric>::Reader list) {
  std::vector<chronus_metric> out;
  // At most 64 are allowed, but take them all (bounded by the frame's size: each
  // costs at least 8 bytes of it) so that the check can say how many there were.
  out.reserve(list.size());
  for (auto m : list)
    out.push_back({copy_text(m.getKey()), m.getValue()});
  return out;
}

// ---- building ---------------------------------------------------------------------

// Words of a text or data field of n bytes (text adds its NUL), plus its pointer.
size_t words_for(size_t n) noexcept { return (n + 1 + 7) / 8 + 1; }

// Builds a message with `fill` into one segment of at least `hint` words (so that
// tools/chronus/chronus.h, which reads single segments only, can read it) and
// returns its flat bytes.
template <class Root, class Fill>
std::string build(size_t hint, Fill&& fill) {
  for (;;) {
    capnp::MallocMessageBuilder message(static_cast<unsigned>(hint),
                                        capnp::AllocationStrategy::FIXED_SIZE);
    fill(message.initRoot<Root>());
    if (message.getSegmentsForOutput().size() != 1) {
      hint *= 2; // the estimate was short: not expected, but stay single-segment
      continue;
    }
    auto words = capnp::messageToFlatArray(message);
    auto bytes = words.asBytes();
    return {reinterpret_cast<const char*>(bytes.begin()), bytes.size()};
  }
}

void set_text(capnp::Text::Builder t, std::string_view s) {
  if (!s.empty())
    std::memcpy(t.begin(), s.data(), s.size());
}

capnp::Data::Reader data_of(std::string_view s) {
  return {reinterpret_cast<const capnp::byte*>(s.data()), s.size()};
}

template <class Builder>
void set_metrics(Builder list, const std::vector<chronus_metric>& metrics) {
  for (size_t i = 0; i < metrics.size(); ++i) {
    auto m = list[static_cast<unsigned>(i)];
    set_text(m.initKey(static_cast<unsigned>(metrics[i].key.size())), metrics[i].key);
    m.setValue(metrics[i].value);
  }
}

size_t body_words(const std::string& text, const std::vector<chronus_metric>& metrics,
                  const std::string& payload) noexcept {
  size_t n = 8 + words_for(text.size()) + words_for(payload.size()) + 1;
  for (const auto& m : metrics)
    n += 2 + words_for(m.key.size());
  return n;
}

void fill_feedback(wire::Feedback::Builder b, const chronus_feedback& f) {
  b.setRequestId(f.request_id);
  b.setReward(f.reward);
  set_text(b.initText(static_cast<unsigned>(f.text.size())), f.text);
  b.setData(data_of(f.data));
  b.setDone(f.done);
}

size_t feedback_words(const chronus_feedback& f) noexcept {
  return 8 + words_for(f.text.size()) + words_for(f.data.size());
}

chronus_feedback read_feedback(wire::Feedback::Reader r) {
  chronus_feedback f;
  f.request_id = r.getRequestId();
  f.reward = r.getReward();
  f.text = copy_text(r.getText());
  f.data = copy_data(r.getData());
  f.done = r.getDone();
  return f;
}

} // namespace

// ---- requests -----------------------------------------------------------------------

namespace {
expected<chronus_request> decode_request_impl(std::span<const std::byte> frame,
                                              const chronus_token* expected_token);
} // namespace

expected<chronus_request> decode_request(std::span<const std::byte> frame,
                                         const chronus_token& expected_token) {
  return decode_request_impl(frame, &expected_token);
}

expected<chronus_request> decode_trusted_request(std::span<const std::byte> frame) {
  return decode_request_impl(frame, nullptr);
}

namespace {

expected<chronus_request> decode_request_impl(std::span<const std::byte> frame,
                                              const chronus_token* expected_token) {
  DSEC_TRY(words, frame_words::check(frame, "request frame"));
  chronus_request out;
  try {
    capnp::FlatArrayMessageReader message(words.words(), reader_options(words));
    auto root = message.getRoot<wire::Request>();
    // The token first: nothing else of a stranger's frame is looked at.
    auto token = root.getToken();
    if (expected_token
        && !expected_token->matches({reinterpret_cast<const std::byte*>(token.begin()),
                                     token.size()}))
      return make_error(errc::unauthenticated,
                        token.size() == chronus_token_size
                            ? std::string{"request frame has the wrong token"}
                            : "request frame has a token of " + std::to_string(token.size()) +
                                  " bytes, not " + std::to_string(chronus_token_size));
    switch (root.which()) {
      case wire::Request::STAGE:
        out.kind = chronus_kind::stage;
        out.text = copy_text(root.getStage());
        break;
      case wire::Request::REPORT:
        out.kind = chronus_kind::report;
        out.metrics = copy_metrics(root.getReport());
        break;
      case wire::Request::LOG:
        out.kind = chronus_kind::log;
        out.text = copy_text(root.getLog());
        break;
      case wire::Request::FEEDBACK: {
        out.kind = chronus_kind::feedback;
        auto ask = root.getFeedback();
        out.payload = copy_data(ask.getPayload());
        out.timeout_ms = ask.getTimeoutMs();
        break;
      }
      default:
        return make_error(errc::malformed,
                          "request frame has an unknown kind (union tag " +
                              std::to_string(static_cast<unsigned>(root.which())) + ")");
    }
  } catch (const kj::Exception& e) {
    return malformed_by(e, "request frame");
  }
  DSEC_TRY_VOID(check_request(out));
  return out;
}

} // namespace

std::string encode_request(const chronus_token& token, const chronus_request& r) {
  return build<wire::Request>(body_words(r.text, r.metrics, r.payload) + 8,
                              [&](wire::Request::Builder b) {
    auto t = token.bytes();
    b.setToken({reinterpret_cast<const capnp::byte*>(t.data()), t.size()});
    switch (r.kind) {
      case chronus_kind::stage:
        set_text(b.initStage(static_cast<unsigned>(r.text.size())), r.text);
        break;
      case chronus_kind::report:
        set_metrics(b.initReport(static_cast<unsigned>(r.metrics.size())), r.metrics);
        break;
      case chronus_kind::log:
        set_text(b.initLog(static_cast<unsigned>(r.text.size())), r.text);
        break;
      case chronus_kind::feedback: {
        auto ask = b.initFeedback();
        ask.setPayload(data_of(r.payload));
        ask.setTimeoutMs(r.timeout_ms);
        break;
      }
      case chronus_kind::lost:
      case chronus_kind::denied:
        break; // not a request (check_request refuses it)
    }
  });
}

// ---- replies ------------------------------------------------------------------------

std::string encode_reply_ack() {
  return build<wire::Reply>(4, [](wire::Reply::Builder b) { b.setAck(); });
}

std::string encode_reply_feedback(const chronus_feedback& f) {
  return build<wire::Reply>(feedback_words(f) + 4, [&](wire::Reply::Builder b) {
    fill_feedback(b.initFeedback(), f);
  });
}

std::string encode_reply_rejected(std::string_view why) {
  return build<wire::Reply>(words_for(why.size()) + 4, [&](wire::Reply::Builder b) {
    set_text(b.initRejected(static_cast<unsigned>(why.size())), why);
  });
}

std::string encode_reply_timed_out() {
  return build<wire::Reply>(4, [](wire::Reply::Builder b) { b.setTimedOut(); });
}

std::string encode_reply_session_gone() {
  return build<wire::Reply>(4, [](wire::Reply::Builder b) { b.setSessionGone(); });
}

expected<chronus_reply> decode_reply(std::span<const std::byte> frame) {
  DSEC_TRY(words, frame_words::check(frame, "reply frame"));
  chronus_reply out;
  try {
    capnp::FlatArrayMessageReader message(words.words(), reader_options(words));
    auto root = message.getRoot<wire::Reply>();
    switch (root.which()) {
      case wire::Reply::ACK: out.kind = chronus_reply_kind::ack; break;
      case wire::Reply::FEEDBACK:
        out.kind = chronus_reply_kind::feedback;
        out.feedback = read_feedback(root.getFeedback());
        break;
      case wire::Reply::REJECTED:
        out.kind = chronus_reply_kind::rejected;
        out.reason = copy_text(root.getRejected());
        break;
      case wire::Reply::TIMED_OUT: out.kind = chronus_reply_kind::timed_out; break;
      case wire::Reply::SESSION_GONE: out.kind = chronus_reply_kind::session_gone; break;
      default:
        return make_error(errc::malformed,
                          "reply frame has an unknown kind (union tag " +
                              std::to_string(static_cast<unsigned>(root.which())) + ")");
    }
  } catch (const kj::Exception& e) {
    return malformed_by(e, "reply frame");
  }
  if (out.kind == chronus_reply_kind::feedback)
    DSEC_TRY_VOID(check_feedback(out.feedback));
  return out;
}

// ---- events -------------------------------------------------------------------------

std::string encode_event(std::string_view sandbox_id, uint64_t seq, uint64_t monotonic_ns,
                         const chronus_request& r) {
  size_t hint = body_words(r.text, r.metrics, r.payload) + words_for(sandbox_id.size()) + 8;
  return build<wire::Event>(hint, [&](wire::Event::Builder b) {
    set_text(b.initSandboxId(static_cast<unsigned>(sandbox_id.size())), sandbox_id);
    b.setSeq(seq);
    b.setMonotonicNs(monotonic_ns);
    switch (r.kind) {
      case chronus_kind::stage:
        set_text(b.initStage(static_cast<unsigned>(r.text.size())), r.text);
        break;
      case chronus_kind::report:
        set_metrics(b.initReport(static_cast<unsigned>(r.metrics.size())), r.metrics);
        break;
      case chronus_kind::log:
        set_text(b.initLog(static_cast<unsigned>(r.text.size())), r.text);
        break;
      case chronus_kind::feedback: {
        auto fr = b.initFeedbackRequest();
        fr.setId(seq);
        fr.setPayload(data_of(r.payload));
        break;
      }
      case chronus_kind::lost:
        set_text(b.initLost(static_cast<unsigned>(r.text.size())), r.text);
        break;
      case chronus_kind::denied:
        set_text(b.initDenied(static_cast<unsigned>(r.text.size())), r.text);
        break;
    }
  });
}

namespace {
// An Event of the daemon's own (seq 0): lost, denied.
std::string node_event(chronus_kind kind, std::string_view sandbox_id, uint64_t monotonic_ns,
                       std::string_view text) {
  chronus_request r;
  r.kind = kind;
  r.text = std::string{text.substr(0, chronus_max_log)};
  return encode_event(sandbox_id, 0, monotonic_ns, r);
}
} // namespace

std::string encode_lost_event(std::string_view sandbox_id, uint64_t monotonic_ns,
                              std::string_view why) {
  return node_event(chronus_kind::lost, sandbox_id, monotonic_ns, why);
}

std::string encode_denied_event(std::string_view sandbox_id, uint64_t monotonic_ns,
                                std::string_view what) {
  return node_event(chronus_kind::denied, sandbox_id, monotonic_ns, what);
}

expected<chronus_event> decode_event(std::span<const std::byte> bytes) {
  DSEC_TRY(words, frame_words::check(bytes, "event"));
  chronus_event out;
  try {
    capnp::FlatArrayMessageReader message(words.words(), reader_options(words));
    auto root = message.getRoot<wire::Event>();
    out.sandbox_id = copy_text(root.getSandboxId());
    out.seq = root.getSeq();
    out.monotonic_ns = root.getMonotonicNs();
    switch (root.which()) {
      case wire::Event::STAGE:
        out.kind = chronus_kind::stage;
        out.text = copy_text(root.getStage());
        break;
      case wire::Event::REPORT:
        out.kind = chronus_kind::report;
        out.metrics = copy_metrics(root.getReport());
        break;
      case wire::Event::FEEDBACK_REQUEST: {
        out.kind = chronus_kind::feedback;
        auto fr = root.getFeedbackRequest();
        if (fr.getId() != out.seq)
          return invalid("event " + std::to_string(out.seq) + " carries feedback request " +
                         std::to_string(fr.getId()) + "; the two must be equal");
        out.payload = copy_data(fr.getPayload());
        break;
      }
      case wire::Event::LOG:
        out.kind = chronus_kind::log;
        out.text = copy_text(root.getLog());
        break;
      case wire::Event::LOST:
        out.kind = chronus_kind::lost;
        out.text = copy_text(root.getLost());
        break;
      case wire::Event::DENIED:
        out.kind = chronus_kind::denied;
        out.text = copy_text(root.getDenied());
        break;
      default:
        return make_error(errc::malformed,
                          "event has an unknown kind (union tag " +
                              std::to_string(static_cast<unsigned>(root.which())) + ")");
    }
  } catch (const kj::Exception& e) {
    return malformed_by(e, "event");
  }
  DSEC_TRY_VOID(check_printable(out.sandbox_id, "event's sandbox id", chronus_max_sandbox_id));
  if (out.seq == 0 && out.kind != chronus_kind::lost && out.kind != chronus_kind::denied)
    return invalid("event of sandbox " + out.sandbox_id + " has seq 0 (they start at 1)");
  DSEC_TRY_VOID(check_body(out.kind, out.text, out.metrics, out.payload));
  return out;
}

// ---- feedback -----------------------------------------------------------------------

std::string encode_feedback(const chronus_feedback& f) {
  return build<wire::Feedback>(feedback_words(f),
                               [&](wire::Feedback::Builder b) { fill_feedback(b, f); });
}

expected<chronus_feedback> decode_feedback(std::span<const std::byte> bytes) {
  DSEC_TRY(words, frame_words::check(bytes, "feedback"));
  chronus_feedback out;
  try {
    capnp::FlatArrayMessageReader message(words.words(), reader_options(words));
    out = read_feedback(message.getRoot<wire::Feedback>());
  } catch (const kj::Exception& e) {
    return malformed_by(e, "feedback");
  }
  DSEC_TRY_VOID(check_feedback(out));
  return out;
}

} // namespace dsec

// Chronus's plain values (see chronus.hpp): the checks of requests, events and
// feedback against the limits, the names of the kinds, and event_to_json. No Cap'n
// Proto here: the frames are chronus.cpp, the token and rate limit chronus_token.cpp.
#include "runtime/chronus.hpp"

#include <cmath>
#include <string>

#include "runtime/chronus_detail.hpp"
#include "runtime/json.hpp"

namespace dsec {

namespace chronus_detail {

namespace {

std::string quoted(std::string_view s) {
  std::string out = "'";
  out += s;
  out += "'";
  return out;
}

expected<void> check_text(std::string_view s, std::string_view what, size_t limit) {
  if (s.size() > limit)
    return invalid(std::string{what} + " of " + std::to_string(s.size()) +
                   " bytes is over the limit of " + std::to_string(limit));
  auto p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    if (p[i] == 0)
      return invalid(std::string{what} + " has a NUL byte at offset " + std::to_string(i));
    size_t len = utf8_sequence(p + i, s.size() - i);
    if (len == 0)
      return invalid(std::string{what} + " is not valid UTF-8 at offset " + std::to_string(i));
    i += len;
  }
  return {};
}

expected<void> check_bytes(std::string_view s, std::string_view what, size_t limit) {
  if (s.size() > limit)
    return invalid(std::string{what} + " of " + std::to_string(s.size()) +
                   " bytes is over the limit of " + std::to_string(limit));
  return {};
}

expected<void> check_metrics(const std::vector<chronus_metric>& metrics) {
  if (metrics.empty())
    return invalid("report has no metrics");
  if (metrics.size() > chronus_max_metrics)
    return invalid("report has " + std::to_string(metrics.size()) +
                   " metrics; the limit is " + std::to_string(chronus_max_metrics));
  for (size_t i = 0; i < metrics.size(); ++i) {
    const auto& m = metrics[i];
    DSEC_TRY_VOID(check_printable(m.key, "report metric " + std::to_string(i) + "'s key",
                                  chronus_max_key));
    if (!std::isfinite(m.value))
      return invalid("report metric " + quoted(m.key) + " is not a finite number");
    for (size_t j = 0; j < i; ++j) // at most 64 * 63 / 2 short comparisons
      if (metrics[j].key == m.key)
        return invalid("report metric " + quoted(m.key) + " appears twice");
  }
  return {};
}

} // namespace

error invalid(std::string message) {
  return make_error(errc::invalid_argument, std::move(message));
}

expected<void> check_printable(std::string_view s, std::string_view what, size_t limit) {
  if (s.empty())
    return invalid(std::string{what} + " is empty");
  if (s.size() > limit)
    return invalid(std::string{what} + " of " + std::to_string(s.size()) +
                   " bytes is over the limit of " + std::to_string(limit));
  for (size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c > 0x7e) {
      static const char hex[] = "0123456789abcdef";
      return invalid(std::string{what} + " has byte 0x" + hex[c >> 4] + hex[c & 15] +
                     " at offset " + std::to_string(i) +
                     ", which is not printable ASCII");
    }
  }
  return {};
}

expected<void> check_body(chronus_kind kind, const std::string& text,
                          const std::vector<chronus_metric>& metrics,
                          const std::string& payload) {
  switch (kind) {
    case chronus_kind::stage: return check_printable(text, "stage name", chronus_max_stage);
    case chronus_kind::report: return check_metrics(metrics);
    case chronus_kind::log: return check_text(text, "log line", chronus_max_log);
    case chronus_kind::feedback:
      return check_bytes(payload, "feedback payload", chronus_max_payload);
    case chronus_kind::lost: return check_text(text, "lost reason", chronus_max_log);
    case chronus_kind::denied: return check_printable(text, "denied destination", chronus_max_log);
  }
  return invalid("unknown request kind");
}

} // namespace chronus_detail

using namespace chronus_detail;

const char* to_string(chronus_kind kind) noexcept {
  switch (kind) {
    case chronus_kind::stage: return "stage";
    case chronus_kind::report: return "report";
    case chronus_kind::log: return "log";
    case chronus_kind::feedback: return "feedback";
    case chronus_kind::lost: return "lost";
    case chronus_kind::denied: return "denied";
  }
  return "unknown";
}

expected<void> check_request(const chronus_request& r) {
  if (r.kind == chronus_kind::lost)
    return invalid("'lost' is an event of the coordinator, not a request");
  if (r.kind == chronus_kind::denied)
    return invalid("'denied' is an event of the node, not a request");
  return check_body(r.kind, r.text, r.metrics, r.payload);
}

expected<void> check_feedback(const chronus_feedback& f) {
  if (!std::isfinite(f.reward))
    return invalid("feedback reward is not a finite number");
  DSEC_TRY_VOID(check_text(f.text, "feedback text", chronus_max_feedback_text));
  return check_bytes(f.data, "feedback data", chronus_max_feedback_data);
}

// ---- JSON ---------------------------------------------------------------------------

std::string event_to_json(const chronus_event& e) {
  std::string out = "{\"sandbox\":";
  json_string(out, e.sandbox_id);
  out += ",\"seq\":" + std::to_string(e.seq);
  out += ",\"monotonic_ns\":" + std::to_string(e.monotonic_ns);
  out += ",\"kind\":\"";
  out += to_string(e.kind);
  out += '"';
  switch (e.kind) {
    case chronus_kind::stage:
      out += ",\"stage\":";
      json_string(out, e.text);
      break;
    case chronus_kind::report:
      out += ",\"metrics\":{";
      for (size_t i = 0; i < e.metrics.size(); ++i) {
        if (i)
          out += ',';
        json_string(out, e.metrics[i].key);
        out += ':';
        json_number(out, e.metrics[i].value);
      }
      out += '}';
      break;
    case chronus_kind::log:
      out += ",\"log\":";
      json_string(out, e.text);
      break;
    case chronus_kind::feedback:
      out += ",\"id\":" + std::to_string(e.seq);
      out += ",\"payload_base64\":";
      json_base64(out, e.payload);
      break;
    case chronus_kind::lost:
      out += ",\"why\":";
      json_string(out, e.text);
      break;
    case chronus_kind::denied:
      out += ",\"destination\":";
      json_string(out, e.text);
      break;
  }
  out += '}';
  return out;
}

} // namespace dsec

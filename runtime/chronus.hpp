// Chronus frames: checking what a sandbox sends, and the messages that carry it on.
//
// The wire contract is capnp/chronus.capnp. This header shows no Cap'n Proto type:
// frames go in as bytes and come out as the plain structs below, and the encoders
// return bytes. Everything here is pure logic except chronus_token::generate
// (getrandom), so the node's endpoint (io_uring), the actors and the fuzzer
// (test/fuzz/chronus_frame_fuzz.cpp) all call the same code.
//
// A frame from a sandbox is untrusted. decode_request never crashes, throws, reads
// outside the frame or allocates more than a small multiple of the frame's size,
// whatever the bytes are; it checks, in this order:
//   1. the size (at most chronus_max_frame)                    errc::too_large
//   2. the framing: segment table, segment sizes, no trailing
//      bytes; then Cap'n Proto's own pointer checks with a
//      traversal limit of the frame's size and a nesting limit   errc::malformed
//   3. the token, compared in constant time                      errc::unauthenticated
//   4. the fields against the limits below                       errc::invalid_argument
// The error's message names what was wrong (never the token's bytes).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.hpp"

namespace dsec {

// ---- limits ---------------------------------------------------------------------

/// Largest frame in either direction (Request, Reply, Event, Feedback), in bytes.
inline constexpr size_t chronus_max_frame = 65536;
/// A token is exactly this many bytes (64 hex characters in the environment).
inline constexpr size_t chronus_token_size = 32;
/// A stage name: 1..128 bytes of printable ASCII (0x20..0x7e).
inline constexpr size_t chronus_max_stage = 128;
/// A report: 1..64 metrics.
inline constexpr size_t chronus_max_metrics = 64;
/// A metric key: 1..128 bytes of printable ASCII, unique within its report.
inline constexpr size_t chronus_max_key = 128;
/// A log line: valid UTF-8 without NUL, at most 16 KiB.
inline constexpr size_t chronus_max_log = 16 * 1024;
/// A feedback request's payload: any bytes, at most 32 KiB.
inline constexpr size_t chronus_max_payload = 32 * 1024;
/// A Feedback's text (valid UTF-8 without NUL) and data (any bytes).
inline constexpr size_t chronus_max_feedback_text = 16 * 1024;
inline constexpr size_t chronus_max_feedback_data = 32 * 1024;
/// An Event's sandbox id: 1..128 bytes of printable ASCII.
inline constexpr size_t chronus_max_sandbox_id = 128;

// ---- the token --------------------------------------------------------------------

/// A sandbox's Chronus secret: 32 random bytes, which every Request on
/// /run/chronus.sock must carry. It never leaves the node: trusted commands
/// reach Chronus over their trusted channel instead (chronus_channel_hello), so
/// no process in the sandbox has it and every frame on that socket is refused.
class chronus_token {
public:
  /// All zero bytes: matches no generated token in practice; for tests and defaults.
  chronus_token() noexcept = default;
  explicit chronus_token(const std::array<std::byte, chronus_token_size>& bytes) noexcept
      : bytes_(bytes) {}

  /// 32 bytes from getrandom(2) (blocks only before the kernel's pool is ready).
  [[nodiscard]] static expected<chronus_token> generate();
  /// Parses 64 hex characters (either case); errc::invalid_argument otherwise.
  [[nodiscard]] static expected<chronus_token> from_hex(std::string_view hex);

  /// 64 lower-case hex characters.
  [[nodiscard]] std::string to_hex() const;
  [[nodiscard]] std::span<const std::byte, chronus_token_size> bytes() const noexcept {
    return bytes_;
  }
  /// True when `other` is exactly these 32 bytes. Takes the same time whatever
  /// the bytes are (a different length returns at once: lengths are not secret).
  [[nodiscard]] bool matches(std::span<const std::byte> other) const noexcept;

private:
  std::array<std::byte, chronus_token_size> bytes_{};
};

// ---- messages, as plain values -----------------------------------------------------

/// What a Request (and the Event made of it) carries; the union of the schema.
enum class chronus_kind : uint8_t {
  stage,    ///< text: the stage name
  report,   ///< metrics
  log,      ///< text: the log line
  feedback, ///< payload (and, in a Request, timeout_ms): a feedback request
  lost,     ///< text: why; an Event only, made by the coordinator (docs/cluster.md)
  denied,   ///< text: "PROTO ADDR:PORT" or "dns NAME"; an Event only, made by the node (docs/network.md)
};

/// "stage", "report", "log", "feedback", "lost", "denied".
const char* to_string(chronus_kind kind) noexcept;

struct chronus_metric {
  std::string key;
  double value = 0;
  bool operator==(const chronus_metric&) const = default;
};

/// A checked Request from a sandbox. Only the members of `kind` are set.
struct chronus_request {
  chronus_kind kind = chronus_kind::stage;
  std::string text;                    ///< stage: the name; log: the line
  std::vector<chronus_metric> metrics; ///< report
  std::string payload;                 ///< feedback: opaque bytes
  uint32_t timeout_ms = 0;             ///< feedback: 0 waits as long as the session lives
  bool operator==(const chronus_request&) const = default;
};

/// The trainer's answer to the feedback request whose event had seq == request_id.
struct chronus_feedback {
  uint64_t request_id = 0;
  double reward = 0;  ///< finite
  std::string text;   ///< valid UTF-8 without NUL, at most chronus_max_feedback_text
  std::string data;   ///< any bytes, at most chronus_max_feedback_data
  bool done = false;
  bool operator==(const chronus_feedback&) const = default;
};

/// A Request as the session sees it: stamped with where and when it came from.
/// For kind::feedback, the feedback request's id is `seq`.
struct chronus_event {
  std::string sandbox_id;
  uint64_t seq = 0;          ///< per sandbox, from 1
  uint64_t monotonic_ns = 0; ///< CLOCK_MONOTONIC when the node read the frame
  chronus_kind kind = chronus_kind::stage;
  std::string text;                    ///< stage: the name; log: the line
  std::vector<chronus_metric> metrics; ///< report
  std::string payload;                 ///< feedback: the request's payload
  /// Not sent by the node now but again by a resumed session, from its
  /// trajectory log (docs/trajectory.md); set by dsec::client, never encoded.
  bool replayed = false;
  /// A replayed feedback request: the trainer's answer the log kept, if any.
  std::optional<chronus_feedback> answer;
  bool operator==(const chronus_event&) const = default;
};

enum class chronus_reply_kind : uint8_t { ack, feedback, rejected, timed_out, session_gone };

/// A Reply, node -> sandbox. Only the member of `kind` is set.
struct chronus_reply {
  chronus_reply_kind kind = chronus_reply_kind::ack;
  chronus_feedback feedback; ///< kind::feedback
  std::string reason;        ///< kind::rejected: why
  bool operator==(const chronus_reply&) const = default;
};

// ---- checks -------------------------------------------------------------------------

/// The field limits above, for a request built in C++ (decode_request applies them
/// itself). errc::invalid_argument naming the field.
expected<void> check_request(const chronus_request& request);
/// The Feedback limits: finite reward, text and data sizes, UTF-8 text. Check a
/// trainer's feedback before encoding it: the encoders do not refuse anything.
expected<void> check_feedback(const chronus_feedback& feedback);

// ---- sandbox -> node --------------------------------------------------------------

/// Checks and decodes one Request frame (one SOCK_SEQPACKET packet); see the top of
/// this file for the checks and their error codes. Reads the frame in place when
/// it is 8-byte aligned, else copies it once into an aligned buffer.
expected<chronus_request> decode_request(std::span<const std::byte> frame,
                                         const chronus_token& expected_token);
/// The same for a frame from a connection that is trusted by how it was made
/// (one a trusted command opened over its trusted channel): the token field is
/// not looked at (step 3 is skipped); everything else is checked alike.
expected<chronus_request> decode_trusted_request(std::span<const std::byte> frame);

/// What a trusted command sends over its trusted channel (fd 3, $CHRONUS_FD)
/// to open a connection: exactly these bytes in one packet, with one descriptor
/// attached (SCM_RIGHTS), its end of a fresh SOCK_SEQPACKET socketpair. The node
/// serves that end from then on as a trusted connection: Requests with any
/// token (tools/chronus/chronus.h sends zeros), one Reply each, as on
/// /run/chronus.sock. Anything else on the channel is refused (malformed) and
/// its descriptors closed.
inline constexpr std::string_view chronus_channel_hello = "dsec-chronus-connect";

/// Encodes a Request frame exactly as tools/chronus/chronus.h does (one segment,
/// unpacked). It does not check the request: decode_request does. For C++ clients,
/// tests and the fuzz corpus.
std::string encode_request(const chronus_token& token, const chronus_request& request);

// ---- node -> sandbox --------------------------------------------------------------

/// Reply frames. Each is a single segment, so tools/chronus/chronus.h can read it;
/// a feedback that passes check_feedback always fits in chronus_max_frame.
std::string encode_reply_ack();
std::string encode_reply_feedback(const chronus_feedback& feedback);
std::string encode_reply_rejected(std::string_view why);
std::string encode_reply_timed_out();
std::string encode_reply_session_gone();

/// Decodes a Reply frame (framing checked as for a Request; a feedback is checked
/// with check_feedback). The sandbox side in C++; tests.
expected<chronus_reply> decode_reply(std::span<const std::byte> frame);

// ---- node -> session, and trainer -> sandbox --------------------------------------

/// The Event for a checked request. `sandbox_id` should be the node's id of the
/// sandbox (printable ASCII, at most chronus_max_sandbox_id bytes).
std::string encode_event(std::string_view sandbox_id, uint64_t seq, uint64_t monotonic_ns,
                         const chronus_request& request);

/// The Event saying that a sandbox was lost with its node (seq 0): the
/// coordinator's, never a sandbox's.
std::string encode_lost_event(std::string_view sandbox_id, uint64_t monotonic_ns,
                              std::string_view why);

/// The Event saying that an egress sandbox was denied a destination (seq 0):
/// its node's, never a sandbox's. `what` is "PROTO ADDR:PORT".
std::string encode_denied_event(std::string_view sandbox_id, uint64_t monotonic_ns,
                                std::string_view what);

/// Decodes Event bytes with the same framing checks as a Request and the same
/// field limits, plus: a non-empty printable sandbox id, seq >= 1 (0 for lost and denied), and a feedback
/// request's id equal to seq. Zero-copy: Cap'n Proto reads the bytes in place
/// (capnp::FlatArrayMessageReader over them) when they are 8-byte aligned, which a
/// std::string's or a vector's heap buffer is; otherwise they are copied once into
/// an aligned buffer. The returned value owns copies of its strings either way.
expected<chronus_event> decode_event(std::span<const std::byte> bytes);

/// Feedback bytes (trainer -> session -> node).
std::string encode_feedback(const chronus_feedback& feedback);
/// Decodes Feedback bytes (zero-copy as decode_event) and applies check_feedback.
expected<chronus_feedback> decode_feedback(std::span<const std::byte> bytes);

/// Bytes of a string, for the decoders above.
inline std::span<const std::byte> as_bytes(std::string_view s) noexcept {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

/// One line of JSON without the trailing newline (`dsec session watch` prints it):
///   {"sandbox":"ab12","seq":3,"monotonic_ns":123,"kind":"stage","stage":"test"}
///   ... "kind":"report","metrics":{"loss":0.25,"acc":0.5}
///   ... "kind":"log","log":"text"
///   ... "kind":"feedback","id":3,"payload_base64":"aGk="
/// Strings are escaped (control characters as \uXXXX; bytes that are not UTF-8
/// become U+FFFD), numbers use the shortest form that reads back the same, and a
/// value JSON cannot hold (NaN, infinity) is written as null.
std::string event_to_json(const chronus_event& event);

// ---- rate limit -------------------------------------------------------------------

/// A token bucket per sandbox: `rate` frames a second sustained, bursts of up to
/// `burst`. Pure logic: the caller passes the time (CLOCK_MONOTONIC ns, say).
/// A clock that steps backwards refills nothing.
class chronus_rate_limiter {
public:
  struct config {
    uint32_t rate = 1000;  ///< frames per second, sustained
    uint32_t burst = 2000; ///< frames allowed at once; the bucket's size
  };

  /// A full bucket at time `now_ns`.
  explicit chronus_rate_limiter(config cfg, uint64_t now_ns) noexcept;
  chronus_rate_limiter() noexcept : chronus_rate_limiter(config{}, 0) {}

  /// Takes one frame's token if there is one (true), else refuses (false).
  [[nodiscard]] bool admit(uint64_t now_ns) noexcept;
  /// Whole frames the bucket would admit at `now_ns` (does not take any).
  [[nodiscard]] uint64_t available(uint64_t now_ns) const noexcept;

private:
  [[nodiscard]] uint64_t level_at(uint64_t now_ns) const noexcept;

  config cfg_;
  uint64_t level_;   ///< tokens in the bucket, in units of 1e-9 token
  uint64_t last_ns_; ///< when level_ was computed
};

} // namespace dsec

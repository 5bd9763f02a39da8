// chronus_endpoint: the node's end of every sandbox's /run/chronus.sock.
//
// One per node. Each sandbox created with Chronus has a listening
// SOCK_SEQPACKET socket (container::release_chronus_fd), which the agent can
// reach, and the node's end of its trusted channel (release_channel_fd), which
// only trusted commands hold; add() hands both here, with the sandbox's token
// and where its events go. Everything runs on the reactor's io_uring thread: it
// accepts connections on the socket (frames must carry the token); on the
// channel it takes each packet's descriptor as a trusted connection
// (chronus_channel_hello: no token, a rate limit and a connection cap of their
// own, so nothing the agent does on the socket can starve it); it reads one
// frame per packet, and for each frame
//   - refuses it when the sandbox's rate limit is spent (counted as flooding),
//   - checks and decodes it (runtime/chronus.hpp: size, framing, token, fields;
//     each refusal is counted under its reason and answered with a Reply
//     `rejected` naming what was wrong),
//   - stamps it (sandbox id, seq from 1, CLOCK_MONOTONIC) into Event bytes and
//     calls the sandbox's event callback with them (on the reactor thread: the
//     callback must only post, e.g. send actor mail),
//   - answers `ack` at once for stage, report and log; a feedback request
//     waits, its connection remembered under the request id (the event's seq),
//     until answer() or until the client hangs up.
// A sender that misbehaves only loses its own frames or connection: the node
// and the other sandboxes are unaffected.
//
// Thread-safe: the public calls post to the reactor thread. Counters are
// atomics readable from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/chronus.hpp"
#include "runtime/error.hpp"
#include "runtime/fd.hpp"

namespace dsec {

class reactor;

/// Limits of a chronus_endpoint.
struct chronus_endpoint_config {
  chronus_rate_limiter::config rate; ///< per sandbox, over all its connections
  /// Open connections per sandbox on /run/chronus.sock. Each is a descriptor of
  /// the node's.
  uint32_t max_connections = 32;
  /// Open trusted connections per sandbox (over its trusted channel), counted
  /// apart. Each `chronus` call of a trusted command is one; a grader rarely
  /// needs more than a few at once.
  uint32_t max_trusted_connections = 32;
};

class chronus_endpoint {
public:
  using config = chronus_endpoint_config;

  /// What was refused, and why, since the endpoint started.
  struct counters {
    uint64_t frames = 0;          ///< packets read, accepted or not
    uint64_t events = 0;          ///< frames accepted and forwarded
    uint64_t too_large = 0;       ///< over chronus_max_frame
    uint64_t malformed = 0;       ///< not a well-formed Request
    uint64_t unauthenticated = 0; ///< the token did not match
    uint64_t invalid = 0;         ///< a field broke a limit
    uint64_t flooding = 0;        ///< over the sandbox's rate limit
    uint64_t connections = 0;     ///< accepted since start
    uint64_t refused_connections = 0; ///< over a connection cap, or no descriptor left
    uint64_t answered = 0;        ///< feedback replies delivered
    [[nodiscard]] uint64_t rejected() const {
      return too_large + malformed + unauthenticated + invalid + flooding;
    }
  };

  /// Gets a sandbox's Event bytes, on the reactor thread.
  using event_fn = std::function<void(std::string event)>;
  /// The outcome of answer(), on the reactor thread.
  using done_fn = std::function<void(expected<void>)>;

  /// `io` must outlive the endpoint.
  explicit chronus_endpoint(reactor& io, config cfg = {});
  /// Closes every socket (pending feedback requests just see the hang-up).
  /// Must run before the reactor is destroyed.
  ~chronus_endpoint();
  chronus_endpoint(const chronus_endpoint&) = delete;
  chronus_endpoint& operator=(const chronus_endpoint&) = delete;

  /// Serves a sandbox's listening socket and trusted channel (either may be
  /// empty) from now on. A second add() with the same id replaces the first.
  void add(std::string sandbox_id, unique_fd listener, unique_fd channel, chronus_token token,
           event_fn on_event);

  /// Stops serving a sandbox: its listener and connections are closed. With
  /// `session_gone`, pending feedback requests are first answered `sessionGone`.
  void remove(std::string sandbox_id, bool session_gone);

  /// Delivers `feedback` to the client waiting on feedback request
  /// `feedback.request_id` of the sandbox. `done` gets errc::not_found when no
  /// such request waits (answered already, its client gone, or never asked),
  /// errc::invalid_argument when the feedback breaks a limit.
  void answer(std::string sandbox_id, chronus_feedback feedback, done_fn done);

  /// answer(), waiting (at most `limit`) for the reactor thread's outcome;
  /// errc::timeout if it did not come.
  expected<void> answer_and_wait(std::string sandbox_id, chronus_feedback feedback,
                                 std::chrono::milliseconds limit = std::chrono::seconds(5));

  [[nodiscard]] counters stats() const;
  /// Sandboxes served now.
  [[nodiscard]] size_t sandboxes() const;

  // Defined in the .cpp. impl is shared with the reactor's callbacks, which may
  // run (cancelled) after this object is gone.
  struct impl;
  struct box;
  struct conn;

private:
  std::shared_ptr<impl> impl_;
};

} // namespace dsec

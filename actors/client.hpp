// dsec::client: the trainer's API. It talks to a dsecd over CAF's network layer
// (or to a daemon in the same process) and offers the verbs of the command line
// as blocking calls that are safe to make from several threads at once.
//
//   caf::actor_system sys{cfg};              // cfg: dsec::client::configure(cfg)
//   auto c = dsec::client::connect(sys, "127.0.0.1", 7070);
//   auto s = (*c)->open_session({.quota = 512});
//   auto ids = (*s)->create(env, 64, [](const std::string& id) { /* ready */ });
//   auto r = (*s)->exec(ids->front(), {.argv = {"make", "test"}});
//
// A session opened by a client is owned by it: when the client object goes away
// (or its process dies, or the connection drops) the daemon destroys the
// session's sandboxes. Errors carry the project's codes (dsec::errc) and the
// daemon's message.
#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "actors/interfaces.hpp"
#include "runtime/chronus.hpp"
#include "runtime/error.hpp"

namespace dsec {

/// Called with each piece of a streamed command's output: stream 1 stdout, 2 stderr.
using output_fn = std::function<void(uint8_t stream, std::string_view data)>;

class session;

/// A session's Chronus events as they come (session::watch). Pull them with
/// next(); dropping the object stops the watch. Thread-safe.
class event_stream {
public:
  /// The next event, waiting at most `timeout`: nullopt when none came in time;
  /// errc::disconnected once the session (or its daemon) is gone and every
  /// event before that was read.
  expected<std::optional<chronus_event>> next(std::chrono::milliseconds timeout);
  /// Events kept by the session while nobody watched, delivered first.
  [[nodiscard]] uint64_t backlog() const { return backlog_; }
  ~event_stream();
  event_stream(const event_stream&) = delete;
  event_stream& operator=(const event_stream&) = delete;

  struct queue;
  event_stream(std::shared_ptr<queue> q, caf::actor helper, uint64_t backlog)
    : q_(std::move(q)), helper_(std::move(helper)), backlog_(backlog) {}

private:
  std::shared_ptr<queue> q_;
  caf::actor helper_;
  uint64_t backlog_ = 0;
};

class client {
public:
  /// Prepares an actor system config for a client (middleman, message types).
  static void configure(caf::actor_system_config& cfg);

  /// Connects to the dsecd at host:port.
  static expected<std::unique_ptr<client>> connect(caf::actor_system& sys,
                                                   const std::string& host, uint16_t port);

  /// Uses a scheduler of this process (an embedded daemon).
  static std::unique_ptr<client> attach(caf::actor_system& sys, scheduler_actor scheduler);

  /// Opens a session owned by this client (closed when the client goes away).
  /// With `owned` false the session lives until it is closed explicitly (the
  /// command line's `session open`).
  expected<std::unique_ptr<session>> open_session(const session_options& opts = {},
                                                  bool owned = true);

  /// A handle on an existing session, by id; it does not close it when dropped.
  expected<std::unique_ptr<session>> find_session(const std::string& id);

  // By sandbox id, without a session (the command line's verbs).
  expected<exec_result> exec(const std::string& id, const exec_request& req,
                             const output_fn& on_output = {});
  expected<uint64_t> put(const std::string& id, const std::string& dir, std::string tar);
  expected<std::string> get(const std::string& id, const std::string& path);
  expected<void> destroy(const std::string& id);
  expected<std::vector<sandbox_info>> list();
  expected<node_stats> stats();
  /// Answers a Chronus feedback request of a sandbox (the request id is the
  /// event's seq): the `chronus feedback` waiting in it gets `fb`.
  expected<void> answer(const std::string& id, const chronus_feedback& fb);

  [[nodiscard]] caf::actor_system& system() { return *sys_; }
  [[nodiscard]] const scheduler_actor& scheduler() const { return scheduler_; }

  ~client();
  client(const client&) = delete;
  client& operator=(const client&) = delete;

private:
  friend class session;
  client(caf::actor_system& sys, scheduler_actor scheduler);

  caf::actor_system* sys_;
  scheduler_actor scheduler_;
  caf::actor identity_; // what owned sessions monitor
};

class session {
public:
  [[nodiscard]] const std::string& id() const { return id_; }

  /// Creates `count` sandboxes of `env`. `on_ready` runs (on this thread) for
  /// each one as soon as it is ready, `on_failed` for each one that failed;
  /// returns the ids of those created. An error only if none could be asked for
  /// (bad environment, quota).
  expected<std::vector<std::string>>
  create(const environment& env, uint32_t count,
         const std::function<void(const std::string&)>& on_ready = {},
         const std::function<void(const error&)>& on_failed = {});

  /// Runs a command and collects its output; with `on_output` it is streamed
  /// there instead, as it comes.
  expected<exec_result> exec(const std::string& id, const exec_request& req,
                             const output_fn& on_output = {});
  expected<uint64_t> put(const std::string& id, const std::string& dir, std::string tar);
  expected<std::string> get(const std::string& id, const std::string& path);
  expected<void> destroy(const std::string& id);
  expected<std::vector<sandbox_info>> list();

  /// Destroys every sandbox of the session and ends it; returns how many.
  expected<uint32_t> close();

  /// Chronus: the session's events from now on (after those it kept while
  /// nobody watched), pulled from the stream.
  expected<std::unique_ptr<event_stream>> watch();
  /// Chronus: the same events pushed to `on_event`, which runs on one of CAF's
  /// threads (keep it short), until the returned stream is dropped. The stream
  /// itself then yields nothing but the end (disconnected).
  expected<std::unique_ptr<event_stream>>
  watch(std::function<void(const chronus_event&)> on_event);
  /// Chronus: answers feedback request `fb.request_id` of sandbox `id`.
  expected<void> answer(const std::string& id, const chronus_feedback& fb);

  [[nodiscard]] const session_actor& handle() const { return handle_; }

  /// An owned session is closed with its client, not with this handle.
  ~session() = default;

private:
  friend class client;
  session(client& c, session_actor h, std::string id) : client_(&c), handle_(std::move(h)), id_(std::move(id)) {}

  client* client_;
  session_actor handle_;
  std::string id_;
};

} // namespace dsec

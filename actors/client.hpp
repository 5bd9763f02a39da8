// dsec::client: the trainer's API. It talks to a dsecd over CAF's network layer
// (or to a daemon in the same process) and offers the verbs of the command line
// as blocking calls that are safe to make from several threads at once. A
// thread of the caller's that made calls may outlive the actor system: calls
// leave it nothing of CAF's that ~actor_system would wait for (thread_guard.hpp).
//
//   caf::actor_system sys{cfg};              // cfg: dsec::client::configure(cfg),
//                                            // or configure(cfg, {.dir = TLSDIR})
//   auto c = dsec::client::connect(sys, "127.0.0.1", 7070);
//   auto s = (*c)->open_session({.quota = 512});
//   auto ids = (*s)->create(env, 64, [](const std::string& id) { /* ready */ });
//   auto r = (*s)->exec(ids->front(), {.argv = {"make", "test"}});
//
// A session opened by a client is owned by it: when the client object goes away
// (or its process dies, or the connection drops) the daemon destroys the
// session's sandboxes. Errors carry the project's codes (dsec::errc) and the
// daemon's message.
//
// Every call takes one path: its asynchronous form (`*_async`: a small actor
// per call, actors/client_request.hpp); the blocking form is that and a wait
// on a dsec::waiter. client.cpp holds the connection and the verbs by sandbox
// id, client_session.cpp the session's verbs, client_watch.cpp event streams.
#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "actors/interfaces.hpp"
#include "actors/transport.hpp"
#include "runtime/chronus.hpp"
#include "runtime/error.hpp"

namespace dsec {

/// Called with each piece of a streamed command's output: stream 1 stdout, 2 stderr.
using output_fn = std::function<void(uint8_t stream, std::string_view data)>;

/// Streamed transfers (put_from, get_into; docs/actors.md, "Transfers"). A
/// source fills up to `size` bytes at `buf` and returns how many, 0 at the
/// end; an error stops the put. It runs on the calling thread.
using source_fn = std::function<expected<size_t>(char* buf, size_t size)>;
/// A sink takes each piece of a get's tar stream in order (on the calling
/// thread, which acknowledges it to the daemon once the sink returns: a slow
/// sink slows the sandbox's tar, never grows a buffer); an error stops the get.
using sink_fn = std::function<expected<void>(std::string_view data)>;

/// Called once with the outcome of an asynchronous call (the `*_async` members
/// below). It runs on one of CAF's threads: keep it short, do not throw, and
/// never wait there for another call of this client. (Only a request refused
/// before it is sent, an answer_async with invalid feedback, or a call on a
/// session this handle closed, completes on the calling thread, before the
/// call returns.) If the client object is destroyed
/// before the answer came, it gets errc::disconnected ("the client was closed
/// first"). A session made by open_session_async must not outlive its client.
template <class T>
using completion = std::function<void(expected<T>)>;

/// The outcome of one asynchronous call, waited for on the calling thread: every
/// blocking call of client and session is its `*_async` call and a wait.
///
///   waiter<exec_result> w;
///   s->exec_async(id, req, w.done());
///   while (!w.wait_for(100ms)) { /* check for signals */ }
///   auto r = w.get();
///
/// Callbacks wrapped by relay() run on the waiting thread, inside wait_for()
/// and get(), in the order they came and before the outcome is returned.
/// Only the first outcome handed to done() counts. A waiter is a handle:
/// copies share the outcome.
template <class T>
class waiter {
public:
  waiter() : st_(std::make_shared<state>()) {}

  /// The completion to give to the asynchronous call.
  [[nodiscard]] completion<T> done() const {
    return [st = st_](expected<T> r) {
      {
        std::lock_guard<std::mutex> g{st->mu};
        if (st->value)
          return; // the first outcome counts
        st->value.emplace(std::move(r));
      }
      st->cv.notify_all();
    };
  }

  /// `f`, to run on the waiting thread; its arguments are copied.
  template <class... A>
  [[nodiscard]] std::function<void(A...)> relay(std::function<void(A...)> f) const {
    if (!f)
      return {};
    return [st = st_, f = std::move(f)](A... xs) {
      st->post([f, args = std::make_tuple(std::decay_t<A>(xs)...)]() mutable {
        std::apply(f, args);
      });
    };
  }
  /// Streamed output, to run on the waiting thread (the data copied).
  [[nodiscard]] std::function<void(uint8_t, std::string_view)>
  relay(std::function<void(uint8_t, std::string_view)> f) const {
    if (!f)
      return {};
    return [st = st_, f = std::move(f)](uint8_t stream, std::string_view data) {
      st->post([f, stream, d = std::string{data}] { f(stream, d); });
    };
  }

  /// Waits at most `d`: true once the outcome is there (get() then returns at once).
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> d) {
    return st_->run_until(std::chrono::steady_clock::now() + d);
  }

  /// Waits for the outcome and takes it (once).
  expected<T> get() {
    st_->run_until(std::chrono::steady_clock::time_point::max());
    return std::move(*st_->value);
  }

private:
  struct state {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> relayed;
    std::optional<expected<T>> value;

    void post(std::function<void()> f) {
      {
        std::lock_guard<std::mutex> g{mu};
        relayed.push_back(std::move(f));
      }
      cv.notify_all();
    }
    // Runs what was relayed until the outcome is there (true) or `until` passed.
    bool run_until(std::chrono::steady_clock::time_point until) {
      std::unique_lock<std::mutex> lk{mu};
      for (;;) {
        while (!relayed.empty()) {
          auto f = std::move(relayed.front());
          relayed.pop_front();
          lk.unlock();
          f();
          lk.lock();
        }
        if (value)
          return true;
        if (until == std::chrono::steady_clock::time_point::max())
          cv.wait(lk);
        else if (cv.wait_until(lk, until) == std::cv_status::timeout && relayed.empty())
          return value.has_value();
      }
    }
  };
  std::shared_ptr<state> st_;
};

class session;

namespace detail {
struct client_link;  // the connection, the addresses, the sessions to reattach (client.cpp)
struct session_link; // a session's handle, options and owner (client.cpp)
} // namespace detail

/// A sandbox a create made: its id, and its key (create_labels: the create's
/// key K for a create of one, K#i for the i-th sandbox announced of several,
/// "#N" or "#N#i" for a create without a key).
struct created_sandbox {
  std::string id;
  std::string key;
  bool operator==(const created_sandbox&) const = default;
};

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

/// What client::list_all found: the sandboxes, and the names of the nodes
/// of a cluster that did not answer within 3 s (hung, or cut off and not yet
/// lost): their sandboxes are not among them.
struct sandbox_list {
  std::vector<sandbox_info> sandboxes;
  std::vector<std::string> missing;
};

/// A command started with a handle (client::start, session::start; issues 20
/// and 23, docs/actors.md "Process handles"): it runs while the caller sends
/// it stdin and signals, and its end is waited for when the caller likes.
/// Dropping the handle does not stop the command (its end is still collected,
/// and the daemon keeps it running); cancel() does. Thread-safe.
///
///   auto p = c->start(id, {.argv = {"cat"}, .handle = true, .open_stdin = true});
///   (*p)->write("hello\n");   // returns once the daemon took the bytes
///   (*p)->close_stdin();
///   auto r = (*p)->wait();    // exec_result, its output collected
class process {
public:
  struct state;
  explicit process(std::shared_ptr<state> st) : st_(std::move(st)) {}

  /// The sandbox it runs in.
  [[nodiscard]] const std::string& sandbox() const;
  /// Its id in the sandbox, once it runs (waits for that); the error if it
  /// could not be started (then wait() gives the same).
  expected<uint64_t> id();
  /// Sends `data` to its stdin (exec_request.open_stdin), in pieces of
  /// 128 KiB. The first write returns once the daemon took every byte into
  /// the command's bounded buffer (stdin_buffer); later ones once it took all
  /// but at most stdin_window bytes of what was written, so a command that
  /// does not read makes the writer wait, while one that reads gets the next
  /// pieces without a round trip between them. A piece the daemon refused
  /// fails that write or a later one, or close_stdin (errc::closed once its
  /// stdin is closed, the command closed it or ended).
  expected<void> write(std::string_view data);
  /// Ends its stdin (after what was written), once the daemon took every
  /// byte written; the first error of a write still in flight otherwise.
  expected<void> close_stdin();
  /// What write() leaves in flight at most.
  static constexpr size_t stdin_window = 512u << 10;
  /// Sends signal `sig` to its process group.
  expected<void> signal(int sig);
  /// Sets its terminal's window size (exec_request.tty); its foreground
  /// process group gets SIGWINCH. invalid_argument without a terminal.
  expected<void> resize(uint16_t rows, uint16_t cols);
  /// Its end: the result as exec() gives it (output collected unless it
  /// was streamed to the start call's on_output).
  expected<exec_result> wait();
  /// Waits at most `d`: true once it ended (wait() then returns at once).
  bool wait_for(std::chrono::milliseconds d);
  /// Stops it: the daemon SIGKILLs the command (its requester went away);
  /// wait() then gives errc::closed ("cancelled") at once.
  void cancel();

  // Asynchronous forms: `done` runs once, on one of CAF's threads. Writes
  // and the close reach the command in the order they were made, however
  // many are in flight (one actor sends them, a few at a time).
  void write_async(std::string data, completion<uint64_t> done);
  void close_stdin_async(completion<void> done);
  void signal_async(int sig, completion<void> done);
  void resize_async(uint16_t rows, uint16_t cols, completion<void> done);
  /// Flow control (exec_request.window): acknowledges `bytes` of streamed
  /// output as consumed, so the daemon sends more. The start call's
  /// on_output does it by itself once it returns, except for a get transfer
  /// (get_into acknowledges what its sink took).
  void credit(uint64_t bytes);

private:
  std::shared_ptr<state> st_;
};

class client {
public:
  /// Prepares an actor system config for a client (middleman, message types).
  static void configure(caf::actor_system_config& cfg);

  /// The same, and TLS with the certificates of `tls.dir` (actors/transport.hpp;
  /// nothing more when it is empty): then connect() speaks only TLS, as a dsecd
  /// started with --tls requires. The error names a missing or bad file.
  static expected<void> configure(caf::actor_system_config& cfg, const tls_options& tls);

  /// Connects to the dsecd at host:port, over TLS when the system was
  /// configured with it. When that connection drops later (the daemon died or
  /// restarted), the client reconnects by itself, with backoff (100 ms
  /// doubling to 2 s), and reattaches its sessions (docs/cluster.md, "When the
  /// coordinator dies"): a call in flight meanwhile, or made before the link
  /// is back, fails with errc::disconnected (retry it); none hangs.
  static expected<std::unique_ptr<client>> connect(caf::actor_system& sys,
                                                   const std::string& host, uint16_t port);
  /// The same with several addresses of the daemon (host, port): the first
  /// that answers; a reconnect tries each in turn.
  static expected<std::unique_ptr<client>>
  connect(caf::actor_system& sys, const std::vector<std::pair<std::string, uint16_t>>& addresses);

  /// Uses a scheduler of this process (an embedded daemon).
  static std::unique_ptr<client> attach(caf::actor_system& sys, scheduler_actor scheduler);

  /// Opens a session owned by this client (closed when the client goes away).
  /// With `owned` false the session lives until it is closed explicitly (the
  /// command line's `session open`).
  expected<std::unique_ptr<session>> open_session(const session_options& opts = {},
                                                  bool owned = true);

  /// Reopens a session from its trajectory log (docs/trajectory.md), after its
  /// trainer or its daemon died: its sandboxes are rebuilt under their old ids,
  /// and the creates and commands the trainer issues again, in order, are
  /// answered from the log while they match it. Owned like open_session's.
  expected<std::unique_ptr<session>> resume_session(const std::string& id, bool owned = true);

  /// A handle on a live session, by id or name (its id() is the id either
  /// way); it does not close it when dropped.
  expected<std::unique_ptr<session>> find_session(const std::string& id);
  /// The daemon's live sessions and the trajectory logs it could resume
  /// (`dsec session list`), ordered by id.
  expected<std::vector<session_summary>> sessions();

  // By sandbox id, without a session (the command line's verbs).
  expected<exec_result> exec(const std::string& id, const exec_request& req,
                             const output_fn& on_output = {});
  /// Starts a command with a process handle (`req.handle` is set for it) and
  /// returns at once; with `on_output` its output is streamed there (on one
  /// of CAF's threads, in order, before the end) instead of collected.
  /// `on_end`, if given, runs once with what wait() returns (on one of CAF's
  /// threads, or on the cancelling one).
  std::unique_ptr<process> start(const std::string& id, const exec_request& req,
                                 output_fn on_output = {},
                                 completion<exec_result> on_end = {});
  /// Whole-buffer transfers: a put of up to transfer_single (1 MiB) is one
  /// message (a session's trajectory log matches it by its digest on
  /// resume); a larger one, and every get, are thin wrappers of put_from and
  /// get_into.
  expected<uint64_t> put(const std::string& id, const std::string& dir, std::string tar);
  expected<std::string> get(const std::string& id, const std::string& path);
  /// Streams a tar archive from `src` into directory `dir` of sandbox `id`
  /// (its tar unpacks it as it comes), in pieces, each sent once the daemon
  /// took the one before; returns the bytes sent. A failing source cancels
  /// the transfer (what tar unpacked so far stays).
  expected<uint64_t> put_from(const std::string& id, const std::string& dir,
                              const source_fn& src);
  /// Streams a tar archive of `path` (file or directory) of sandbox `id`
  /// into `sink`, at the sink's pace; returns the bytes. The daemon holds at
  /// most a window (transfer_window) of it, however slow the sink.
  expected<uint64_t> get_into(const std::string& id, const std::string& path,
                              const sink_fn& sink);
  expected<void> destroy(const std::string& id);
  /// Egress networking: replaces the policy of egress sandbox `id` (rules of
  /// runtime/net_policy.hpp); new connections see it at once.
  expected<void> set_network(const std::string& id, const std::vector<std::string>& allow,
                             const std::vector<std::string>& deny);
  /// Port exposure: forwards a port of sandbox `id`'s node to TCP `port`
  /// inside it (loopback and egress sandboxes); returns where to connect.
  expected<exposed_port> expose(const std::string& id, uint16_t port);
  /// The output and ends of sandbox `id`'s detached commands, as its log
  /// holds them (logs_request; docs/actors.md "Logs"). With `q.wait` it may
  /// take up to 20 s to answer: call it again from the reply's `next`.
  expected<logs_reply> logs(const std::string& id, const logs_request& q);
  /// What sandbox `id` uses now (memory, CPU time, tasks, its writable
  /// layer, egress counters), read by its node from the host's side; with
  /// `processes` its processes too (`dsec stats|top ID`).
  expected<sandbox_usage> usage(const std::string& id, bool processes = false);
  /// Sends `sig` to the process group of command `exec` of sandbox `id` (a
  /// detached command's id from logs(), or a handle's); not_found once it ended.
  expected<void> signal(const std::string& id, uint64_t exec, int sig);
  /// Every sandbox of the daemon (of every node, through a coordinator);
  /// the sandboxes of a node that did not answer within 3 s are left out:
  /// list_all names those nodes.
  expected<std::vector<sandbox_info>> list();
  /// The same, with the names of the nodes that did not answer.
  expected<sandbox_list> list_all();
  expected<node_stats> stats();
  /// The cluster's nodes (a coordinator's; docs/cluster.md): up ones first,
  /// the coordinator's own node first of them, then those lately lost.
  expected<std::vector<member_info>> cluster();
  /// Answers a Chronus feedback request of a sandbox (the request id is the
  /// event's seq): the `chronus feedback` waiting in it gets `fb`.
  expected<void> answer(const std::string& id, const chronus_feedback& fb);
  /// Operating a node by name (docs/cluster.md, "Cordon, drain, uncordon";
  /// through a coordinator any of its nodes, else the daemon's own):
  /// cordon(node, true) stops new sandboxes there, cordon(node, false) takes
  /// it back; both return its live sandboxes. drain() cordons it and returns
  /// once its last sandbox is gone (how many it had), or errc::timeout after
  /// `timeout` (0: no limit) naming how many are left.
  expected<uint32_t> cordon(const std::string& node, bool on);
  expected<uint32_t> drain(const std::string& node, std::chrono::milliseconds timeout);

  // ---- asynchronous variants ------------------------------------------------------
  // Each returns at once and calls `done` exactly once, on one of CAF's threads
  // (see dsec::completion), with what the blocking call would have returned.
  // No thread waits: one small event-based actor per call makes the request,
  // so thousands may be in flight at once. Thread-safe.

  void open_session_async(const session_options& opts,
                          completion<std::unique_ptr<session>> done, bool owned = true);
  void resume_session_async(const std::string& id, completion<std::unique_ptr<session>> done,
                            bool owned = true);
  /// With `on_output` the output is streamed there (on a CAF thread, in order,
  /// before `done`) instead of collected.
  void exec_async(const std::string& id, const exec_request& req,
                  completion<exec_result> done, output_fn on_output = {});
  void put_async(const std::string& id, const std::string& dir, std::string tar,
                 completion<uint64_t> done);
  void get_async(const std::string& id, const std::string& path,
                 completion<std::string> done);
  void destroy_async(const std::string& id, completion<void> done);
  void list_async(completion<std::vector<sandbox_info>> done);
  void list_all_async(completion<sandbox_list> done);
  void stats_async(completion<node_stats> done);
  void answer_async(const std::string& id, const chronus_feedback& fb, completion<void> done);
  void cordon_async(const std::string& node, bool on, completion<uint32_t> done);
  void drain_async(const std::string& node, std::chrono::milliseconds timeout,
                   completion<uint32_t> done);

  // ---- warm pools (actors/warm_pool.hpp) ----------------------------------------
  /// A warm pool of the nodes' own (`dsec pool set`; it lives with the nodes,
  /// not with this client): `size` ready sandboxes of `env` spread over the
  /// nodes (0 removes it). Returns how many the nodes took.
  expected<uint32_t> pool(const environment& env, uint32_t size);
  /// Every node's warm pools (`dsec pool ls`).
  expected<std::vector<pool_info>> pools();

  // ---- snapshots (issue 16; actors/client_snapshot.cpp) ---------------------------
  /// Pauses a sandbox: its processes frozen, its TTL clock stopped; commands,
  /// put and get are refused with errc::paused until resume(). True when it
  /// was running (false: paused already).
  expected<bool> pause(const std::string& id);
  /// Resumes a paused sandbox. True when it was paused.
  expected<bool> resume(const std::string& id);
  /// pack_diff: its writable layer as the diff layer `ref` (NAME@VERSION) in
  /// its node's store; the sandbox is frozen for the copy. Returns the digest.
  expected<std::string> snapshot(const std::string& id, const std::string& ref);
  /// `count` new sandboxes with its files (one diff, one batch, in its
  /// session); the source goes on running. Returns their ids.
  expected<std::vector<std::string>> fork(const std::string& id, uint32_t count);
  void pause_async(const std::string& id, bool on, completion<bool> done);
  void snapshot_async(const std::string& id, const std::string& ref,
                      completion<std::string> done);
  void fork_async(const std::string& id, uint32_t count,
                  completion<std::vector<std::string>> done);

  [[nodiscard]] caf::actor_system& system() { return *sys_; }
  /// The daemon's scheduler as the client reaches it now (a reconnect
  /// replaces it).
  [[nodiscard]] scheduler_actor scheduler() const;
  /// How many times the client reconnected (after the link dropped) so far.
  [[nodiscard]] uint64_t reconnects() const;
  /// Waits at most `d` until the client is connected (again): true if it is.
  bool wait_connected(std::chrono::milliseconds d) const;

  ~client();
  client(const client&) = delete;
  client& operator=(const client&) = delete;

private:
  friend class session;
  client(caf::actor_system& sys, scheduler_actor scheduler);
  /// A session handle this client made, remembered for reattaching.
  std::unique_ptr<session> make_session(session_actor h, std::string id,
                                        const session_options& opts, bool owned);

  caf::actor_system* sys_;
  std::shared_ptr<detail::client_link> link_;
  caf::actor identity_;    // what owned sessions monitor
  caf::actor reconnector_; // watches the scheduler, reconnects (a connected client's)
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

  /// The same with a key and tags (create_labels); each sandbox comes with
  /// its key. A resumed session gives a create the sandboxes its log made
  /// for the same key (replaying, or closed ones answering from their log),
  /// and fresh ones to a key it does not know: never another key's. A create
  /// without a key is never matched on resume. Errors: already_exists for a
  /// key in use (a live sandbox, or a create in flight), invalid_argument for
  /// a bad key or for a resumed key asked with another environment or count.
  expected<std::vector<created_sandbox>>
  create(const environment& env, uint32_t count, const create_labels& labels,
         const std::function<void(const created_sandbox&)>& on_ready = {},
         const std::function<void(const error&)>& on_failed = {});

  /// The sandbox with this key (its state "replaying" or "closed" in a
  /// resumed session before it is rebuilt); not_found if no create gave it,
  /// closed (saying why) if it is gone.
  expected<sandbox_info> find(const std::string& key);

  /// Runs a command and collects its output; with `on_output` it is streamed
  /// there instead, as it comes.
  expected<exec_result> exec(const std::string& id, const exec_request& req,
                             const output_fn& on_output = {});
  /// As client::start, through this session.
  std::unique_ptr<process> start(const std::string& id, const exec_request& req,
                                 output_fn on_output = {},
                                 completion<exec_result> on_end = {});
  /// As client's (a session's put of more than transfer_single, and its
  /// put_from, are logged as a transfer: docs/trajectory.md).
  expected<uint64_t> put(const std::string& id, const std::string& dir, std::string tar);
  expected<std::string> get(const std::string& id, const std::string& path);
  expected<uint64_t> put_from(const std::string& id, const std::string& dir,
                              const source_fn& src);
  expected<uint64_t> get_into(const std::string& id, const std::string& path,
                              const sink_fn& sink);
  expected<void> destroy(const std::string& id);
  /// Sets a sandbox's TTL: it is destroyed `ttl` (1 s to 30 days) from now,
  /// whatever it had before; returns the milliseconds left (as list() shows).
  expected<uint64_t> set_ttl(const std::string& id, std::chrono::milliseconds ttl);
  /// Egress networking: replaces the policy of egress sandbox `id`; new
  /// connections see it at once, established ones go on.
  expected<void> set_network(const std::string& id, const std::vector<std::string>& allow,
                             const std::vector<std::string>& deny);
  /// Port exposure: forwards a port of its node to TCP `port` inside sandbox
  /// `id` (loopback and egress sandboxes); returns where to connect. The
  /// forward ends with the sandbox.
  expected<exposed_port> expose(const std::string& id, uint16_t port);
  /// As client::logs, for one of this session's sandboxes.
  expected<logs_reply> logs(const std::string& id, const logs_request& q);
  /// As client::usage, for one of this session's sandboxes.
  expected<sandbox_usage> usage(const std::string& id, bool processes = false);
  expected<std::vector<sandbox_info>> list();

  /// Destroys every sandbox of the session and ends it; returns how many.
  /// After it, every call on this session fails with errc::closed (so do
  /// those of other handles on it, once the daemon has ended it).
  expected<uint32_t> close();

  /// Chronus: the session's events from now on (after those it kept while
  /// nobody watched), pulled from the stream.
  expected<std::unique_ptr<event_stream>> watch();
  /// Chronus: the same events pushed to `on_event`, which runs on one of CAF's
  /// threads (keep it short), until the returned stream is dropped. The stream
  /// itself then yields nothing but the end (disconnected).
  expected<std::unique_ptr<event_stream>>
  watch(std::function<void(const chronus_event&)> on_event);
  /// Chronus: the same, and `on_end` runs once (on one of CAF's threads) when
  /// no more events will come: the session or its daemon is gone (not when the
  /// returned stream is dropped).
  expected<std::unique_ptr<event_stream>>
  watch(std::function<void(const chronus_event&)> on_event,
        std::function<void(const error&)> on_end);
  /// Chronus: answers feedback request `fb.request_id` of sandbox `id`.
  expected<void> answer(const std::string& id, const chronus_feedback& fb);

  // ---- asynchronous variants (see client's) -----------------------------------------

  /// `on_ready` and `on_failed` run on one of CAF's threads, per sandbox, as
  /// each is ready or failed; `done` gets what create() would have returned.
  void create_async(const environment& env, uint32_t count,
                    completion<std::vector<std::string>> done,
                    std::function<void(const std::string&)> on_ready = {},
                    std::function<void(const error&)> on_failed = {});
  void create_async(const environment& env, uint32_t count, const create_labels& labels,
                    completion<std::vector<created_sandbox>> done,
                    std::function<void(const created_sandbox&)> on_ready = {},
                    std::function<void(const error&)> on_failed = {});
  void find_async(const std::string& key, completion<sandbox_info> done);
  void exec_async(const std::string& id, const exec_request& req,
                  completion<exec_result> done, output_fn on_output = {});
  void put_async(const std::string& id, const std::string& dir, std::string tar,
                 completion<uint64_t> done);
  void get_async(const std::string& id, const std::string& path,
                 completion<std::string> done);
  void destroy_async(const std::string& id, completion<void> done);
  void set_ttl_async(const std::string& id, std::chrono::milliseconds ttl,
                     completion<uint64_t> done);
  void set_network_async(const std::string& id, std::vector<std::string> allow,
                         std::vector<std::string> deny, completion<void> done);
  void expose_async(const std::string& id, uint16_t port, completion<exposed_port> done);
  void usage_async(const std::string& id, bool processes, completion<sandbox_usage> done);
  void list_async(completion<std::vector<sandbox_info>> done);
  void close_async(completion<uint32_t> done);
  void answer_async(const std::string& id, const chronus_feedback& fb, completion<void> done);
  void cordon_async(const std::string& node, bool on, completion<uint32_t> done);
  void drain_async(const std::string& node, std::chrono::milliseconds timeout,
                   completion<uint32_t> done);

  // ---- warm pools and the function backend (actors/warm_pool.hpp) -----------------
  /// A warm pool of this session's: `size` ready sandboxes of `env` kept on
  /// the nodes for its creates and calls (0 removes it); it ends with the
  /// session. Returns how many the nodes took. Its sandboxes count against
  /// the session's quota (overloaded when the size does not fit beside what
  /// is live); a create claims one only for an environment equal in every
  /// field but the TTL (the backend too: a pool of microVMs, env.backend
  /// "microvm", keeps booted VMs, on nodes that offer them).
  /// A session with a trajectory log takes packs of claimed ones as of any.
  expected<uint32_t> pool(const environment& env, uint32_t size);
  /// The function backend: a sandbox of `env` (from a warm pool when one has
  /// a ready one), `req` run in it, the sandbox destroyed (never reused);
  /// returns the command's result once the sandbox is gone. `env.backend` is
  /// "function" (or the default "container"); the command's output is
  /// collected (no stream, no detach).
  expected<exec_result> call(const environment& env, const exec_request& req);
  void call_async(const environment& env, const exec_request& req,
                  completion<exec_result> done);

  // ---- snapshots (issue 16; actors/client_snapshot.cpp): as client's --------------
  expected<bool> pause(const std::string& id);
  expected<bool> resume(const std::string& id);
  /// Pauses (resumes) every sandbox of the session; returns how many changed.
  expected<uint32_t> pause_all();
  expected<uint32_t> resume_all();
  expected<std::string> snapshot(const std::string& id, const std::string& ref);
  expected<std::vector<std::string>> fork(const std::string& id, uint32_t count);
  void pause_async(const std::string& id, bool on, completion<bool> done);
  void pause_all_async(bool on, completion<uint32_t> done);
  void snapshot_async(const std::string& id, const std::string& ref,
                      completion<std::string> done);
  void fork_async(const std::string& id, uint32_t count,
                  completion<std::vector<std::string>> done);

  /// The session's actor as the client reaches it now (a reattach after a
  /// reconnect replaces it).
  [[nodiscard]] session_actor handle() const;

  /// An owned session is closed with its client, not with this handle.
  ~session() = default;

private:
  friend class client;
  session(client& c, std::shared_ptr<detail::session_link> link, std::string id)
    : client_(&c), link_(std::move(link)), id_(std::move(id)),
      closed_(std::make_shared<std::atomic<bool>>(false)) {}
  void create_async_impl(const environment& env, uint32_t count,
                         std::optional<create_labels> labels,
                         completion<std::vector<created_sandbox>> done,
                         std::function<void(const created_sandbox&)> on_ready,
                         std::function<void(const error&)> on_failed);
  /// errc::closed if close() succeeded on this handle.
  [[nodiscard]] std::optional<error> closed_error() const;

  client* client_;
  std::shared_ptr<detail::session_link> link_;
  std::string id_;
  std::shared_ptr<std::atomic<bool>> closed_;
};

} // namespace dsec

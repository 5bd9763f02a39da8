#include "actors/sandbox.hpp"

#include "runtime/chronus.hpp"
#include "runtime/egress.hpp"
#include "runtime/port_forward.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "actors/backend.hpp"
#include "actors/detached_log.hpp"
#include "actors/trajectory.hpp"
#include "actors/transfer.hpp"
#include "actors/exec_command.hpp"
#include "actors/transfer_command.hpp"
#include "actors/types.hpp"
#include "runtime/builder.hpp"
#include "runtime/clock.hpp"
#include "runtime/metrics.hpp"
#include "runtime/container.hpp"
#include "runtime/image_config.hpp"
#include "runtime/log.hpp"
#include "runtime/pack.hpp"
#include "runtime/pty.hpp"
#include "runtime/engine.hpp"
#include "runtime/sys.hpp"
#include "runtime/freezer.hpp"
#include "runtime/snapshot.hpp"
#include "runtime/store.hpp"
#include "runtime/usage.hpp"

namespace dsec {

namespace {

using clock_type = std::chrono::steady_clock;

// The container backend's latencies (runtime/metrics.hpp, docs/observability.md).
metrics::histogram& exec_seconds() {
  static auto& h = metrics::process_registry().get_histogram(
    "dsec_sandbox_exec_seconds", "From a command's start to its end and its output's.",
    metrics::latency_buckets(), {{"backend", "container"}});
  return h;
}
metrics::histogram& destroy_seconds() {
  static auto& h = metrics::process_registry().get_histogram(
    "dsec_sandbox_destroy_seconds", "From a sandbox's destroy to its resources' release.",
    metrics::latency_buckets(), {{"backend", "container"}});
  return h;
}

// The most new file contents one pack of the writable layer stores (issue
// 20, docs/trajectory.md "What a log costs"): a step that changed more is
// logged without a pack (its pack_error says why), and a resume cannot
// rebuild the sandbox past it.
constexpr uint64_t pack_max_new_bytes = 64ull << 20;

// Reads a command's stdout or stderr on the reactor thread and posts what it
// read to the sandbox. It owns the pipe's read end (shared between re-armed
// copies of itself), so the descriptor lives exactly as long as someone may
// still read it.
struct pipe_reader {
  std::shared_ptr<unique_fd> fd;
  sandbox_actor sandbox;
  reactor* io;
  uint64_t exec;
  uint8_t stream;
  // Flow-controlled (exec_request.window): the sandbox re-arms the watch
  // itself once the requester has room, so at most one read is in its
  // mailbox per stream.
  bool manual = false;

  void operator()(int res) const {
    if (res < 0)
      return;
    char buf[64 * 1024];
    std::string data;
    bool eof = false;
    for (;;) {
      auto n = ::read(fd->get(), buf, sizeof buf);
      if (n > 0) {
        data.append(buf, static_cast<size_t>(n));
        if (data.size() >= 256 * 1024)
          break; // post what we have; the watch fires again at once
        continue;
      }
      if (n < 0 && errno == EINTR)
        continue;
      eof = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
      break;
    }
    if (!data.empty() || eof)
      caf::anon_send(sandbox, output_atom::value, process_key(), exec, stream, std::move(data),
                     eof);
    if (!eof && !manual)
      io->watch(fd->get(), POLLIN, *this);
  }
};

// A handle's stdin (exec_request.open_stdin): the pipe's write end (ours,
// non-blocking; shared with the reactor's watch of it, so that it closes only
// once no watch holds it), the bytes waiting to go into it (at most
// stdin_buffer before a sender waits), and the senders waiting for room.
struct stdin_feed {
  std::shared_ptr<unique_fd> fd;
  std::string buf;
  size_t off = 0;
  bool close_after = false; // close once buf is written
  uint64_t watch = 0;       // the reactor's token while a POLLOUT watch is armed
  // A terminal's (exec_request.tty): fd is its master, set once the command
  // runs (until then buf only fills); closing types its VEOF (eof_sent) and
  // then only drops our share of the master, which the output reader keeps.
  bool pty = false;
  bool eof_sent = false;
  struct waiting {
    std::string data;
    bool close;
    caf::typed_response_promise<uint64_t> rp;
  };
  std::deque<waiting> waiters;
  [[nodiscard]] size_t pending() const { return buf.size() - off; }
};

// A command in flight, and what to do when it ends.
struct exec_state {
  uint64_t id = 0; // the container's id of it
  bool stream = false;
  bool handle = false; // exec_request.handle: the listener hears its id, and it dies with it
  std::optional<stdin_feed> in; // exec_request.open_stdin, until closed
  bool open_stdin = false;      // exec_request.open_stdin (an ended stdin says "closed")
  bool detach = false;
  // exec_request.tty: the terminal's master once the command runs (shared
  // with the output reader and the stdin feed), and a window size asked for
  // before that.
  bool tty = false;
  std::shared_ptr<unique_fd> master;
  std::optional<pty::window> size_pending;
  uint64_t max_output = 0;
  caf::strong_actor_ptr listener; // gets output_chunk when streaming
  std::string out, err;
  bool out_eof = true, err_eof = true;
  bool started = false, exited = false, timed_out = false, truncated = false;
  bool finished = false;
  exit_status status;
  clock_type::time_point t0;
  std::function<void(expected<exec_result>)> done;
  // ---- transfers and flow control (issue 20; docs/actors.md, "Transfers") ----
  uint8_t transfer = transfer_none;
  uint64_t window = 0;  // exec_request.window; 0: no flow control
  uint64_t unacked = 0; // bytes sent to the listener and not yet credited
  std::optional<pipe_reader> reader[2]; // stdout, stderr: re-armed by us with a window
  bool parked[2] = {false, false};     // not re-armed: waiting for credit
  bool flowing = false; // a get's stdout goes out (before: held back in `out`)
  // The drain (exited, a pipe still open): the bytes its pipes held when it
  // looked, still to be taken; it finishes once they are and `drained`.
  uint64_t drain_left[2] = {0, 0};
  bool drained = false;
  // A manual reader's watch (its reactor token), and whether it was armed
  // at the watchdog's last look with nothing read since (watch_check).
  uint64_t watch[2] = {0, 0};
  bool stale[2] = {false, false};
};

enum class phase { creating, ready, destroying };

// The session a sandbox's Chronus events go to, shared with the reactor
// thread's callback: a pooled sandbox gets its session when it is claimed.
struct chronus_route {
  std::mutex mu;
  session_actor session;

  void set(session_actor s) {
    std::lock_guard<std::mutex> g{mu};
    session = std::move(s);
  }
  session_actor get() {
    std::lock_guard<std::mutex> g{mu};
    return session;
  }
};

struct sandbox_state {
  static inline const char* name = "dsec.sandbox";

  sandbox_config cfg;
  phase ph = phase::creating;
  std::unique_ptr<container> box;
  uint64_t lease = 0; // of the layer cache
  uint64_t created_ms = 0;
  clock_type::time_point expires;
  clock_type::time_point destroy_t0{}; // begin_destroy, for dsec_sandbox_destroy_seconds
  uint64_t ttl_setting = 0; // the TTL timer that counts (lifetime_atom makes a new one)
  std::map<uint64_t, exec_state> execs; // by our exec id
  uint64_t next_exec = 1;
  std::vector<caf::typed_response_promise<bool>> destroy_waiters;
  std::string failure; // why init died, when it did
  // Why it is being destroyed, for the commands still running then.
  std::string end_why = "was destroyed (by its trainer, its session closing, or its node stopping)";
  errc end_code = errc::sandbox_failed;
  bool acquiring = true; // the layer cache has not answered yet
  // What a command leaves out comes from the base image's config (Env,
  // WorkingDir, User, Entrypoint, Cmd; runtime/image_config.hpp), made once
  // when the layers arrive.
  command_defaults defaults;
  // Its layers' descriptors (its layer_set's, the layer cache's: valid while
  // the lease is held, so until finish_destroy), the last `base_lowers` of
  // them its base image's roots: for commands naming their user
  // (exec_request.user), its etc/passwd and etc/group are read from those at
  // the first such command, then kept. Never the tree the agent writes.
  std::vector<int> layer_fds;
  size_t base_lowers = 0;
  std::optional<user_files> users;
  bool creation_failed_told = false; // the session heard failed_atom for it
  // Chronus (env.chronus): the secret frames on /run/chronus.sock must carry
  // (it never leaves the node); the sandbox is served by the engine's endpoint
  // from creation until finish_destroy.
  std::optional<chronus_token> token;
  // Packs of the writable layer (a session with a trajectory log): what each
  // file hashed to, so unchanged ones are not read again. Packs run one at a
  // time, in order, each on a thread of its own (run_pack).
  std::shared_ptr<pack_cache> packs = std::make_shared<pack_cache>();
  struct pack_job {
    std::string pack_path, blob_dir;
    caf::typed_response_promise<internal_key, std::string> rp;
  };
  std::deque<pack_job> pack_queue;
  bool packing = false;
  caf::typed_response_promise<internal_key, std::string> pack_running; // of the pack in progress
  // Set when the sandbox goes: a pack in progress stops at its next entry.
  std::shared_ptr<std::atomic<bool>> pack_cancel = std::make_shared<std::atomic<bool>>(false);
  // A warm pool's (cfg.pooled) until claimed; commands started ever (a
  // pooled one that ran anything is never handed out).
  bool pooled = false;
  uint64_t commands = 0;
  // Where its Chronus events go: the session that owns it now (a claim
  // changes it; the reactor thread reads it).
  std::shared_ptr<chronus_route> route = std::make_shared<chronus_route>();
  // Egress networking (env.egress; runtime/egress.hpp): its veth, /31 and
  // policy; released after the container (its veth goes with its netns).
  std::unique_ptr<egress_link> egress;
  // Exposed ports (runtime/port_forward.hpp), in the order exposed: closed
  // when its destruction begins (the address stops answering at once).
  std::vector<std::unique_ptr<port_forward>> exposed;
  // ---- snapshots (issue 16) ----
  // Paused by `dsec pause` (its TTL clock stopped: ttl_left_ms is what was
  // left), or frozen for a snapshot in progress (commands wait for the thaw).
  std::optional<sandbox_freezer> freezer; // opened at the first pause
  bool paused = false;
  bool watch_check_armed = false; // the watchdog of manual readers is scheduled
  uint64_t lost_watches = 0;      // watches it found lost (logged)
  uint64_t ttl_left_ms = 0;
  bool snapshotting = false;
  caf::typed_response_promise<internal_key, std::string> snapshot_rp;
  // Orphaned: its session's process went away (the coordinator died); kept
  // for cfg.orphan_grace for a restarted coordinator to adopt (adopt_atom).
  bool orphaned = false;
  uint64_t orphanings = 0; // the orphan timer that counts
  // ---- detached commands' output (issue 23; docs/actors.md, "Logs") ----
  // Made at its first detached command: a sandbox that runs none allocates
  // nothing for it.
  std::unique_ptr<detached_log> log;
  // logs requests waiting for output or an end (logs_request.wait), by a
  // number of their own (their 20 s timer names it); at most max_log_waiters.
  struct log_waiter {
    logs_request q;
    caf::typed_response_promise<logs_reply> rp;
  };
  std::map<uint64_t, log_waiter> log_waiters;
  uint64_t next_log_waiter = 1;
};

// Most logs requests one sandbox holds waiting; the oldest is answered (with
// what there is) to make room.
constexpr size_t max_log_waiters = 64;
// A waiting logs request is answered after this long even with nothing new.
constexpr auto log_wait_limit = std::chrono::seconds(20);
// timeout_atom's tag for a waiting logs request (bit 62; bit 63 is a drain's).
constexpr uint64_t log_wait_tag = 1ull << 62;
// A drain's second half (bit 61 with bit 63): the reactor passed it on, so
// every read it had made before is in the mailbox ahead of it.
constexpr uint64_t drain_flush_tag = 1ull << 61;
// timeout_atom's tag for the watchdog of flow-controlled readers (bit 60).
constexpr uint64_t watch_check_tag = 1ull << 60;
constexpr auto watch_check_every = std::chrono::seconds(1);

using self_ptr = sandbox_actor::stateful_pointer<sandbox_state>;

const char* phase_name(const sandbox_state& s) {
  switch (s.ph) {
    case phase::creating: return "creating";
    case phase::ready:
      return s.pooled ? "pooled" : s.paused ? "paused" : s.execs.empty() ? "ready" : "running";
    case phase::destroying: return "destroying";
  }
  return "unknown";
}

// Where the packs of this sandbox's session go on this node:
// <trajectories>/<session id> (made, with packs/, if missing: a node of a
// cluster makes its own). Every part of the path is the daemon's own or a
// checked name; none comes from a message as a path.
expected<std::string> session_data(const sandbox_config& c) {
  if (c.trajectories.empty())
    return make_error(errc::unsupported, "node " + c.node_name
                                           + " keeps no trajectory data (it has no state dir)");
  DSEC_TRY_VOID(check_name(c.session_id, "a session id"));
  auto dir = trajectory_dir(c.trajectories, c.session_id);
  for (const auto& d : {dir, dir + "/packs"})
    if (::mkdir(d.c_str(), 0700) < 0 && errno != EEXIST)
      return sys_error("creating the trajectory dir", d);
  return dir;
}

void watch_control(self_ptr self) {
  auto& s = self->state;
  if (!s.box || s.ph == phase::destroying)
    return;
  sandbox_actor me = self;
  s.cfg.eng->io().watch(s.box->control_fd(), POLLIN,
                        [me](int res) {
                          if (res >= 0)
                            caf::anon_send(me, event_atom::value, process_key());
                        });
}

void watch_exit(self_ptr self) {
  auto& s = self->state;
  sandbox_actor me = self;
  s.cfg.eng->io().watch(s.box->pidfd(), POLLIN, [me](int res) {
    if (res >= 0)
      caf::anon_send(me, reaped_atom::value, process_key());
  });
}

// Ends a command's stdin feed, now: what waits in it is dropped, and those
// waiting to send hear `why` (errc::closed).
void end_stdin(sandbox_state& s, exec_state& x, const std::string& why) {
  if (!x.in)
    return;
  auto& in = *x.in;
  if (in.watch != 0)
    s.cfg.eng->io().cancel(in.watch); // its callback drops its copy of the fd
  auto e = to_caf(make_error(errc::closed, why));
  for (auto& w : in.waiters)
    w.rp.deliver(e);
  x.in.reset();
}

void finish_exec(self_ptr self, uint64_t eid) {
  auto& s = self->state;
  auto it = s.execs.find(eid);
  if (it == s.execs.end() || it->second.finished)
    return;
  auto& x = it->second;
  x.finished = true;
  end_stdin(s, x, "the command ended");
  if (x.transfer == transfer_get && !x.flowing) {
    // Its whole archive was held back (transfer_hold_back): it goes out now,
    // before the end, if tar succeeded; a failed get sends no bytes.
    if (x.status.shell_code() == 0 && !x.timed_out && !x.out.empty() && x.listener)
      caf::anon_send(caf::actor_cast<caf::actor>(x.listener),
                     output_chunk{s.cfg.id, eid, 1, std::move(x.out)});
    x.out.clear();
  }
  exec_result r;
  r.exit_code = x.status.shell_code(); // 128+N for a signal N, as shells and the CLI say
  r.signal = x.status.signal;
  r.timed_out = x.timed_out;
  r.truncated = x.truncated;
  r.oom_killed = r.signal == SIGKILL && s.box && s.box->oom_killed();
  if (r.oom_killed)
    log::refusal("sandbox", "oom", "a command was killed: out of memory (its --memory limit)",
                 {{"sandbox", s.cfg.id}, {"session", s.cfg.session_id}});
  r.out = std::move(x.out);
  r.err = std::move(x.err);
  r.duration_us = static_cast<uint64_t>(
    std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now() - x.t0).count());
  exec_seconds().observe(static_cast<double>(r.duration_us) / 1e6);
  auto done = std::move(x.done);
  s.execs.erase(it);
  if (done)
    done(std::move(r));
}

void fail_exec(self_ptr self, uint64_t eid, error e) {
  auto& s = self->state;
  auto it = s.execs.find(eid);
  if (it == s.execs.end() || it->second.finished)
    return;
  it->second.finished = true;
  end_stdin(s, it->second, "the command ended");
  auto done = std::move(it->second.done);
  s.execs.erase(it);
  if (done)
    done(std::move(e));
}

// The command has exited and its output is complete (or we stop waiting).
void maybe_finish(self_ptr self, uint64_t eid) {
  auto& s = self->state;
  auto it = s.execs.find(eid);
  if (it == s.execs.end())
    return;
  auto& x = it->second;
  if (x.exited && x.out_eof && x.err_eof)
    finish_exec(self, eid);
}

void begin_destroy(self_ptr self);
void schedule_watch_check(self_ptr self);

// Answers the waiting logs request `it` with what the log has for it (as not
// live with `ended`: the sandbox goes); returns the next one.
auto answer_log_waiter(sandbox_state& s, std::map<uint64_t, sandbox_state::log_waiter>::iterator it,
                       bool ended = false) {
  auto r = s.log->read(it->second.q); // waiters wait only on a log
  if (ended)
    r.live = false;
  it->second.rp.deliver(std::move(r));
  return s.log_waiters.erase(it);
}

// Answers the waiting logs requests that have news: output after their
// position, or none of their commands live any more; with `all` (the sandbox
// goes), every one, as not live.
void wake_log_waiters(self_ptr self, bool all = false) {
  auto& s = self->state;
  for (auto it = s.log_waiters.begin(); it != s.log_waiters.end();)
    it = all || s.log->has_news(it->second.q) ? answer_log_waiter(s, it, all) : std::next(it);
}

exposed_port describe(const port_forward& f) {
  return exposed_port{f.port(), f.host(), f.host_port()};
}

// Forwards a port of the node to `port` on the sandbox's loopback (its
// network namespace: loopback and egress sandboxes).
expected<exposed_port> expose_port(self_ptr self, uint16_t port) {
  auto& s = self->state;
  std::vector<uint16_t> ports;
  for (const auto& f : s.exposed)
    ports.push_back(f->port());
  ports.push_back(port);
  environment e = s.cfg.env;
  e.expose.clear();
  DSEC_TRY_VOID(check_expose(e, ports));
  auto* fw = s.cfg.eng->ports();
  if (!fw)
    return make_error(errc::unsupported, "node " + s.cfg.node_name + " forwards no ports");
  if (!s.box || s.box->pidfd() < 0)
    return make_error(errc::not_found, "sandbox " + s.cfg.id + " has no process to forward to");
  DSEC_TRY(f, fw->expose(s.box->pidfd(), port));
  s.exposed.push_back(std::move(f));
  return describe(*s.exposed.back());
}

// After this the actor is gone: tell everyone, release everything.
void finish_destroy(self_ptr self) {
  auto& s = self->state;
  auto pending = std::move(s.execs);
  s.execs.clear();
  for (auto& [eid, x] : pending)
    end_stdin(s, x, "sandbox " + s.cfg.id + " is gone");
  for (auto& [eid, x] : pending)
    if (!x.finished && x.done)
      x.done(s.failure.empty()
               ? make_error(s.end_code, "sandbox " + s.cfg.id + " " + s.end_why
                                          + " while the command ran")
               : make_error(errc::sandbox_failed, "sandbox " + s.cfg.id + ": " + s.failure));
  s.pack_cancel->store(true);
  // The pack in progress and the queued ones hear it here: the helper's
  // answer will find this actor gone.
  auto gone = to_caf(make_error(errc::not_found, "sandbox " + s.cfg.id + " was destroyed"));
  if (s.packing)
    s.pack_running.deliver(gone);
  s.packing = false;
  for (auto& job : s.pack_queue)
    job.rp.deliver(gone);
  s.pack_queue.clear();
  if (s.snapshotting)
    s.snapshot_rp.deliver(gone);
  s.snapshotting = false;
  if (s.freezer) { // its processes are gone (init reaped): the freezer cgroup goes
    (void) s.freezer->destroy();
    s.freezer.reset();
  }
  if (s.paused)
    self->send(s.cfg.node, pause_atom::value, process_key(), s.cfg.id, false);
  s.paused = false;
  if (s.token) // a waiting `chronus feedback` hears that the session is gone
    s.cfg.eng->chronus().remove(s.cfg.id, true);
  s.token.reset();
  s.exposed.clear();
  s.box.reset();
  s.egress.reset();
  s.layer_fds.clear(); // the cache's: not ours once released
  if (s.lease != 0)
    self->send(s.cfg.cache, release_atom::value, process_key(), s.lease);
  // Destroyed before it was ready (rm, shutdown, its session closing): its
  // batch must still hear about it, or it would wait for it forever.
  bool was_created = s.created_ms != 0;
  if (s.pooled) // nobody's: only its node hears
    self->send(s.cfg.node, gone_atom::value, process_key(), s.cfg.id, was_created);
  else
    tell_end(self, s.cfg.key, s.cfg.session, s.cfg.node, s.cfg.id, s.cfg.request, was_created,
             s.creation_failed_told);
  s.creation_failed_told = true;
  if (s.destroy_t0 != clock_type::time_point{})
    destroy_seconds().observe(
      std::chrono::duration<double>(clock_type::now() - s.destroy_t0).count());
  if (log::enabled(log::level::info))
    log::write(log::level::info, "sandbox", was_created ? "destroyed" : "ended before it was ready",
               {{"sandbox", s.cfg.id},
                {"session", s.cfg.session_id},
                {"why", s.failure.empty() ? s.end_why : s.failure}});
  for (auto& rp : s.destroy_waiters)
    rp.deliver(true);
  s.destroy_waiters.clear();
  wake_log_waiters(self, true); // `logs -f` and `wait` end with the sandbox
  self->quit();
}

void begin_destroy(self_ptr self) {
  auto& s = self->state;
  if (s.ph == phase::destroying)
    return;
  s.ph = phase::destroying;
  s.destroy_t0 = clock_type::now();
  s.exposed.clear(); // its ports stop answering now
  if (!s.box) {
    if (!s.acquiring) // else the cache's answer finishes it, releasing the layers
      finish_destroy(self);
    return;
  }
  s.box->kill();
  // A frozen (v1) task takes its SIGKILL only once thawed.
  if (s.freezer)
    (void) s.freezer->thaw();
  if (s.box->pidfd() < 0) {
    (void) s.box->reap();
    finish_destroy(self);
    return;
  }
  watch_exit(self);
}

// Creation failed before the sandbox was ever ready.
void fail_creation(self_ptr self, const error& e) {
  auto& s = self->state;
  s.creation_failed_told = true;
  if (!s.pooled)
    self->send(s.cfg.session, failed_atom::value, s.cfg.key, to_caf(e), s.cfg.request);
  s.failure = e.to_string();
  // Once per cause (an unknown layer is not_found, a full node overloaded...).
  log::refusal("sandbox", to_string(e.code), "a sandbox could not be created",
               {{"sandbox", s.cfg.id}, {"session", s.cfg.session_id}, {"step", e.step},
                {"error", e.message}});
  begin_destroy(self);
}

void pump_stdin(self_ptr self, uint64_t eid);

// A terminal's command runs: its master is the output (stream 1: one stream
// for both, as a terminal has), its stdin and its window.
void attach_terminal(self_ptr self, uint64_t eid, exec_state& x, unique_fd master) {
  auto& s = self->state;
  if (!master) { // init sent none (it always does): nothing to read
    x.out_eof = true;
    return;
  }
  x.master = std::make_shared<unique_fd>(std::move(master));
  if (x.size_pending)
    (void) pty::resize(x.master->get(), *x.size_pending);
  x.size_pending.reset();
  sandbox_actor me = self;
  auto& io_loop = s.cfg.eng->io();
  io_loop.watch(x.master->get(), POLLIN, pipe_reader{x.master, me, &io_loop, eid, 1});
  if (x.in) {
    x.in->fd = x.master;
    pump_stdin(self, eid);
  }
}

void on_event(self_ptr self, container_event& ev) {
  auto& s = self->state;
  switch (ev.what) {
    case container_event::kind::ready: {
      s.ph = phase::ready;
      s.created_ms = unix_ms();
      if (log::enabled(log::level::info))
        log::write(log::level::info, "sandbox", s.pooled ? "ready (warm pool)" : "ready",
                   {{"sandbox", s.cfg.id},
                    {"session", s.cfg.session_id},
                    {"node", s.cfg.node_name},
                    {"base", s.cfg.env.base.empty() ? s.cfg.env.snapshot : s.cfg.env.base}});
      self->send(s.cfg.node, ready_atom::value, process_key(), s.cfg.id);
      if (s.pooled)
        break; // waits for a claim: no session, no TTL yet
      self->send(s.cfg.session, ready_atom::value, s.cfg.key, s.cfg.id, sandbox_actor{self},
                 s.cfg.request);
      if (s.cfg.env.ttl_ms > 0) {
        s.expires = clock_type::now() + std::chrono::milliseconds(s.cfg.env.ttl_ms);
        self->delayed_send(self, std::chrono::milliseconds(s.cfg.env.ttl_ms), ttl_atom::value,
                           process_key(), s.ttl_setting);
      }
      break;
    }
    case container_event::kind::started:
    case container_event::kind::exited:
    case container_event::kind::exec_failed:
      for (auto& [eid, x] : s.execs) {
        if (x.id != ev.id)
          continue;
        if (ev.what == container_event::kind::started) {
          x.started = true;
          if (x.tty)
            attach_terminal(self, eid, x, std::move(ev.pty));
          if (x.handle && x.listener) // its id, for the stdin and signal verbs
            caf::anon_send(caf::actor_cast<caf::actor>(x.listener),
                           output_chunk{s.cfg.id, eid, 0, {}});
          if (x.detach) {
            // The caller only wanted it started (a handle's, its id too);
            // nobody waits for the end, and its going kills nothing.
            if (x.listener) {
              self->demonitor(x.listener->address());
              x.listener = nullptr;
            }
            auto done = std::move(x.done);
            x.done = nullptr;
            if (done)
              done(exec_result{});
          }
        } else if (ev.what == container_event::kind::exited) {
          x.exited = true;
          x.status = ev.status;
          end_stdin(s, x, "the command ended");
          if (x.detach) {
            s.log->exited(eid, x.status.shell_code(), x.status.signal, x.timed_out, unix_ms());
            s.execs.erase(eid);
            wake_log_waiters(self);
            return;
          }
          if (!x.out_eof || !x.err_eof) {
            // Background processes may keep the pipes open: take what is
            // there a moment later rather than wait forever.
            self->delayed_send(self, std::chrono::milliseconds(200), timeout_atom::value,
                               process_key(), eid | (1ull << 63));
          }
          maybe_finish(self, eid);
        } else {
          if (x.detach) // never ran: its caller hears why, its log forgets it
            s.log->forget(eid);
          fail_exec(self, eid, *ev.failure); // x.done describes it with the command
        }
        return;
      }
      break;
    case container_event::kind::none:
      break;
  }
}

// write(2) that never raises SIGPIPE, whatever the process does with it (an
// embedded daemon runs in its trainer's process, which may not ignore it):
// SIGPIPE is blocked on this thread around the write, and one the write
// raised is taken back before the mask is restored.
ssize_t write_without_sigpipe(int fd, const char* data, size_t size) {
  sigset_t pipe_set, old, pending;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigemptyset(&pending);
  ::sigpending(&pending);
  bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  ::pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  auto n = ::write(fd, data, size);
  int err = errno;
  if (n < 0 && err == EPIPE && !was_pending) {
    timespec zero{};
    while (::sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = err;
  return n;
}

// Moves a command's stdin along: writes what the pipe takes (never
// blocking: the command reads at its own pace), lets waiting senders into the
// buffer as it empties, closes the pipe once asked and drained, and watches
// for room when the pipe is full. A command that closed its stdin (EPIPE)
// ends the feed.
void pump_stdin(self_ptr self, uint64_t eid) {
  auto& s = self->state;
  auto it = s.execs.find(eid);
  if (it == s.execs.end() || !it->second.in)
    return;
  auto& x = it->second;
  auto& in = *x.in;
  if (!in.fd)
    return; // a terminal's command not yet running: its bytes wait in buf
  for (;;) {
    while (in.pending() > 0) {
      auto n = write_without_sigpipe(in.fd->get(), in.buf.data() + in.off, in.pending());
      if (n > 0) {
        in.off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        break;
      return end_stdin(s, x, "the command closed its stdin");
    }
    if (in.off == in.buf.size()) {
      in.buf.clear();
      in.off = 0;
    } else if (in.off > stdin_buffer) {
      in.buf.erase(0, in.off);
      in.off = 0;
    }
    // Room: the next waiting sender's bytes go in (it hears how many).
    if (in.waiters.empty() || in.pending() >= stdin_buffer || in.close_after)
      break;
    auto w = std::move(in.waiters.front());
    in.waiters.pop_front();
    auto n = static_cast<uint64_t>(w.data.size());
    if (in.pending() == 0) {
      in.buf = std::move(w.data);
      in.off = 0;
    } else {
      in.buf += w.data;
    }
    in.close_after = w.close;
    w.rp.deliver(n);
  }
  if (in.pending() == 0 && in.close_after && in.pty && !in.eof_sent) {
    // A terminal is not closed: its end-of-file character is typed, which
    // ends a read of the command at the start of a line (in the middle of
    // one it hands over the line first, as ^D does on a terminal).
    in.buf.assign(1, pty::eof_char(in.fd->get()));
    in.off = 0;
    in.eof_sent = true;
    return pump_stdin(self, eid);
  }
  if (in.pending() == 0 && in.close_after) {
    // The pipe closes here (or once a watch still armed is cancelled): the
    // command reads its end. Senders that came after the close hear it.
    return end_stdin(s, x, "the stdin of command " + std::to_string(eid) + " in sandbox "
                             + s.cfg.id + " was closed");
  }
  if (in.pending() > 0 && in.watch == 0) {
    sandbox_actor me = self;
    in.watch = s.cfg.eng->io().watch(in.fd->get(), POLLOUT, [me, eid, fd = in.fd](int res) {
      if (res != -ECANCELED)
        caf::anon_send(me, stdin_atom::value, process_key(), eid);
    });
  }
}

// Command `eid` while it has not finished, else null; and the error the
// by-command verbs (stdin, signal, resize) give for one that does not run.
exec_state* running(sandbox_state& s, uint64_t eid) {
  auto it = s.execs.find(eid);
  return it == s.execs.end() || it->second.finished ? nullptr : &it->second;
}
error not_running(const sandbox_state& s, uint64_t eid) {
  return make_error(errc::not_found,
                    "no command " + std::to_string(eid) + " runs in sandbox " + s.cfg.id);
}

// The stdin verb: `data` (then, with `close`, the end) for command `eid`.
caf::result<uint64_t> feed_stdin(self_ptr self, uint64_t eid, std::string& data, bool close) {
  auto& s = self->state;
  auto* found = running(s, eid);
  if (!found)
    return to_caf(not_running(s, eid));
  auto& x = *found;
  if (!x.in)
    return to_caf(make_error(errc::closed, "the stdin of command " + std::to_string(eid)
                                             + " in sandbox " + s.cfg.id
                                             + (x.open_stdin ? " is closed (or it ended)"
                                                             : " was not left open (open_stdin)")));
  if (data.size() > max_stdin_chunk)
    return to_caf(make_error(errc::too_large, "stdin: at most " + std::to_string(max_stdin_chunk)
                                                + " bytes a message, got "
                                                + std::to_string(data.size())));
  auto& in = *x.in;
  if (in.close_after)
    return to_caf(make_error(errc::closed, "the stdin of command " + std::to_string(eid)
                                             + " in sandbox " + s.cfg.id + " is being closed"));
  if (in.waiters.empty() && in.pending() < stdin_buffer) {
    auto n = static_cast<uint64_t>(data.size());
    if (in.pending() == 0) { // (the message's bytes become the buffer: no copy)
      in.buf = std::move(data);
      in.off = 0;
    } else {
      in.buf += data;
    }
    in.close_after = close;
    pump_stdin(self, eid);
    return n;
  }
  // Full: the sender waits for its reply until the command reads. A few
  // senders may wait; more is a client that does not wait for its replies.
  if (in.waiters.size() >= 8)
    return to_caf(make_error(errc::overloaded,
                             "stdin of command " + std::to_string(eid)
                               + ": 8 messages wait already (wait for their replies)"));
  auto rp = self->make_response_promise<uint64_t>();
  in.waiters.push_back({std::move(data), close, rp});
  return rp;
}

// Starts a command; `done` runs once with its result. `listener` gets the
// output when it is streamed (the requester: take it before making a response
// promise, which takes the sender away from the current message).
void start_exec(self_ptr self, const exec_request& req_in, caf::strong_actor_ptr listener,
                std::function<void(expected<exec_result>)> done) {
  auto& s = self->state;
  exec_request transfer_req;
  if (req_in.transfer != transfer_none) {
    auto t = transfer_command(req_in);
    if (!t)
      return done(std::move(t).error_value());
    transfer_req = std::move(*t);
    done = [done = std::move(done), t = transfer_req](expected<exec_result> r) {
      done(transfer_outcome(t, std::move(r)));
    };
  }
  const exec_request& req = req_in.transfer != transfer_none ? transfer_req : req_in;
  if (s.ph == phase::creating)
    return done(make_error(errc::invalid_argument, "sandbox " + s.cfg.id + " is not ready yet"));
  if (s.ph != phase::ready)
    return done(make_error(errc::not_found, "sandbox " + s.cfg.id + " is being destroyed"));
  if (s.pooled)
    return done(make_error(errc::not_found, "sandbox " + s.cfg.id + " is in a warm pool (nobody's)"));
  if (s.paused)
    return done(make_error(errc::paused, "sandbox " + s.cfg.id
                                           + " is paused: resume it first (dsec resume "
                                           + s.cfg.id + ", sb.resume())"));
  for (const auto& kv : req.env)
    if (kv.find('=') == std::string::npos || kv.front() == '=')
      return done(make_error(errc::invalid_argument, "bad environment entry '" + kv
                                                       + "' (expected KEY=VALUE)"));
  auto made = make_command(req, s.defaults);
  if (!made)
    return done(std::move(made).error_value());
  auto cmd = std::move(*made);
  if (!req.user.empty()) {
    if (!s.users) { // each file from the first of its base's lowers that has it
      s.users.emplace();
      for (size_t i = s.layer_fds.size() - s.base_lowers; i < s.layer_fds.size(); ++i)
        s.users->add_lower(s.layer_fds[i]);
    }
    if (auto u = apply_request_user(cmd, req, *s.users); !u)
      return done(std::move(u).error_value());
  }
  if (req.trusted) {
    if (!s.token)
      return done(make_error(errc::invalid_argument,
                             "a trusted command needs a sandbox made with Chronus (environment"
                             " chronus, `run --chronus`); sandbox " + s.cfg.id + " was not"));
    // Its way to Chronus is the trusted channel, at fd 3 (container::send_exec
    // sets CHRONUS_FD and puts /.dsec/bin first in PATH): no secret to steal.
    cmd.trusted = true;
    cmd.pristine = req.pristine;
  } else if (req.pristine) {
    return done(make_error(errc::invalid_argument,
                           "a pristine command must be a trusted one (--pristine needs "
                           "--trusted)"));
  }
  if (req.tty) {
    if (req.trusted)
      return done(make_error(errc::unsupported,
                             "a terminal (tty) for a trusted command: the agent, root in its "
                             "sandbox, can open the sandbox's terminals, so a trusted "
                             "command's input and output never go through one"));
    if (req.detach)
      return done(make_error(errc::unsupported,
                             "a terminal (tty) for a detached command: nobody would read it"
                             " (leave out -t, or stay attached)"));
    cmd.pty = pty_size{req.rows != 0 ? req.rows : uint16_t{24},
                       req.cols != 0 ? req.cols : uint16_t{80}};
    bool term = false;
    for (const auto& kv : req.env)
      term = term || kv.starts_with("TERM=");
    if (!term) {
      std::erase_if(cmd.env, [](const std::string& e) { return e.starts_with("TERM="); });
      cmd.env.emplace_back("TERM=xterm-256color");
    }
  }
  if (req.open_stdin && (!req.handle || req.detach))
    return done(make_error(errc::invalid_argument,
                           "an open stdin needs a process handle (exec_request.handle) and "
                           "a command that is not detached"));
  stdio io;
  unique_fd in, out_w, err_w;
  std::shared_ptr<unique_fd> out_r, err_r, in_w;
  if (req.tty) {
    // The terminal is its stdin, stdout and stderr (init makes it).
  } else if (req.open_stdin) {
    // A pipe: the command's end blocks like any; ours never does (the
    // stdin verb fills it as the command reads, stdin_feed).
    int p[2];
    if (::pipe2(p, O_CLOEXEC) < 0)
      return done(sys_error("pipe for stdin"));
    in.reset(p[0]);
    in_w = std::make_shared<unique_fd>(p[1]);
    ::fcntl(p[1], F_SETFL, O_NONBLOCK);
    io.in = in.get();
  } else if (!req.input.empty()) {
    // A memfd: the command reads its input at its own pace, we never block.
    in.reset(static_cast<int>(::syscall(SYS_memfd_create, "dsec-stdin", MFD_CLOEXEC)));
    if (!in || ::write(in.get(), req.input.data(), req.input.size())
                  != static_cast<ssize_t>(req.input.size())
        || ::lseek(in.get(), 0, SEEK_SET) < 0)
      return done(sys_error("preparing the command's stdin"));
    io.in = in.get();
  }
  if (!req.tty) { // a detached command's output goes to the sandbox's log
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0)
      return done(sys_error("pipe for stdout"));
    out_r = std::make_shared<unique_fd>(p[0]);
    out_w.reset(p[1]);
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0)
      return done(sys_error("pipe for stderr"));
    err_r = std::make_shared<unique_fd>(p[0]);
    err_w.reset(p[1]);
    // The command's ends block like any pipe; ours stay non-blocking.
    ::fcntl(out_w.get(), F_SETFL, 0);
    ::fcntl(err_w.get(), F_SETFL, 0);
    io.out = out_w.get();
    io.err = err_w.get();
  }
  ++s.commands;
  auto id = s.box->send_exec(cmd, io);
  if (!id)
    return done(std::move(id).error_value());
  uint64_t eid = s.next_exec++;
  auto& x = s.execs[eid];
  x.id = *id;
  x.stream = req.stream;
  x.handle = req.handle;
  x.open_stdin = req.open_stdin;
  x.detach = req.detach;
  x.max_output = req.max_output;
  x.t0 = clock_type::now();
  x.transfer = req.transfer;
  x.window = req.stream ? req.window : 0;
  if (in_w) {
    x.in.emplace();
    x.in->fd = std::move(in_w);
    x.in->buf = req.input; // first, whatever the buffer's bound
  }
  if (req.tty) {
    // Its input goes to the master once it runs: `input`, then what the
    // stdin verb sends, or (without open_stdin) its end right away.
    x.tty = true;
    x.in.emplace();
    x.in->pty = true;
    x.in->buf = req.input;
    x.in->close_after = !req.open_stdin;
  }
  x.done = [cmd, done = std::move(done)](expected<exec_result> r) {
    if (!r && (r.error_value().step == "execve" || r.error_value().step == "chdir"
               || r.error_value().step == "setuid"))
      return done(container::describe_exec_failure(cmd, std::move(r).error_value()));
    done(std::move(r));
  };
  if ((req.stream || req.handle) && listener) {
    // Nobody to stream to any more (the client died, its connection
    // dropped, a handle's call was cancelled): the command is killed rather
    // than left running unread.
    self->monitor(listener);
    x.listener = std::move(listener);
  }
  if (req.tty) {
    x.out_eof = false; // until the master's reader sees the end (attach_terminal)
  } else if (req.detach) {
    // Its output goes to the log (on_output), read as it comes, never held
    // back: the log drops its oldest bytes instead. The command's end does
    // not wait for its pipes (a background child may keep them open).
    if (!s.log)
      s.log = std::make_unique<detached_log>();
    s.log->begin(eid, cmd.argv, unix_ms());
    sandbox_actor me = self;
    auto& io_loop = s.cfg.eng->io();
    io_loop.watch(out_r->get(), POLLIN, pipe_reader{out_r, me, &io_loop, eid, 1, false});
    io_loop.watch(err_r->get(), POLLIN, pipe_reader{err_r, me, &io_loop, eid, 2, false});
  } else {
    x.out_eof = x.err_eof = false;
    sandbox_actor me = self;
    auto& io_loop = s.cfg.eng->io();
    bool manual = x.window > 0;
    x.reader[0].emplace(pipe_reader{out_r, me, &io_loop, eid, 1, manual});
    x.reader[1].emplace(pipe_reader{err_r, me, &io_loop, eid, 2, manual});
    x.watch[0] = io_loop.watch(out_r->get(), POLLIN, *x.reader[0]);
    x.watch[1] = io_loop.watch(err_r->get(), POLLIN, *x.reader[1]);
    if (manual)
      schedule_watch_check(self);
    else
      x.watch[0] = x.watch[1] = 0; // (they re-arm themselves)
  }
  if (req.timeout_ms > 0)
    self->delayed_send(self, std::chrono::milliseconds(req.timeout_ms), timeout_atom::value,
                       process_key(), eid);
  if (x.in && !x.in->buf.empty())
    pump_stdin(self, eid);
}

// The watchdog of flow-controlled (manual) readers. A watch that was armed at
// the last look (a second ago), with nothing read since, on a pipe that has
// data or its end, did not fire: it is cancelled and armed again, and logged.
// Seen once in a few dozen runs of the suite: a 17 MiB stream stopped with
// its pipe full, its watch armed and everything credited, until its TTL.
// poll() with a zero timeout never waits; an idle command costs one a second.
void schedule_watch_check(self_ptr self) {
  auto& s = self->state;
  if (s.watch_check_armed)
    return;
  s.watch_check_armed = true;
  self->delayed_send(self, watch_check_every, timeout_atom::value, process_key(),
                     watch_check_tag);
}

void watch_check(self_ptr self) {
  auto& s = self->state;
  s.watch_check_armed = false;
  bool any = false;
  for (auto& [eid, x] : s.execs)
    for (int i = 0; i < 2; ++i) {
      if (x.watch[i] == 0 || !x.reader[i] || x.finished) {
        x.stale[i] = false;
        continue;
      }
      any = true;
      if (!x.stale[i]) {
        x.stale[i] = true; // looked at next time, if nothing is read meanwhile
        continue;
      }
      pollfd p{x.reader[i]->fd->get(), POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0)
        continue; // nothing to read: the command is quiet
      ++s.lost_watches;
      log::write(log::level::warn, "sandbox",
                 "a command's output watch did not fire with output waiting: armed again",
                 {{"sandbox", s.cfg.id}, {"exec", std::to_string(eid)},
                  {"stream", i == 0 ? "stdout" : "stderr"},
                  {"lost", std::to_string(s.lost_watches)}});
      auto& io = s.cfg.eng->io();
      io.cancel(x.watch[i]); // (if it fired meanwhile, a read of nothing ends it)
      x.stale[i] = false;
      x.watch[i] = io.watch(x.reader[i]->fd->get(), POLLIN, *x.reader[i]);
    }
  if (any)
    schedule_watch_check(self);
}

// Flow control: watches a manual reader's pipe again while the requester
// has room (less than the window unacknowledged), else parks it until credit.
void rearm(self_ptr self, exec_state& x, int i) {
  if (!x.reader[i] || !x.reader[i]->manual)
    return;
  // A get's stderr is collected (bounded), and its held-back start too.
  bool needs_room = x.listener && (x.transfer == transfer_none || (i == 0 && x.flowing));
  if (needs_room && x.unacked >= x.window) {
    x.parked[i] = true;
    return;
  }
  x.parked[i] = false;
  x.stale[i] = false;
  x.watch[i] = self->state.cfg.eng->io().watch(x.reader[i]->fd->get(), POLLIN, *x.reader[i]);
  schedule_watch_check(self);
}

// The credit verb: the requester consumed `bytes` of command `eid`'s output.
bool take_credit(self_ptr self, uint64_t eid, uint64_t bytes) {
  auto& s = self->state;
  auto it = s.execs.find(eid);
  if (it == s.execs.end() || it->second.finished)
    return false;
  auto& x = it->second;
  x.unacked -= std::min(bytes, x.unacked);
  bool woke = false;
  for (int i = 0; i < 2; ++i)
    if (x.parked[i]) {
      rearm(self, x, i);
      woke = woke || !x.parked[i];
    }
  if (woke && x.exited) // the drain timer found it parked: look again later
    self->delayed_send(self, std::chrono::milliseconds(200), timeout_atom::value, process_key(),
                       eid | (1ull << 63));
  return true;
}

void on_output(self_ptr self, uint64_t eid, uint8_t stream, std::string& data, bool eof) {
  auto& s = self->state;
  if (s.log && s.log->owns(eid)) { // a detached command's
    s.log->append(eid, stream, data);
    if (eof)
      s.log->closed(eid, stream);
    wake_log_waiters(self);
    return;
  }
  auto it = s.execs.find(eid);
  if (it == s.execs.end())
    return; // finished already: late output is dropped
  auto& x = it->second;
  uint64_t received = data.size();
  x.watch[stream == 1 ? 0 : 1] = 0; // (its watch fired: this is its read)
  bool held = x.transfer == transfer_get && stream == 1 && !x.flowing;
  if (held && x.out.size() + data.size() >= transfer_hold_back) {
    // Enough to be an archive: what was held back goes out first.
    x.flowing = true;
    data.insert(0, x.out);
    x.out.clear();
    held = false;
  }
  if (held) {
    x.out += data;
  } else if (!data.empty()) {
    // A transfer's stderr is collected for its error, never streamed.
    if (x.stream && x.listener && !(x.transfer != transfer_none && stream == 2)) {
      x.unacked += data.size();
      caf::anon_send(caf::actor_cast<caf::actor>(x.listener),
                     output_chunk{s.cfg.id, eid, stream, std::move(data)});
    } else {
      auto& buf = stream == 1 ? x.out : x.err;
      if (buf.size() < x.max_output) {
        auto room = x.max_output - buf.size();
        if (data.size() > room) {
          buf.append(data, 0, room);
          x.truncated = true;
        } else {
          buf += data;
        }
      } else {
        x.truncated = true;
      }
    }
  }
  auto& left = x.drain_left[stream == 1 ? 0 : 1];
  left -= std::min<uint64_t>(left, received);
  if (eof) {
    (stream == 1 ? x.out_eof : x.err_eof) = true;
    left = 0;
    maybe_finish(self, eid);
  } else if (x.drained && x.drain_left[0] == 0 && x.drain_left[1] == 0) {
    finish_exec(self, eid); // the drain's bytes are taken
  } else if (x.window > 0) {
    rearm(self, x, stream == 1 ? 0 : 1);
  }
}

// Takes the next queued pack, if none runs. The walk of the writable layer
// (which the sandbox may be changing, or may have made huge) runs on a
// detached helper actor, a thread of its own, never on a CAF worker: a slow
// or stuck pack delays only the packs of this sandbox. The helper has a
// descriptor of the upper dir and the cache; the reply hands the cache back.
void run_pack(self_ptr self) {
  auto& s = self->state;
  if (s.packing || s.pack_queue.empty())
    return;
  auto job = std::move(s.pack_queue.front());
  s.pack_queue.pop_front();
  auto refuse = [&](error e) {
    job.rp.deliver(to_caf(e));
    run_pack(self);
  };
  if (s.ph != phase::ready || !s.box)
    return refuse(make_error(errc::not_found, "sandbox " + s.cfg.id + " is being destroyed"));
  auto upper = std::make_shared<unique_fd>(::openat(
    s.box->upper_mount_fd(), "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!*upper)
    return refuse(sys_error("pack: a descriptor of the writable layer of", s.cfg.id));
  s.packing = true;
  // Manifests up to this size ride in the log record: one fsync fewer.
  constexpr size_t inline_limit = 64u << 10;
  auto helper = self->spawn<caf::detached>(
    [upper, cache = s.packs, cancel = s.pack_cancel, uid_base = s.box->uid_base(),
     pack_path = job.pack_path, blob_dir = job.blob_dir](caf::event_based_actor* a) {
      return caf::behavior{[=](pack_atom) -> caf::result<internal_key, std::string> {
        a->quit();
        pack_limits lim;
        lim.cancel = cancel.get();
        lim.max_new_bytes = pack_max_new_bytes;
        std::string manifest;
        auto st = write_pack(upper->get(), pack_path, blob_dir, *cache, uid_base, &manifest,
                             inline_limit, lim);
        if (!st)
          return to_caf(std::move(st).error_value().in_step("pack"));
        return {process_key(), std::move(manifest)};
      }};
    });
  s.pack_running = job.rp;
  self->request(helper, caf::infinite, pack_atom::value)
    .then(
      [self](const internal_key& k, std::string& manifest) {
        auto& s = self->state;
        if (!s.packing)
          return; // answered already (the sandbox is being destroyed)
        s.packing = false;
        if (genuine(k, process_key(), "a pack's result (sandbox)"))
          s.pack_running.deliver(s.cfg.key, std::move(manifest));
        else
          s.pack_running.deliver(
            to_caf(make_error(errc::unauthorized, "a forged pack result")));
        run_pack(self);
      },
      [self](caf::error& e) {
        auto& s = self->state;
        if (!s.packing)
          return;
        s.packing = false;
        s.pack_running.deliver(std::move(e));
        run_pack(self);
      });
}

// What the sandbox uses now (usage_atom; runtime/usage.hpp). procfs and
// statfs are read on a detached helper, a thread of its own: reading a
// process's command line touches its memory, which the sandbox controls, so
// it never runs on a CAF worker. The egress counters come from the node's
// table once the helper answers.
caf::typed_response_promise<sandbox_usage> read_usage(self_ptr self, bool processes) {
  auto& s = self->state;
  auto rp = self->make_response_promise<sandbox_usage>();
  sandbox_usage base;
  base.id = s.cfg.id;
  base.node = s.cfg.node_name;
  auto now = unix_ms();
  base.uptime_ms = s.created_ms && now > s.created_ms ? now - s.created_ms : 0;
  auto helper = self->spawn<caf::detached>(
    [init = s.box->pid(), paths = s.box->cgroup_paths(), processes,
     base](caf::event_based_actor* a) {
      return caf::behavior{[=](usage_atom) -> caf::result<internal_key, sandbox_usage> {
        a->quit();
        auto out = base;
        auto rows = read_sandbox_processes(init, paths, &out.usage);
        if (!rows)
          return to_caf(std::move(rows).error_value().in_step("usage"));
        if (processes)
          out.processes = std::move(*rows);
        return {process_key(), std::move(out)};
      }};
    });
  self->request(helper, caf::infinite, usage_atom::value)
    .then(
      [self, rp](const internal_key& k, sandbox_usage& u) mutable {
        if (!genuine(k, process_key(), "a usage result (sandbox)")) {
          rp.deliver(to_caf(make_error(errc::unauthorized, "a forged usage result")));
          return;
        }
        auto& s = self->state;
        if (s.egress) {
          auto t = s.egress->traffic();
          u.egress = true;
          u.traffic = {s.cfg.id, t.sent_bytes, t.received_bytes, t.connections,
                       t.denied_packets};
        }
        rp.deliver(std::move(u));
      },
      [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
  return rp;
}

// A pooled sandbox handed to a create (claim_atom): from now on it is that
// session's, of that request, with that TTL, as if it had been made for it
// (`keep_upper`: for a session with a trajectory log, whose packs it takes;
// every build keeps the upper dir's descriptor). One that ran anything, or
// is not ready (it is going), fails the request.
bool claim(self_ptr self, const session_actor& session, const std::string& session_id,
           uint64_t request, uint64_t ttl_ms, bool keep_upper) {
  auto& s = self->state;
  if (!s.pooled || !session)
    return false;
  s.pooled = false;
  take_claim(self, s.cfg, session, session_id, request, ttl_ms);
  s.cfg.keep_upper = keep_upper;
  s.route->set(session);
  if (s.ph != phase::ready || s.commands > 0 || !s.box) {
    s.creation_failed_told = true;
    s.created_ms = 0; // never the caller's: its end is no gone_atom
    self->send(session, failed_atom::value, s.cfg.key,
               to_caf(make_error(errc::sandbox_failed, "pooled sandbox " + s.cfg.id
                                                         + " ended before it was claimed")),
               request);
    begin_destroy(self);
    return false;
  }
  s.created_ms = unix_ms();
  self->send(session, ready_atom::value, s.cfg.key, s.cfg.id, sandbox_actor{self}, request);
  if (ttl_ms > 0) {
    s.expires = clock_type::now() + std::chrono::milliseconds(ttl_ms);
    self->delayed_send(self, std::chrono::milliseconds(ttl_ms), ttl_atom::value, process_key(),
                       s.ttl_setting);
  }
  return true;
}

// ---- snapshots (issue 16) ----------------------------------------------------

// Freezes the processes (the freezer opened at the first use).
expected<void> freeze(self_ptr self) {
  auto& s = self->state;
  if (!s.freezer) {
    auto cg = s.cfg.eng->cgroups();
    if (!cg)
      return std::move(cg).error_value().in_step("pause");
    auto f = sandbox_freezer::open(s.box->cgroup_paths(), s.cfg.id, (*cg)->owner());
    if (!f)
      return std::move(f).error_value().in_step("pause");
    s.freezer.emplace(std::move(*f));
  }
  return s.freezer->freeze();
}

// pause (true) / resume (false): the processes frozen and the TTL clock
// stopped, or both going again. True when the state changed.
expected<bool> set_paused(self_ptr self, bool on) {
  auto& s = self->state;
  if (s.pooled)
    return make_error(errc::not_found, "sandbox " + s.cfg.id + " is in a warm pool (nobody's)");
  if (s.ph != phase::ready || !s.box)
    return make_error(s.ph == phase::creating ? errc::invalid_argument : errc::not_found,
                      "sandbox " + s.cfg.id
                        + (s.ph == phase::creating ? " is not ready yet" : " is being destroyed"));
  if (on == s.paused)
    return false;
  if (on) {
    if (!s.snapshotting) // else frozen already
      DSEC_TRY_VOID(freeze(self));
    if (s.cfg.env.ttl_ms > 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(s.expires
                                                                        - clock_type::now());
      s.ttl_left_ms = left.count() > 1 ? static_cast<uint64_t>(left.count()) : 1;
      ++s.ttl_setting; // the running timer finds its setting gone
    }
    s.paused = true;
  } else {
    if (!s.snapshotting) // else the snapshot thaws it when it is done
      DSEC_TRY_VOID(s.freezer->thaw());
    s.paused = false;
    if (s.cfg.env.ttl_ms > 0) {
      ++s.ttl_setting;
      s.expires = clock_type::now() + std::chrono::milliseconds(s.ttl_left_ms);
      self->delayed_send(self, std::chrono::milliseconds(s.ttl_left_ms), ttl_atom::value,
                         process_key(), s.ttl_setting);
    }
  }
  self->send(s.cfg.node, pause_atom::value, process_key(), s.cfg.id, on);
  return true;
}

// pack_diff: frozen for the copy only (unless paused), the upper made a diff
// layer by mkfs.erofs on a detached helper (a thread of its own: the upper is
// the sandbox's, and a big one takes a while), then thawed.
caf::result<internal_key, std::string> take_snapshot(self_ptr self, const std::string& text) {
  auto& s = self->state;
  if (s.pooled)
    return to_caf(make_error(errc::not_found, "sandbox " + s.cfg.id + " is in a warm pool"));
  if (s.ph != phase::ready || !s.box)
    return to_caf(make_error(errc::not_found, "sandbox " + s.cfg.id
                                                + (s.ph == phase::creating ? " is not ready yet"
                                                                           : " is being destroyed")));
  auto ref = parse_layer_ref(text);
  if (!ref)
    return to_caf(make_error(errc::invalid_argument,
                             "snapshot --as '" + text + "': " + ref.error_value().message));
  if (s.snapshotting)
    return to_caf(make_error(errc::in_use, "a snapshot of sandbox " + s.cfg.id
                                             + " is being taken; wait for it"));
  if (s.box->upper_mount_fd() < 0)
    return to_caf(make_error(errc::unsupported, "sandbox " + s.cfg.id
                                                  + " keeps no descriptor of its writable layer"));
  auto upper = std::make_shared<unique_fd>(::fcntl(s.box->upper_mount_fd(), F_DUPFD_CLOEXEC, 0));
  if (!*upper)
    return to_caf(sys_error("snapshot: a descriptor of the writable layer of", s.cfg.id));
  if (!s.paused)
    if (auto f = freeze(self); !f)
      return to_caf(std::move(f).error_value().in_step("snapshot"));
  s.snapshotting = true;
  s.snapshot_rp = self->make_response_promise<internal_key, std::string>();
  diff_options o;
  o.uid_base = s.box->uid_base();
  o.on = format_on(s.cfg.env);
  o.source = "snapshot of sandbox " + s.cfg.id + " (session " + s.cfg.session_id + ", node "
             + s.cfg.node_name + ")";
  // The image holds at most the writable layer's bytes, and some metadata.
  if (s.cfg.env.disk > 0)
    o.max_bytes = 2 * s.cfg.env.disk + (64ull << 20);
  if (s.cfg.env.chronus) // the node binds a fresh one in every Chronus sandbox
    o.exclude.push_back("run/chronus.sock");
  auto st = s.cfg.eng->layers();
  auto helper = self->spawn<caf::detached>(
    [upper, st, o, r = *ref](caf::event_based_actor* a) mutable {
      return caf::behavior{[=](snapshot_atom) mutable -> caf::result<internal_key, std::string> {
        a->quit();
        auto res = st.pack_diff(r, upper->get(), o);
        if (!res)
          return to_caf(std::move(res).error_value().in_step("snapshot"));
        return {process_key(), res->info.digest};
      }};
    });
  self->request(helper, caf::infinite, snapshot_atom::value)
    .then(
      [=](const internal_key&, std::string& digest) {
        auto& s = self->state;
        if (!s.snapshotting)
          return;
        s.snapshotting = false;
        if (!s.paused && s.freezer)
          (void) s.freezer->thaw();
        s.snapshot_rp.deliver(s.cfg.key, std::move(digest));
      },
      [=](caf::error& e) {
        auto& s = self->state;
        if (!s.snapshotting)
          return;
        s.snapshotting = false;
        if (!s.paused && s.freezer)
          (void) s.freezer->thaw();
        s.snapshot_rp.deliver(e);
      });
  return s.snapshot_rp;
}

sandbox_actor::behavior_type sandbox_impl(self_ptr self, sandbox_config cfg) {
  self->state.cfg = std::move(cfg);
  auto& s = self->state;
  s.pooled = s.cfg.pooled;
  s.route->set(s.cfg.session);
  // The session ending ends its sandboxes (a pooled one's: the pool's owner, if any).
  if (s.cfg.session)
    self->monitor(s.cfg.session);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    if (dm.source == s.cfg.session.address()) {
      if (!really_down(s.cfg.session, "a down message of a sandbox's session"))
        return;
      // The session's process went away (its connection dropped: the
      // coordinator died, or the network failed) rather than the session
      // ending: a ready sandbox is kept for the orphan grace, for a restarted
      // coordinator to adopt (docs/cluster.md, "When the coordinator dies").
      if (dm.reason == caf::exit_reason::remote_link_unreachable && s.cfg.orphan_grace.count() > 0
          && !s.pooled && s.ph == phase::ready && s.cfg.session.node() != self->node()) {
        s.orphaned = true;
        self->delayed_send(self, s.cfg.orphan_grace, orphan_atom::value, process_key(),
                           ++s.orphanings);
        return;
      }
      begin_destroy(self);
      return;
    }
    for (auto& [eid, x] : s.execs)
      if (x.listener && x.listener->address() == dm.source && !x.finished && s.box
          && really_down(x.listener, "a down message of a streamed command's listener")) {
        x.listener = nullptr;
        if (!x.exited)
          (void) s.box->signal(x.id, SIGKILL);
        bool woke = false;
        for (int i = 0; i < 2; ++i) // nobody will credit it: read (and drop) to the end
          if (x.parked[i]) {
            rearm(self, x, i);
            woke = true;
          }
        // One that exited parked (its drain waits for credit) drains now.
        if (woke && x.exited)
          self->send(self, timeout_atom::value, process_key(), eid | (1ull << 63));
      }
  });
  self->request(s.cfg.cache, caf::infinite, acquire_atom::value, process_key(), s.cfg.env)
    .then(
      [=](const internal_key& k, layer_set& ls) {
        auto& s = self->state;
        s.acquiring = false;
        if (!genuine(k, process_key(), "the layer cache's reply to acquire")) {
          // Not the cache's: its descriptors are nobody's to use (the real
          // reply, if it comes, is dropped: its lease stays with the cache).
          return fail_creation(self, unauthorized("a reply to acquire"));
        }
        s.lease = ls.lease;
        if (s.ph == phase::destroying) {
          finish_destroy(self);
          return;
        }
        // The image's /etc/passwd (for a User by name) from its own lowers,
        // never from the tree the agent writes.
        auto defaults = command_defaults::of(ls.config, [&]() -> std::optional<std::string> {
          auto n = std::min<size_t>(ls.base_lowers, ls.fds.size());
          for (size_t i = ls.fds.size() - n; i < ls.fds.size(); ++i)
            if (auto text = read_image_passwd(ls.fds[i]))
              return text;
          return std::nullopt;
        });
        if (!defaults)
          return fail_creation(self, std::move(defaults).error_value().in_step("image_config"));
        s.defaults = std::move(*defaults);
        build_extras x;
        x.id = s.cfg.id;
        // Always: snapshots read it (a dup of a descriptor; packs still need
        // cfg.keep_upper, a session with a trajectory log).
        x.keep_upper = true;
        if (!s.cfg.seed_pack.empty() || !s.cfg.seed_manifest.empty()) {
          auto dir = session_data(s.cfg);
          if (!dir)
            return fail_creation(self, std::move(dir).error_value().in_step("restore_pack"));
          if (!s.cfg.seed_pack.empty())
            x.seed_pack = *dir + "/packs/" + s.cfg.seed_pack;
          x.seed_manifest = s.cfg.seed_manifest;
          x.seed_blobs = *dir + "/blobs";
        }
        auto* eng = s.cfg.eng;
        x.host_mounts = &eng->host_mounts();
        if (s.cfg.env.egress && !eng->network())
          return fail_creation(self, make_error(errc::unsupported,
                                                "node " + s.cfg.node_name
                                                  + " has no egress network (dsecd --uplink)")
                                       .in_step("setup_egress"));
        if (s.cfg.env.egress)
          x.resolv_conf = "nameserver " + ipv4_to_string(eng->network()->resolver()) + "\n";
        auto& sp = eng->pick();
        // An egress sandbox joins a namespace wired ahead for this spawner
        // (veth, /31, route, loopback) when one is ready.
        std::optional<egress_network::prewired> pre;
        if (s.cfg.env.egress) {
          pre = eng->network()->take(&sp);
          if (pre)
            x.netns = pre->netns.get();
        }
        auto box = build_sandbox(sp, s.cfg.env, ls.fds, std::move(x),
                                 [eng] { return eng->cgroups(); }, build_until::started);
        if (!box)
          return fail_creation(self, box.error_value());
        s.box = std::move(*box);
        s.base_lowers = std::min<size_t>(ls.base_lowers, ls.fds.size());
        s.layer_fds = std::move(ls.fds); // a move: nothing allocated for it
        if (s.cfg.env.egress) {
          // Its policy (and, without a namespace wired ahead, the veth, /31
          // and route), while init sets itself up: its network namespace
          // exists from the clone on, and no command runs before init
          // reports ready.
          std::unique_ptr<egress_link> link;
          if (pre) {
            link = std::move(pre->link);
            pre.reset(); // our copy of the namespace: init holds its own
            if (auto a = eng->network()->activate(*link, s.cfg.env.allow, s.cfg.env.deny); !a)
              return fail_creation(self, a.error_value());
          } else {
            auto a = eng->network()->attach(s.box->pid(), s.box->pidfd(), s.cfg.env.allow,
                                            s.cfg.env.deny);
            if (!a)
              return fail_creation(self, a.error_value());
            link = std::move(*a);
          }
          s.egress = std::move(link);
          // What it is denied goes to its session as events (on the
          // network's poll thread: straight to the session's mailbox).
          s.egress->watch(s.cfg.id, [route = s.route, key = s.cfg.key,
                                     id = s.cfg.id](const denied_attempt& a) {
            auto session = route->get();
            if (!session)
              return;
            auto ns = static_cast<uint64_t>(
              std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::steady_clock::now().time_since_epoch())
                .count());
            auto what = a.protocol == "dns"
                          ? "dns " + a.name
                          : a.protocol + " " + ipv4_to_string(a.address) + ":"
                              + std::to_string(a.port);
            caf::anon_send(session, chronus_atom::value, key,
                           chronus_event_msg{encode_denied_event(id, ns, what), false, {}});
          });
        }
        for (auto port : s.cfg.env.expose)
          if (auto r = expose_port(self, port); !r)
            return fail_creation(self, std::move(r).error_value().in_step("expose_ports"));
        if (s.cfg.env.chronus) {
          auto token = chronus_token::generate();
          if (!token)
            return fail_creation(self, std::move(token).error_value().in_step("make_chronus"));
          s.token = *token;
          // Events go straight from the reactor thread to the session's mailbox.
          s.cfg.eng->chronus().add(s.cfg.id, s.box->release_chronus_fd(),
                                   s.box->release_channel_fd(), *token,
                                   [route = s.route, key = s.cfg.key](std::string event) {
                                     if (auto session = route->get())
                                       caf::anon_send(session, chronus_atom::value, key,
                                                      chronus_event_msg{std::move(event), false, {}});
                                   });
        }
        watch_control(self);
      },
      [=](caf::error& e) {
        self->state.acquiring = false;
        fail_creation(self, from_caf(e));
      });
  return {
    [=](pack_atom, const internal_key& k,
        const std::string& name) -> caf::result<internal_key, std::string> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "pack (sandbox)"))
        return refuse("pack");
      if (s.ph != phase::ready || !s.box || s.pooled)
        return to_caf(make_error(errc::not_found, "sandbox " + s.cfg.id
                                                    + (s.ph == phase::creating
                                                         ? " is not ready yet"
                                                         : " is being destroyed")));
      if (s.box->upper_mount_fd() < 0 || !s.cfg.keep_upper)
        return to_caf(make_error(errc::invalid_argument,
                                 "sandbox " + s.cfg.id
                                   + " was not made for packs (its session keeps no"
                                     " trajectory log)"));
      if (auto v = check_name(name, "a pack name"); !v)
        return to_caf(v.error_value());
      auto dir = session_data(s.cfg);
      if (!dir)
        return to_caf(std::move(dir).error_value().in_step("pack"));
      auto rp = self->make_response_promise<internal_key, std::string>();
      s.pack_queue.push_back({*dir + "/packs/" + name, *dir + "/blobs", rp});
      run_pack(self);
      return rp;
    },
    [=](exec_atom, const internal_key& k, const exec_request& req) -> caf::result<exec_result> {
      if (!genuine(k, self->state.cfg.key, "exec (sandbox)"))
        return refuse("exec");
      auto listener = self->current_sender();
      auto rp = self->make_response_promise<exec_result>();
      start_exec(self, req, std::move(listener), [rp](expected<exec_result> r) mutable {
        if (r)
          rp.deliver(std::move(*r));
        else
          rp.deliver(to_caf(r.error_value()));
      });
      return rp;
    },
    [=](feedback_atom, const internal_key& k, const chronus_feedback_msg& m) -> caf::result<bool> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "feedback (sandbox)"))
        return refuse("feedback");
      if (!s.token)
        return to_caf(make_error(errc::not_found, "sandbox " + s.cfg.id
                                                    + " has no Chronus (it was made without)"));
      auto fb = decode_feedback(as_bytes(m.bytes));
      if (!fb)
        return to_caf(fb.error_value());
      // Waits for the reactor thread, which never waits for an actor: short.
      if (auto r = s.cfg.eng->chronus().answer_and_wait(s.cfg.id, std::move(*fb)); !r)
        return to_caf(r.error_value());
      return true;
    },
    [=](signal_atom, const internal_key& k, int32_t sig) -> caf::result<bool> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "signal (sandbox)"))
        return refuse("signal");
      if (!s.box || s.ph != phase::ready || s.pooled)
        return to_caf(make_error(errc::not_found, "sandbox " + s.cfg.id + " is not running"));
      for (auto& [eid, x] : s.execs)
        (void) s.box->signal(x.id, sig);
      return true;
    },
    [=](signal_atom, const internal_key& k, uint64_t eid, int32_t sig) -> caf::result<bool> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "signal (sandbox)"))
        return refuse("signal");
      if (sig <= 0 || sig >= NSIG)
        return to_caf(make_error(errc::invalid_argument,
                                 "signal " + std::to_string(sig) + " is not a signal"));
      auto* x = running(s, eid);
      if (!s.box || !x || x->exited)
        return to_caf(not_running(s, eid));
      if (auto r = s.box->signal(x->id, sig); !r)
        return to_caf(r.error_value());
      return true;
    },
    [=](stdin_atom, const internal_key& k, uint64_t eid, std::string& data,
        bool close) -> caf::result<uint64_t> {
      if (!genuine(k, self->state.cfg.key, "stdin (sandbox)"))
        return refuse("stdin");
      return feed_stdin(self, eid, data, close);
    },
    [=](resize_atom, const internal_key& k, uint64_t eid, uint16_t rows,
        uint16_t cols) -> caf::result<bool> {
      if (!genuine(k, self->state.cfg.key, "resize (sandbox)"))
        return refuse("resize");
      auto& s = self->state;
      auto* found = running(s, eid);
      if (!found)
        return to_caf(not_running(s, eid));
      auto& x = *found;
      if (!x.tty)
        return to_caf(make_error(errc::invalid_argument,
                                 "command " + std::to_string(eid) + " in sandbox " + s.cfg.id
                                   + " has no terminal (it was not started with a tty)"));
      if (rows == 0 || cols == 0)
        return to_caf(make_error(errc::invalid_argument,
                                 "a terminal needs at least 1 row and 1 column"));
      if (!x.master) { // not running yet: set when it does
        x.size_pending = pty::window{rows, cols};
        return true;
      }
      if (auto r = pty::resize(x.master->get(), pty::window{rows, cols}); !r)
        return to_caf(r.error_value());
      return true;
    },
    [=](credit_atom, const internal_key& k, uint64_t eid, uint64_t bytes) -> caf::result<bool> {
      if (!genuine(k, self->state.cfg.key, "credit (sandbox)"))
        return refuse("credit");
      return take_credit(self, eid, bytes);
    },
    [=](stdin_atom, const internal_key& k, uint64_t eid) {
      if (!genuine(k, process_key(), "stdin room (sandbox)"))
        return;
      auto& s = self->state;
      auto it = s.execs.find(eid);
      if (it == s.execs.end() || !it->second.in)
        return;
      it->second.in->watch = 0;
      pump_stdin(self, eid);
    },
    [=](put_atom, const internal_key& k, const std::string& dir,
        const std::string& tar) -> caf::result<uint64_t> {
      if (!genuine(k, self->state.cfg.key, "put (sandbox)"))
        return refuse("put");
      auto req = whole_buffer_command(transfer_put, dir, tar);
      if (!req)
        return to_caf(req.error_value());
      auto rp = self->make_response_promise<uint64_t>();
      start_exec(self, *req, nullptr,
                 [rp, size = uint64_t{tar.size()}, dir](expected<exec_result> r) mutable {
                   deliver(rp, put_answer(dir, size, r));
                 });
      return rp;
    },
    [=](get_atom, const internal_key& k, const std::string& path) -> caf::result<std::string> {
      if (!genuine(k, self->state.cfg.key, "get (sandbox)"))
        return refuse("get");
      auto req = whole_buffer_command(transfer_get, path, {});
      if (!req)
        return to_caf(req.error_value());
      auto rp = self->make_response_promise<std::string>();
      start_exec(self, *req, nullptr, [rp, path](expected<exec_result> r) mutable {
        deliver(rp, get_answer(path, std::move(r)));
      });
      return rp;
    },
    [=](destroy_atom, const internal_key& k) -> caf::result<bool> {
      if (!genuine(k, self->state.cfg.key, "destroy (sandbox)"))
        return refuse("destroy");
      auto rp = self->make_response_promise<bool>();
      self->state.destroy_waiters.push_back(rp);
      begin_destroy(self);
      return rp;
    },
    [=](destroy_atom, const internal_key& k, const std::string& why) {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "destroy (sandbox)"))
        return;
      if (!why.empty()) {
        s.end_why = why;
        s.end_code = errc::lost;
      }
      begin_destroy(self);
    },
    [=](list_atom, const internal_key& k) -> caf::result<sandbox_info> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "list (sandbox)"))
        return refuse("list");
      sandbox_info info;
      info.id = s.cfg.id;
      info.session = s.cfg.session_id;
      info.node = s.cfg.node_name;
      info.state = phase_name(s);
      info.env = s.cfg.env;
      info.created_ms = s.created_ms;
      if (s.paused) {
        info.ttl_left_ms = s.ttl_left_ms; // its clock stands still
      } else if (s.cfg.env.ttl_ms > 0 && s.created_ms != 0) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(s.expires
                                                                          - clock_type::now());
        info.ttl_left_ms = left.count() > 0 ? static_cast<uint64_t>(left.count()) : 0;
      }
      info.running = static_cast<uint32_t>(s.execs.size());
      for (const auto& f : s.exposed)
        info.exposed.push_back(describe(*f));
      return info;
    },
    [=](event_atom, const internal_key& k) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "event (sandbox)"))
        return;
      if (!s.box || s.ph == phase::destroying)
        return;
      for (;;) {
        auto ev = s.box->next_event();
        if (!ev) {
          // init is gone or creation failed
          if (s.ph == phase::creating)
            return fail_creation(self, ev.error_value());
          s.failure = ev.error_value().message;
          return begin_destroy(self);
        }
        if (ev->what == container_event::kind::none)
          break;
        on_event(self, *ev);
        if (s.ph == phase::destroying)
          return;
      }
      watch_control(self);
    },
    [=](output_atom, const internal_key& k, uint64_t eid, uint8_t stream, std::string& data,
        bool eof) {
      if (!genuine(k, process_key(), "output (sandbox)"))
        return;
      on_output(self, eid, stream, data, eof);
    },
    [=](reaped_atom, const internal_key& k) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "reaped (sandbox)"))
        return;
      if (!s.box)
        return;
      auto r = s.box->reap();
      if (r && !*r) {
        watch_exit(self); // not yet
        return;
      }
      finish_destroy(self);
    },
    [=](timeout_atom, const internal_key& k, uint64_t tag) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "timeout (sandbox)"))
        return;
      if (tag == watch_check_tag)
        return watch_check(self);
      if ((tag & log_wait_tag) != 0) { // a waiting logs request: it gets what there is
        if (auto w = s.log_waiters.find(tag & ~log_wait_tag); w != s.log_waiters.end())
          answer_log_waiter(s, w);
        return;
      }
      bool drain = (tag >> 63) != 0;
      bool flush = drain && (tag & drain_flush_tag) != 0;
      uint64_t eid = tag & ~((1ull << 63) | drain_flush_tag);
      auto it = s.execs.find(eid);
      if (it == s.execs.end())
        return;
      auto& x = it->second;
      if (flush) {
        x.drained = true;
        if (x.drain_left[0] == 0 && x.drain_left[1] == 0)
          finish_exec(self, eid); // exited, and what its pipes held is taken
        return;
      }
      if (drain) {
        // A flow-controlled one waiting for credit is not done: its pipe
        // still holds output the requester will take (take_credit looks again).
        if (x.parked[0] || x.parked[1])
          return;
        // Exited, a pipe still open (a background child may keep it so): it
        // ends once what the pipes hold now is taken, not what comes later.
        // A read the reactor made already reaches us before the flush.
        for (int i = 0; i < 2; ++i) {
          int n = 0;
          bool open = i == 0 ? !x.out_eof : !x.err_eof;
          if (open && x.reader[i] && ::ioctl(x.reader[i]->fd->get(), FIONREAD, &n) == 0 && n > 0)
            x.drain_left[i] = static_cast<uint64_t>(n);
          else
            x.drain_left[i] = 0;
        }
        sandbox_actor me = self;
        s.cfg.eng->io().post([me, eid] {
          caf::anon_send(me, timeout_atom::value, process_key(),
                         eid | (1ull << 63) | drain_flush_tag);
        });
        return;
      }
      if (!it->second.exited && s.box) {
        it->second.timed_out = true;
        (void) s.box->signal(it->second.id, SIGKILL);
      }
    },
    [=](lifetime_atom, const internal_key& k, uint64_t ms) -> caf::result<uint64_t> {
      if (!genuine(k, self->state.cfg.key, "lifetime (sandbox)"))
        return refuse("lifetime");
      auto& s = self->state;
      if (s.pooled)
        return to_caf(make_error(errc::not_found, "sandbox " + s.cfg.id + " is in a warm pool"));
      if (s.ph != phase::ready)
        return to_caf(make_error(errc::invalid_argument,
                                 "sandbox " + s.cfg.id + " is "
                                   + (s.ph == phase::creating ? "still being created"
                                                              : "being destroyed")
                                   + ": its TTL can be set once it is ready"));
      // A new timer; the one before it finds its setting gone and does nothing.
      ++s.ttl_setting;
      s.cfg.env.ttl_ms = ms;
      if (s.paused) { // starts running at resume
        s.ttl_left_ms = ms;
        return ms;
      }
      s.expires = clock_type::now() + std::chrono::milliseconds(ms);
      self->delayed_send(self, std::chrono::milliseconds(ms), ttl_atom::value, process_key(),
                         s.ttl_setting);
      return ms;
    },
    [=](network_atom, const internal_key& k, const std::vector<std::string>& allow,
        const std::vector<std::string>& deny) -> caf::result<bool> {
      if (!genuine(k, self->state.cfg.key, "network (sandbox)"))
        return refuse("network");
      auto& s = self->state;
      if (!s.cfg.env.egress)
        return to_caf(make_error(errc::invalid_argument,
                                 "sandbox " + s.cfg.id + " has network "
                                   + s.cfg.env.network()
                                   + ": only an egress sandbox has a policy to change"));
      if (s.ph != phase::ready || !s.egress)
        return to_caf(make_error(errc::invalid_argument,
                                 "sandbox " + s.cfg.id + " is "
                                   + (s.ph == phase::creating ? "still being created"
                                                              : "being destroyed")));
      environment e = s.cfg.env;
      e.allow = allow;
      e.deny = deny;
      if (auto v = e.validate(); !v)
        return to_caf(v.error_value());
      if (auto r = s.egress->set_policy(allow, deny); !r)
        return to_caf(r.error_value());
      s.cfg.env.allow = allow;
      s.cfg.env.deny = deny;
      return true;
    },
    [=](usage_atom, const internal_key& k, bool processes) -> caf::result<sandbox_usage> {
      if (!genuine(k, self->state.cfg.key, "usage (sandbox)"))
        return refuse("usage");
      auto& s = self->state;
      if (s.ph != phase::ready || !s.box)
        return to_caf(make_error(errc::not_found, "sandbox " + s.cfg.id + " is "
                                   + (s.ph == phase::creating ? "still being created"
                                                              : "being destroyed")));
      return read_usage(self, processes);
    },
    [=](logs_atom, const internal_key& k, logs_request& q) -> caf::result<logs_reply> {
      if (!genuine(k, self->state.cfg.key, "logs (sandbox)"))
        return refuse("logs");
      auto& s = self->state;
      if (s.pooled)
        return to_caf(make_error(errc::not_found, "sandbox " + s.cfg.id + " is in a warm pool"));
      if (!s.log && q.exec != 0)
        return to_caf(make_error(errc::not_found,
                                 "sandbox " + s.cfg.id + " has run no detached command"));
      if (!s.log) // none ran: an empty log, nobody to wait for
        return detached_log{}.read(q);
      if (q.exec != 0 && !s.log->owns(q.exec))
        return to_caf(make_error(errc::not_found,
                                 "sandbox " + s.cfg.id + " has no detached command "
                                   + std::to_string(q.exec)
                                   + " (`dsec inspect` lists them: the log keeps the first and"
                                     " the 63 latest)"));
      if (!q.wait || s.ph == phase::destroying || s.log->has_news(q))
        return s.log->read(q);
      if (s.log_waiters.size() >= max_log_waiters) // the oldest gets what there is
        answer_log_waiter(s, s.log_waiters.begin());
      auto n = s.next_log_waiter++;
      auto rp = self->make_response_promise<logs_reply>();
      s.log_waiters.emplace(n, sandbox_state::log_waiter{q, rp});
      self->delayed_send(self, log_wait_limit, timeout_atom::value, process_key(),
                         log_wait_tag | n);
      return rp;
    },
    [=](expose_atom, const internal_key& k, uint16_t port) -> caf::result<exposed_port> {
      if (!genuine(k, self->state.cfg.key, "expose (sandbox)"))
        return refuse("expose");
      auto& s = self->state;
      if (s.ph != phase::ready)
        return to_caf(make_error(errc::invalid_argument,
                                 "sandbox " + s.cfg.id + " is "
                                   + (s.ph == phase::creating ? "still being created"
                                                              : "being destroyed")));
      auto r = expose_port(self, port);
      if (!r)
        return to_caf(make_error(r.error_value().code,
                                 "sandbox " + s.cfg.id + ": " + r.error_value().message));
      return *r;
    },
    [=](ttl_atom, const internal_key& k, uint64_t setting) {
      if (!genuine(k, process_key(), "ttl (sandbox)"))
        return;
      auto& s = self->state;
      if (setting != s.ttl_setting)
        return; // a TTL set again since
      s.end_why = "reached its TTL and was destroyed";
      s.end_code = errc::closed;
      self->send(s.cfg.session, ttl_atom::value, s.cfg.key, s.cfg.id); // before its gone_atom
      begin_destroy(self);
    },
    [=](adopt_atom, const internal_key& k, const caf::actor& session, create_labels& labels,
        uint32_t count) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "adopt (sandbox)"))
        return;
      if (!s.orphaned || !session || s.ph != phase::ready)
        return;
      auto sess = caf::actor_cast<session_actor>(session);
      s.orphaned = false;
      s.cfg.session = sess;
      self->monitor(sess);
      s.route->set(sess);
      self->send(sess, adopt_atom::value, s.cfg.key, s.cfg.id, sandbox_actor{self},
                 std::move(labels), count);
    },
    [=](orphan_atom, const internal_key& k, uint64_t n) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "orphan (sandbox)") || !s.orphaned || n != s.orphanings)
        return;
      s.end_why = "was destroyed: its coordinator went away and no restarted one adopted it "
                  "within the node's --orphan-grace";
      begin_destroy(self);
    },
    [=](claim_atom, const internal_key& k, const caf::actor& session,
        const std::string& session_id, uint64_t request, uint64_t ttl_ms,
        bool keep_upper) -> caf::result<bool> {
      if (!genuine(k, process_key(), "claim (sandbox)"))
        return refuse("claim");
      return claim(self, caf::actor_cast<session_actor>(session), session_id, request, ttl_ms,
                   keep_upper);
    },
    // ---- snapshots (issue 16) ----
    [=](pause_atom, const internal_key& k, bool on) -> caf::result<bool> {
      if (!genuine(k, self->state.cfg.key, "pause (sandbox)"))
        return refuse("pause");
      auto r = set_paused(self, on);
      if (!r)
        return to_caf(r.error_value());
      return *r;
    },
    [=](snapshot_atom, const internal_key& k,
        const std::string& ref) -> caf::result<internal_key, std::string> {
      if (!genuine(k, self->state.cfg.key, "snapshot (sandbox)"))
        return refuse("snapshot");
      return take_snapshot(self, ref);
    },
  };
}

} // namespace

sandbox_actor spawn_sandbox(caf::actor_system& sys, sandbox_config cfg) {
  return sys.spawn(sandbox_impl, std::move(cfg));
}

namespace {

class container_backend final : public backend {
public:
  [[nodiscard]] std::string_view name() const override { return backend_container; }
  sandbox_actor spawn(caf::actor_system& sys, sandbox_config cfg) override {
    return spawn_sandbox(sys, std::move(cfg));
  }
};

} // namespace

std::unique_ptr<backend> make_container_backend() {
  return std::make_unique<container_backend>();
}

} // namespace dsec

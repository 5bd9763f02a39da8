#include "actors/session.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "actors/ready_ids.hpp"
#include "actors/sandbox.hpp"
#include "actors/trajectory.hpp"
#include "actors/types.hpp"
#include "runtime/chronus.hpp"
#include "runtime/trajectory.hpp"

namespace dsec {

namespace {

// A sandbox of a resumed session that has not been rebuilt yet: commands are
// answered from its logged steps while they match.
struct replay_box {
  trajectory_plan::box box;
  size_t cursor = 0;           ///< steps answered so far
  bool materializing = false;  ///< being rebuilt; requests wait in `waiting`
  std::optional<error> broken; ///< could not be rebuilt: every request gets this
  std::deque<std::function<void()>> waiting;
  std::vector<size_t> rerun;   ///< steps to run again once rebuilt, in order
};

struct session_state {
  static inline const char* name = "dsec.session";

  session_config cfg;
  std::unordered_map<std::string, sandbox_actor> sandboxes;
  struct batch {
    uint32_t count = 0;
    uint32_t ready = 0;
    uint32_t failed = 0;
    caf::actor listener;
    caf::typed_response_promise<uint32_t> rp;
    // trajectory: the create call's number and environment, or the sandbox
    // this request rebuilds
    uint64_t group = 0;
    environment env;
    std::string rebuild;
    // Ready, not yet told to a listener in another process: sent together
    // (ready_ids) once the mailbox is worked through, or the batch is done.
    std::vector<std::string> unannounced;
  };
  std::unordered_map<uint64_t, batch> batches;
  uint32_t pending = 0; // asked for, not yet ready or failed
  uint64_t next_request = 1;
  bool closing = false;
  bool keep_log = true; // closed by the trainer (close_atom): the log goes
  uint32_t closed_count = 0;
  std::vector<caf::typed_response_promise<uint32_t>> close_waiters;
  // Chronus: who watches the events, and those kept while nobody did.
  std::vector<caf::actor> watchers;
  std::deque<chronus_event_msg> backlog;
  size_t backlog_bytes = 0;
  uint64_t dropped = 0; // the oldest kept events, dropped when the backlog was full

  // ---- trajectory log ----
  std::optional<trajectory_file> log;
  std::string dir;                                  // trajectories/<id>
  std::vector<std::function<void()>> after_sync;    // replies waiting for the fsync
  bool flush_scheduled = false;
  bool announce_scheduled = false; // a flush_atom will send the batches' unannounced
  uint64_t next_group = 1;
  uint64_t next_pack = 1;
  // ---- resume ----
  std::unordered_map<std::string, replay_box> replay;
  std::vector<trajectory_plan::group> groups; // create calls to match, in order
  size_t next_claim = 0;
  std::unordered_set<std::string> destroyed_in_log;
  // ---- the cluster (cfg.cluster) ----
  // Sandboxes admitted by each node and not yet ready or failed, by request;
  // may go below 0 for a while (a ready can overtake the scheduler's placed_atom).
  std::map<caf::node_id, std::unordered_map<uint64_t, int64_t>> inflight;
  std::set<caf::node_id> lost_nodes;
  // Requests to sandboxes on other nodes, answered with errc::lost if the node is.
  struct call {
    caf::node_id where;
    std::function<void(const error&)> fail;
  };
  std::unordered_map<uint64_t, call> calls;
  uint64_t next_call = 1;
  std::unordered_map<std::string, std::string> lost_boxes; // id -> why
};

// Events kept for a watcher that has not come yet; beyond either limit, the
// oldest go.
constexpr size_t max_backlog = 65536;
constexpr size_t max_backlog_bytes = 64u << 20;

using self_ptr = session_actor::stateful_pointer<session_state>;

// ---- the trajectory log -------------------------------------------------------

// Appends a record; `then` runs once it is durable (after the batch's fsync).
void commit(self_ptr self, const trajectory_record& rec, std::function<void()> then = {}) {
  auto& s = self->state;
  if (!s.log) {
    if (then)
      then();
    return;
  }
  if (auto r = s.log->append(encode_record(rec)); !r)
    std::fprintf(stderr, "dsecd: session %s: trajectory log: %s\n", s.cfg.id.c_str(),
                 r.error_value().message.c_str());
  if (then)
    s.after_sync.push_back(std::move(then));
  if (!s.flush_scheduled) {
    // Behind every message already in the mailbox: they join this batch.
    s.flush_scheduled = true;
    self->send(self, flush_atom::value, process_key());
  }
}

void flush(self_ptr self) {
  auto& s = self->state;
  s.flush_scheduled = false;
  if (s.log) {
    if (auto r = s.log->sync(); !r)
      std::fprintf(stderr, "dsecd: session %s: trajectory log: %s\n", s.cfg.id.c_str(),
                   r.error_value().message.c_str());
  }
  auto waiting = std::move(s.after_sync);
  s.after_sync.clear();
  for (auto& f : waiting)
    f();
}

expected<void> open_log(self_ptr self) {
  auto& s = self->state;
  s.dir = trajectory_dir(s.cfg.trajectories, s.cfg.id);
  std::error_code ec;
  std::filesystem::create_directories(s.dir + "/packs", ec);
  if (ec)
    return make_error(errc::system_error, "creating " + s.dir + "/packs: " + ec.message());
  DSEC_TRY(f, trajectory_file::open(s.dir + "/log", true));
  s.log.emplace(std::move(f));
  trajectory_record rec;
  if (s.cfg.resume) {
    rec.kind = trajectory_record::resumed;
  } else {
    rec.kind = trajectory_record::opened;
    rec.options = s.cfg.options;
  }
  DSEC_TRY_VOID(s.log->append(encode_record(rec)));
  return s.log->sync();
}

// ---- ending -----------------------------------------------------------------

// Tells a remote listener the ready sandboxes of its batch not told yet.
template <class Batch>
void announce(Batch& b) {
  if (b.unannounced.empty())
    return;
  if (b.listener) {
    if (b.unannounced.size() == 1)
      caf::anon_send(b.listener, ready_atom::value, std::move(b.unannounced.front()));
    else
      caf::anon_send(b.listener, ready_atom::value, ready_ids{std::move(b.unannounced)});
  }
  b.unannounced.clear();
}

void finish_batch(self_ptr self, uint64_t req) {
  auto& s = self->state;
  auto it = s.batches.find(req);
  if (it == s.batches.end())
    return;
  auto& b = it->second;
  if (b.ready + b.failed < b.count)
    return;
  announce(b);
  if (b.rebuild.empty()) // nobody waits on a rebuild's batch
    b.rp.deliver(b.ready);
  s.batches.erase(it);
}

void maybe_end(self_ptr self) {
  auto& s = self->state;
  if (!s.closing || !s.sandboxes.empty() || s.pending > 0)
    return;
  if (s.log) {
    flush(self);
    s.log.reset();
    if (!s.keep_log) {
      // Closed by its trainer: the run is over, nothing will resume it.
      std::error_code ec;
      std::filesystem::remove_all(s.dir, ec);
    }
  }
  // The scheduler first: once close() has returned, the session is not found.
  caf::anon_send(s.cfg.scheduler, gone_atom::value, process_key(), s.cfg.id);
  for (auto& rp : s.close_waiters)
    rp.deliver(s.closed_count);
  s.close_waiters.clear();
  self->quit();
}

void close_session(self_ptr self) {
  auto& s = self->state;
  if (s.closing)
    return maybe_end(self);
  s.closing = true;
  s.closed_count = static_cast<uint32_t>(s.sandboxes.size());
  for (auto& [id, sb] : s.sandboxes)
    caf::anon_send(sb, destroy_atom::value, s.cfg.key);
  // Sandboxes not rebuilt yet just go (one being rebuilt goes when its
  // ready_atom finds the session closing).
  std::erase_if(s.replay, [](const auto& kv) { return !kv.second.materializing; });
  maybe_end(self);
}

// Finds a sandbox of this session, or says why not.
expected<sandbox_actor> find(self_ptr self, const std::string& id) {
  auto& s = self->state;
  auto it = s.sandboxes.find(id);
  if (it == s.sandboxes.end()) {
    if (auto l = s.lost_boxes.find(id); l != s.lost_boxes.end())
      return make_error(errc::lost, l->second);
    return make_error(errc::not_found, "no sandbox " + id + " in session " + s.cfg.id);
  }
  return it->second;
}

// Asks `to` (sandbox `sb`, or a relay in front of it) and hands the answer
// to `ok` or `err`. A request to a sandbox on another node is kept in
// `calls`: if that node is lost first, `lost` runs instead, at once, and the
// answer (which will not come) is no longer waited for.
template <class... Results, class Handle, class Ok, class Err, class... Ts>
void ask(self_ptr self, const sandbox_actor& sb, const Handle& to, Ok ok, Err err,
         std::function<void(const error&)> lost, Ts... xs) {
  auto& s = self->state;
  uint64_t call = 0;
  if (s.cfg.cluster && sb.node() != self->node()) {
    call = s.next_call++;
    s.calls.emplace(call, session_state::call{sb.node(), std::move(lost)});
  }
  auto live = [self, call] { return call == 0 || self->state.calls.erase(call) > 0; };
  self->request(to, caf::infinite, std::move(xs)...)
    .then(
      [=](Results&... r) mutable {
        if (live())
          ok(r...);
      },
      [=](caf::error& e) mutable {
        if (live())
          err(e);
      });
}

// Hands a request on to sandbox `sb`, its answer going back through `rp`:
// delegated when the sandbox is in this process (or the session is not a
// coordinator's), else asked (see ask), so that the caller hears errc::lost
// as soon as the sandbox's node is lost. The request carries the member key
// after `atom`; the answer (for a client) does not.
template <class Result, class Atom, class... Ts>
void forward_to(self_ptr self, const sandbox_actor& sb, caf::typed_response_promise<Result> rp,
                Atom atom, Ts... xs) {
  auto key = self->state.cfg.key;
  if (!self->state.cfg.cluster || sb.node() == self->node()) {
    rp.delegate(sb, atom, key, std::move(xs)...);
    return;
  }
  ask<Result>(
    self, sb, sb, [rp](Result& r) mutable { rp.deliver(std::move(r)); },
    [rp](caf::error& e) mutable { rp.deliver(e); },
    [rp](const error& e) mutable { rp.deliver(to_caf(e)); }, atom, key, std::move(xs)...);
}

// A relay for a streamed command: the sandbox streams to whoever asked, so the
// relay asks, forwards the chunks to `requester`, and answers with the result.
// With `kept` it also keeps a copy of the output (up to `limit` per stream)
// and puts it into the result. If the requester goes away, so does the relay
// (and the sandbox kills the command as it would have).
struct kept_output {
  std::string out, err;
  bool truncated = false;
};

caf::actor spawn_relay(self_ptr self, sandbox_actor sb, caf::strong_actor_ptr requester,
                       std::shared_ptr<kept_output> kept, uint64_t limit) {
  auto key = self->state.cfg.key;
  return self->spawn([sb, requester, kept, limit, key](caf::event_based_actor* r) -> caf::behavior {
    if (requester) {
      r->monitor(requester);
      r->set_down_handler([r, requester](caf::down_msg& dm) {
        if (dm.source == requester->address()
            && really_down(requester, "a down message of a relay's requester"))
          r->quit();
      });
    }
    return {
      // (from its session only: process surface)
      [=](exec_atom, const internal_key& k, exec_request& q) -> caf::result<exec_result> {
        if (!genuine(k, process_key(), "exec (relay)"))
          return refuse("exec");
        auto p = r->make_response_promise<exec_result>();
        r->request(sb, caf::infinite, exec_atom::value, key, std::move(q))
          .then(
            [=](exec_result& res) mutable {
              if (kept) {
                res.out = std::move(kept->out);
                res.err = std::move(kept->err);
                res.truncated = res.truncated || kept->truncated;
              }
              p.deliver(std::move(res));
              r->quit();
            },
            [=](caf::error& e) mutable {
              p.deliver(e);
              r->quit();
            });
        return p;
      },
      [=](output_chunk& c) {
        if (kept) {
          auto& buf = c.stream == 2 ? kept->err : kept->out;
          size_t room = buf.size() < limit ? limit - buf.size() : 0;
          if (c.data.size() > room)
            kept->truncated = true;
          buf.append(c.data, 0, std::min(room, c.data.size()));
        }
        if (requester)
          caf::anon_send(caf::actor_cast<caf::actor>(requester), std::move(c));
      },
    };
  });
}

// A command without a log: delegated, or (a streamed one on another node)
// through a relay whose call is kept like forward_to's.
void forward_exec(self_ptr self, const sandbox_actor& sb, exec_request req,
                  caf::strong_actor_ptr requester, caf::typed_response_promise<exec_result> rp) {
  auto& s = self->state;
  if (!req.stream || !s.cfg.cluster || sb.node() == self->node())
    return forward_to<exec_result>(self, sb, rp, exec_atom::value, std::move(req));
  auto relay = spawn_relay(self, sb, std::move(requester), nullptr, 0);
  ask<exec_result>(
    self, sb, relay, [rp](exec_result& r) mutable { rp.deliver(std::move(r)); },
    [rp](caf::error& e) mutable { rp.deliver(e); },
    [rp, relay](const error& e) mutable {
      caf::anon_send_exit(relay, caf::exit_reason::kill);
      rp.deliver(to_caf(e));
    },
    exec_atom::value, process_key(), std::move(req));
}

// Answers the current request with `e` (for handlers that return delegated<T>).
template <class T>
caf::delegated<T> fail_with(self_ptr self, const error& e) {
  auto rp = self->make_response_promise<T>();
  rp.deliver(to_caf(e));
  return {};
}

// ---- logged commands ----------------------------------------------------------

// Packs sandbox `sb`'s writable layer after step `rec`, logs the step with
// its pack (or why there is none), and calls `done` once that is durable.
// If the session is closing (the sandbox went first) the step is not logged
// and a resume runs it again on the state before; if the sandbox's node is
// lost first, `lost` runs instead and the step is not logged either (a
// resume rebuilds the sandbox from the pack before, where the trainer's
// step runs once).
void pack_and_log(self_ptr self, const sandbox_actor& sb, trajectory_record rec,
                  std::function<void()> done, std::function<void(const error&)> lost) {
  auto& s = self->state;
  auto pack = rec.sandbox + "-" + std::to_string(s.next_pack++) + ".pack";
  ask<internal_key, std::string>(
    self, sb, sb,
    [=](internal_key& k, std::string& manifest) mutable {
      if (!genuine(k, self->state.cfg.key, "a reply to pack")) {
        rec.pack_error = "the reply to the pack was not the sandbox's (no key)";
        return commit(self, rec, done);
      }
      if (manifest.empty())
        rec.pack = pack;
      else
        rec.pack_inline = std::move(manifest);
      commit(self, rec, done);
    },
    [=](caf::error& e) mutable {
      if (self->state.closing)
        return done();
      rec.pack_error = from_caf(e).message;
      commit(self, rec, done);
    },
    std::move(lost), pack_atom::value, s.cfg.key, pack);
}

// Runs a command in a live sandbox of a session with a log: its result is
// logged (with a pack after it unless it is idempotent) and delivered once
// durable. Streamed output goes to `requester` through a relay actor.
void logged_exec(self_ptr self, const std::string& id, sandbox_actor sb, exec_request req,
                 caf::strong_actor_ptr requester, caf::typed_response_promise<exec_result> rp) {
  auto on_result = [=](exec_result& r) mutable {
    trajectory_record rec;
    rec.kind = trajectory_record::executed;
    rec.sandbox = id;
    rec.req = req;
    rec.req.stream = false;
    rec.req.timeout_ms = 0;
    rec.result = r;
    if (req.stream) {
      // The relay collected the streamed output for the log; the requester
      // has had it already, as it came.
      r.out.clear();
      r.err.clear();
    }
    if (req.idempotent || req.detach) {
      commit(self, rec, [rp, r]() mutable { rp.deliver(std::move(r)); });
      return;
    }
    pack_and_log(
      self, sb, std::move(rec), [rp, r]() mutable { rp.deliver(std::move(r)); },
      [rp](const error& e) mutable { rp.deliver(to_caf(e)); });
  };
  auto fail = [rp](caf::error& e) mutable { rp.deliver(e); };
  if (!req.stream) {
    ask<exec_result>(
      self, sb, sb, on_result, fail, [rp](const error& e) mutable { rp.deliver(to_caf(e)); },
      exec_atom::value, self->state.cfg.key, req);
    return;
  }
  // The sandbox streams to whoever asked: a relay that forwards the chunks
  // and hands the result back here to be logged, with a copy of the output
  // (up to max_output per stream, as a collected command would) for the log.
  auto relay = spawn_relay(self, sb, requester, std::make_shared<kept_output>(),
                           req.max_output);
  ask<exec_result>(
    self, sb, relay, on_result, fail,
    [rp, relay](const error& e) mutable {
      caf::anon_send_exit(relay, caf::exit_reason::kill);
      rp.deliver(to_caf(e));
    },
    exec_atom::value, process_key(), req);
}

void logged_put(self_ptr self, const std::string& id, sandbox_actor sb, std::string dir,
                std::string tar, caf::typed_response_promise<uint64_t> rp) {
  auto digest = put_digest(tar);
  auto lost = [rp](const error& e) mutable { rp.deliver(to_caf(e)); };
  ask<uint64_t>(
    self, sb, sb,
    [=](uint64_t size) mutable {
      trajectory_record rec;
      rec.kind = trajectory_record::put;
      rec.sandbox = id;
      rec.dir = dir;
      rec.digest = digest;
      rec.size = size;
      pack_and_log(self, sb, std::move(rec), [rp, size]() mutable { rp.deliver(size); }, lost);
    },
    [rp](caf::error& e) mutable { rp.deliver(e); }, lost, put_atom::value, self->state.cfg.key,
    dir, std::move(tar));
}

// ---- resume ------------------------------------------------------------------

// Asks for `id` to be rebuilt from its last pack; `then` runs once it is live
// (or broken: then it finds the error in replay_box::broken).
void materialize(self_ptr self, const std::string& id, std::function<void()> then) {
  auto& s = self->state;
  auto& rb = s.replay.at(id);
  rb.waiting.push_back(std::move(then));
  if (rb.materializing)
    return;
  rb.materializing = true;
  auto& steps = rb.box.steps;
  size_t k = rb.cursor;
  // The state after step k-1: the last pack at or before it, then the
  // idempotent commands after that pack, run again.
  ptrdiff_t j = static_cast<ptrdiff_t>(k) - 1;
  for (; j >= 0; --j) {
    const auto& st = steps[static_cast<size_t>(j)];
    if (has_pack(st))
      break;
    bool replayable = st.kind == trajectory_record::executed && st.req.idempotent
                      && st.pack_error.empty();
    if (!replayable) {
      rb.materializing = false;
      std::string what = st.kind == trajectory_record::put ? "the put into " + st.dir
                                                           : "the command '"
                                                               + (st.req.argv.empty()
                                                                    ? std::string{}
                                                                    : st.req.argv[0])
                                                               + "'";
      rb.broken = make_error(errc::sandbox_failed,
                             "sandbox " + id + " cannot be rebuilt at step "
                               + std::to_string(k) + " of its log: no pack was taken after "
                               + what + " (step " + std::to_string(j + 1) + ")"
                               + (st.pack_error.empty() ? "" : ": " + st.pack_error));
      auto waiting = std::move(rb.waiting);
      rb.waiting.clear();
      for (auto& f : waiting)
        f();
      return;
    }
  }
  // Run again once rebuilt: the detached (so idempotent) commands before the
  // pack, whose processes a pack cannot keep, then every command after it.
  rb.rerun.clear();
  for (ptrdiff_t i = 0; i <= j; ++i)
    if (steps[static_cast<size_t>(i)].kind == trajectory_record::executed
        && steps[static_cast<size_t>(i)].req.detach)
      rb.rerun.push_back(static_cast<size_t>(i));
  for (size_t i = static_cast<size_t>(j + 1); i < k; ++i)
    rb.rerun.push_back(i);
  // The pack to start from, by name or (kept in the log) as the manifest
  // itself: the node finds it in its own trajectory dir, never by a path.
  std::string seed_pack, seed_manifest;
  if (j >= 0) {
    const auto& st = steps[static_cast<size_t>(j)];
    if (!st.pack.empty())
      seed_pack = st.pack;
    else
      seed_manifest = st.pack_inline;
  }
  if (k < rb.box.logged) {
    // From here on the log's steps of this sandbox are void: the trainer went
    // another way. A later resume must not answer from them.
    trajectory_record rec;
    rec.kind = trajectory_record::truncated;
    rec.sandbox = id;
    rec.position = k;
    commit(self, rec);
  }
  uint64_t req = s.next_request++;
  auto& b = s.batches[req];
  b.count = 1;
  b.rebuild = id;
  ++s.pending;
  placement pl;
  pl.request = req;
  pl.session_id = s.cfg.id;
  pl.ttl_ms = s.cfg.options.default_ttl_ms;
  pl.keep_upper = true;
  pl.id = id;
  pl.seed_pack = std::move(seed_pack);
  pl.seed_manifest = std::move(seed_manifest);
  self
    ->request(s.cfg.scheduler, caf::infinite, place_atom::value, process_key(), rb.box.env,
              uint32_t{1}, session_actor{self}, std::move(pl))
    .then([](const internal_key&, uint32_t) {},
          [=](caf::error& e) {
            auto& s = self->state;
            auto it = s.batches.find(req);
            if (it == s.batches.end() || it->second.ready + it->second.failed > 0)
              return;
            caf::anon_send(self, failed_atom::value, self->state.cfg.key, e, req);
          });
}

// Runs the commands of replay_box::rerun again, in order, then hands the
// sandbox to the requests that waited.
void replay_tail(self_ptr self, const std::string& id, sandbox_actor sb, size_t next) {
  auto& s = self->state;
  auto it = s.replay.find(id);
  if (it == s.replay.end())
    return;
  auto& rb = it->second;
  if (next < rb.rerun.size()) {
    auto req = rb.box.steps[rb.rerun[next]].req;
    req.stream = false;
    self->request(sb, caf::infinite, exec_atom::value, s.cfg.key, req)
      .then([=](exec_result&) { replay_tail(self, id, sb, next + 1); },
            [=](caf::error& e) {
              auto& s = self->state;
              auto it = s.replay.find(id);
              if (it == s.replay.end())
                return;
              it->second.broken = make_error(errc::sandbox_failed,
                                             "rebuilding sandbox " + id
                                               + ": running an idempotent command of its log"
                                                 " again failed: "
                                               + from_caf(e).message);
              it->second.materializing = false;
              // Not half rebuilt: it goes, and its requests get the error.
              caf::anon_send(sb, destroy_atom::value, s.cfg.key);
              auto waiting = std::move(it->second.waiting);
              it->second.waiting.clear();
              for (auto& f : waiting)
                f();
            });
    return;
  }
  auto waiting = std::move(rb.waiting);
  s.replay.erase(it);
  for (auto& f : waiting)
    f();
}

// A request for sandbox `id`: `live` runs with its actor once there is one
// (rebuilding a replaying sandbox first), `fail` with the error otherwise.
template <class Live, class Fail>
void with_sandbox(self_ptr self, const std::string& id, Live live, Fail fail) {
  auto& s = self->state;
  auto it = s.replay.find(id);
  if (it != s.replay.end()) {
    if (it->second.broken)
      return fail(*it->second.broken);
    materialize(self, id, [=]() mutable {
      auto& s = self->state;
      auto r = s.replay.find(id);
      if (r != s.replay.end() && r->second.broken)
        return fail(*r->second.broken);
      auto sb = find(self, id);
      if (!sb)
        return fail(sb.error_value());
      live(*sb);
    });
    return;
  }
  auto sb = find(self, id);
  if (!sb)
    return fail(sb.error_value());
  live(*sb);
}

// Hands an event to the watchers, or keeps it until one comes.
void publish_event(self_ptr self, chronus_event_msg ev) {
  auto& s = self->state;
  if (s.watchers.empty()) {
    s.backlog_bytes += ev.bytes.size();
    s.backlog.push_back(std::move(ev));
    while (s.backlog.size() > max_backlog || s.backlog_bytes > max_backlog_bytes) {
      s.backlog_bytes -= s.backlog.front().bytes.size();
      s.backlog.pop_front();
      ++s.dropped;
    }
    return;
  }
  for (size_t i = 0; i + 1 < s.watchers.size(); ++i)
    caf::anon_send(s.watchers[i], chronus_atom::value, ev);
  caf::anon_send(s.watchers.back(), chronus_atom::value, std::move(ev));
}

// ---- the cluster ----------------------------------------------------------------

// Sandboxes of request `req` admitted by a node that is lost and not yet
// ready: they fail now (errc::lost).
void settle(self_ptr self, const caf::node_id& where, uint64_t req) {
  auto& s = self->state;
  auto n = s.inflight.find(where);
  if (n == s.inflight.end())
    return;
  auto r = n->second.find(req);
  if (r == n->second.end())
    return;
  if (s.lost_nodes.count(where) && r->second > 0) {
    auto e = to_caf(make_error(errc::lost, "the node a sandbox was being created on was lost"));
    for (int64_t i = 0; i < r->second; ++i)
      caf::anon_send(self, failed_atom::value, s.cfg.key, e, req);
    r->second = 0;
  }
  if (r->second == 0)
    n->second.erase(r);
  if (n->second.empty() && !s.lost_nodes.count(where))
    s.inflight.erase(n);
}

// A node was lost: its sandboxes are gone (each gets a `lost` event), calls
// in flight there fail, and so do creations it had admitted.
void node_lost(self_ptr self, const caf::node_id& where, const std::string& name,
               const std::string& why) {
  auto& s = self->state;
  if (!s.lost_nodes.insert(where).second)
    return;
  auto text = "node " + name + " was lost (" + why + ")";
  std::vector<std::function<void(const error&)>> fails;
  for (auto it = s.calls.begin(); it != s.calls.end();) {
    if (it->second.where == where) {
      fails.push_back(std::move(it->second.fail));
      it = s.calls.erase(it);
    } else {
      ++it;
    }
  }
  std::vector<std::string> gone;
  for (const auto& [id, sb] : s.sandboxes)
    if (sb.node() == where)
      gone.push_back(id);
  auto now_ns = static_cast<uint64_t>(
    std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch())
      .count());
  for (const auto& id : gone) {
    s.sandboxes.erase(id);
    auto msg = "sandbox " + id + " is gone: its " + text;
    s.lost_boxes.emplace(id, msg);
    publish_event(self, chronus_event_msg{encode_lost_event(id, now_ns, msg)});
  }
  for (auto& f : fails)
    f(make_error(errc::lost, "the sandbox's " + text));
  std::vector<uint64_t> reqs;
  if (auto n = s.inflight.find(where); n != s.inflight.end())
    for (const auto& [req, count] : n->second)
      reqs.push_back(req);
  for (auto req : reqs)
    settle(self, where, req);
  maybe_end(self);
}

session_actor::behavior_type session_impl(self_ptr self, session_config cfg) {
  self->state.cfg = std::move(cfg);
  auto& st = self->state;
  if (st.cfg.trainer)
    self->monitor(st.cfg.trainer);
  if (st.cfg.options.trajectory) {
    if (st.cfg.trajectories.empty()) {
      std::fprintf(stderr, "dsecd: session %s: no place for trajectory logs\n",
                   st.cfg.id.c_str());
    } else if (auto r = open_log(self); !r) {
      std::fprintf(stderr, "dsecd: session %s: trajectory log: %s\n", st.cfg.id.c_str(),
                   r.error_value().message.c_str());
      st.log.reset();
    }
  }
  if (st.cfg.resume) {
    const auto& plan = *st.cfg.resume;
    st.next_group = plan.next_group;
    st.groups = plan.groups;
    for (const auto& b : plan.boxes) {
      if (b.destroyed) {
        st.destroyed_in_log.insert(b.id);
        continue;
      }
      st.replay.emplace(b.id, replay_box{b, 0, false, std::nullopt, {}, {}});
    }
  }
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    if (s.cfg.trainer && dm.source == s.cfg.trainer.address()) {
      if (really_down(s.cfg.trainer, "a down message of a session's trainer"))
        close_session(self); // the trainer died: its log stays for a resume
      return;
    }
    auto& w = s.watchers;
    w.erase(std::remove_if(w.begin(), w.end(),
                           [&](const caf::actor& a) {
                             return a.address() == dm.source
                                    && really_down(a, "a down message of a watcher");
                           }),
            w.end());
  });
  return {
    [=](create_atom, environment& env, uint32_t count,
        const caf::actor& listener) -> caf::result<uint32_t> {
      auto& s = self->state;
      if (s.closing)
        return to_caf(make_error(errc::not_found, "session " + s.cfg.id + " is closing"));
      if (count == 0)
        return uint32_t{0};
      if (env.base.empty())
        return to_caf(make_error(errc::invalid_argument, "an environment needs a base layer"));
      if (env.backend != "container")
        return to_caf(make_error(errc::unsupported, "backend '" + env.backend
                                                      + "' is not available (only container)"));
      if (s.next_claim < s.groups.size()) {
        // A resumed session: the trainer's creates, again, get the sandboxes
        // its log has, while they match the create calls it logged.
        const auto& g = s.groups[s.next_claim];
        if (same_environment(g.env, env) && g.count == count) {
          ++s.next_claim;
          uint32_t ready = 0;
          for (const auto& id : g.ids) {
            if (listener)
              caf::anon_send(listener, ready_atom::value, id);
            ++ready;
          }
          for (uint32_t i = ready; i < count; ++i)
            if (listener)
              caf::anon_send(listener, failed_atom::value,
                             to_caf(make_error(errc::overloaded,
                                               "failed before the session was resumed (its"
                                               " log says so)")));
          return ready;
        }
        s.next_claim = s.groups.size(); // the trainer went another way
      }
      uint64_t in_use = s.sandboxes.size() + s.pending + s.replay.size();
      if (in_use + count > s.cfg.options.quota)
        return to_caf(make_error(errc::overloaded,
                                 "session " + s.cfg.id + " quota: " + std::to_string(in_use)
                                   + " sandboxes live or coming, " + std::to_string(count)
                                   + " more asked for, at most "
                                   + std::to_string(s.cfg.options.quota)));
      uint64_t req = s.next_request++;
      auto& b = s.batches[req];
      b.count = count;
      b.listener = listener;
      b.rp = self->make_response_promise<uint32_t>();
      if (s.log) {
        b.group = s.next_group++;
        b.env = env;
      }
      s.pending += count;
      auto rp = b.rp;
      placement pl;
      pl.request = req;
      pl.session_id = s.cfg.id;
      pl.ttl_ms = s.cfg.options.default_ttl_ms;
      pl.keep_upper = s.log.has_value();
      self
        ->request(s.cfg.scheduler, caf::infinite, place_atom::value, process_key(),
                  std::move(env), count, session_actor{self}, std::move(pl))
        .then([](const internal_key&, uint32_t) {},
              [=](caf::error& e) {
                // Nothing was placed: every one of them failed.
                auto& s = self->state;
                auto it = s.batches.find(req);
                if (it == s.batches.end())
                  return;
                uint32_t left = it->second.count - it->second.ready - it->second.failed;
                for (uint32_t i = 0; i < left; ++i)
                  caf::anon_send(self, failed_atom::value, self->state.cfg.key, e, req);
              });
      return rp;
    },
    [=](exec_atom, const std::string& id, exec_request& req)
      -> caf::delegated<exec_result> {
      auto& s = self->state;
      if (!s.log && !s.replay.count(id)) {
        // No log: the sandbox answers the caller directly (and streams to it).
        if (auto sb = find(self, id)) {
          auto requester = self->current_sender();
          auto rp = self->make_response_promise<exec_result>();
          forward_exec(self, *sb, std::move(req), std::move(requester), rp);
          return {};
        } else
          return fail_with<exec_result>(self, sb.error_value());
      }
      // Who streamed output goes to: take it before the promise takes it away.
      auto requester = self->current_sender();
      auto rp = self->make_response_promise<exec_result>();
      if (req.detach && !req.idempotent) {
        rp.deliver(to_caf(make_error(errc::invalid_argument,
                                     "a detached command in a session with a trajectory log"
                                     " must be marked idempotent (exec_request.idempotent,"
                                     " --idempotent): its effects cannot be packed at any"
                                     " one point")));
        return {};
      }
      if (auto it = s.replay.find(id); it != s.replay.end() && !it->second.materializing
                                       && !it->second.broken) {
        auto& rb = it->second;
        if (rb.cursor < rb.box.steps.size()) {
          const auto& step = rb.box.steps[rb.cursor];
          // A detached command too: its process is started again when the
          // sandbox is rebuilt (materialize), not before it is needed.
          if (step.kind == trajectory_record::executed && same_command(step.req, req)
              && step.req.detach == req.detach) {
            ++rb.cursor;
            auto r = step.result;
            if (req.stream) {
              // As it came the first time, minus the timing.
              auto to = caf::actor_cast<caf::actor>(requester);
              if (to && !r.out.empty())
                caf::anon_send(to, output_chunk{id, 0, 1, std::move(r.out)});
              if (to && !r.err.empty())
                caf::anon_send(to, output_chunk{id, 0, 2, std::move(r.err)});
              r.out.clear();
              r.err.clear();
            }
            rp.deliver(std::move(r));
            return {};
          }
        }
      }
      with_sandbox(
        self, id,
        [=](sandbox_actor sb) mutable { logged_exec(self, id, sb, req, requester, rp); },
        [=](const error& e) mutable { rp.deliver(to_caf(e)); });
      return {};
    },
    [=](put_atom, const std::string& id, std::string& dir,
        std::string& tar) -> caf::delegated<uint64_t> {
      auto& s = self->state;
      if (!s.log && !s.replay.count(id)) {
        if (auto sb = find(self, id)) {
          auto rp = self->make_response_promise<uint64_t>();
          forward_to<uint64_t>(self, *sb, rp, put_atom::value, std::move(dir), std::move(tar));
          return {};
        } else
          return fail_with<uint64_t>(self, sb.error_value());
      }
      auto rp = self->make_response_promise<uint64_t>();
      if (auto it = s.replay.find(id); it != s.replay.end() && !it->second.materializing
                                       && !it->second.broken) {
        auto& rb = it->second;
        if (rb.cursor < rb.box.steps.size()) {
          const auto& step = rb.box.steps[rb.cursor];
          if (step.kind == trajectory_record::put && step.dir == dir
              && step.digest == put_digest(tar)) {
            ++rb.cursor;
            rp.deliver(step.size);
            return {};
          }
        }
      }
      with_sandbox(
        self, id,
        [=](sandbox_actor sb) mutable { logged_put(self, id, sb, dir, tar, rp); },
        [=](const error& e) mutable { rp.deliver(to_caf(e)); });
      return {};
    },
    [=](get_atom, const std::string& id, std::string& path) -> caf::delegated<std::string> {
      auto rp = self->make_response_promise<std::string>();
      with_sandbox(
        self, id, [=](sandbox_actor sb) mutable {
          forward_to<std::string>(self, sb, rp, get_atom::value, path);
        },
        [=](const error& e) mutable { rp.deliver(to_caf(e)); });
      return {};
    },
    [=](destroy_atom, const std::string& id) -> caf::delegated<bool> {
      auto& s = self->state;
      auto rp = self->make_response_promise<bool>();
      trajectory_record rec;
      rec.kind = trajectory_record::destroyed;
      rec.sandbox = id;
      if (auto it = s.replay.find(id); it != s.replay.end() && !it->second.materializing) {
        // Never rebuilt: nothing to tear down.
        s.replay.erase(it);
        s.destroyed_in_log.insert(id);
        commit(self, rec, [rp]() mutable { rp.deliver(true); });
        return {};
      }
      if (s.destroyed_in_log.count(id) && !s.sandboxes.count(id) && !s.replay.count(id)) {
        rp.deliver(true); // destroyed before the resume, destroyed again
        return {};
      }
      with_sandbox(
        self, id,
        [=](sandbox_actor sb) mutable {
          if (!self->state.log) {
            forward_to<bool>(self, sb, rp, destroy_atom::value);
            return;
          }
          self->request(sb, caf::infinite, destroy_atom::value, self->state.cfg.key)
            .then([=](bool ok) mutable { commit(self, rec, [rp, ok]() mutable { rp.deliver(ok); }); },
                  [=](caf::error& e) mutable { rp.deliver(e); });
        },
        [=](const error& e) mutable { rp.deliver(to_caf(e)); });
      return {};
    },
    [=](list_atom) -> caf::result<std::vector<sandbox_info>> {
      auto& s = self->state;
      std::vector<std::pair<std::string, sandbox_actor>> boxes;
      for (auto& [id, sb] : s.sandboxes)
        boxes.emplace_back(id, sb);
      std::vector<sandbox_info> known;
      for (auto& [id, rb] : s.replay) {
        if (rb.materializing)
          continue;
        sandbox_info info;
        info.id = id;
        info.session = s.cfg.id;
        info.state = rb.broken ? "broken" : "replaying";
        info.env = rb.box.env;
        known.push_back(std::move(info));
      }
      auto rp = self->make_response_promise<std::vector<sandbox_info>>();
      // 3 s for each: a sandbox on a hung node shows as "no answer" rather
      // than holding up the list.
      gather_infos_or_silent(
        self, s.cfg.key, std::move(known), boxes, s.cfg.id, std::chrono::seconds(3),
        [rp](std::vector<sandbox_info> all) mutable { rp.deliver(std::move(all)); });
      return rp;
    },
    [=](watch_atom, const caf::actor& watcher) -> caf::result<uint64_t> {
      auto& s = self->state;
      if (!watcher)
        return to_caf(make_error(errc::invalid_argument, "watch: no watcher given"));
      self->monitor(watcher);
      s.watchers.push_back(watcher);
      uint64_t kept = s.backlog.size();
      for (auto& ev : s.backlog)
        caf::anon_send(watcher, chronus_atom::value, std::move(ev));
      s.backlog.clear();
      s.backlog_bytes = 0;
      return kept;
    },
    [=](chronus_atom, const internal_key& k, chronus_event_msg& ev) {
      if (genuine(k, self->state.cfg.key, "chronus (session)"))
        publish_event(self, std::move(ev));
    },
    [=](placed_atom, const internal_key& k, uint64_t req, const caf::node_id& where, uint32_t n) {
      if (!genuine(k, process_key(), "placed (session)"))
        return;
      self->state.inflight[where][req] += n;
      settle(self, where, req);
    },
    [=](lost_atom, const internal_key& k, const caf::node_id& where, const std::string& name,
        const std::string& why) {
      if (genuine(k, process_key(), "lost (session)"))
        node_lost(self, where, name, why);
    },
    [=](join_atom, const internal_key& k, const caf::node_id& where) {
      // A node lost while it hung has destroyed what it had and joined
      // again (the same process: the same node id).
      if (!genuine(k, process_key(), "join (session)"))
        return;
      auto& s = self->state;
      if (s.lost_nodes.erase(where))
        s.inflight.erase(where);
    },
    [=](feedback_atom, const std::string& id,
        chronus_feedback_msg& fb) -> caf::delegated<bool> {
      auto rp = self->make_response_promise<bool>();
      with_sandbox(
        self, id, [=](sandbox_actor sb) mutable {
          forward_to<bool>(self, sb, rp, feedback_atom::value, fb);
        },
        [=](const error& e) mutable { rp.deliver(to_caf(e)); });
      return {};
    },
    [=](close_atom) -> caf::result<uint32_t> {
      auto rp = self->make_response_promise<uint32_t>();
      self->state.close_waiters.push_back(rp);
      self->state.keep_log = false;
      close_session(self);
      return rp;
    },
    [=](shutdown_atom, const internal_key& k) {
      if (genuine(k, process_key(), "shutdown (session)"))
        close_session(self);
    },
    [=](flush_atom, const internal_key& k) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "flush (session)"))
        return;
      if (s.announce_scheduled) {
        s.announce_scheduled = false;
        for (auto& [req, b] : s.batches)
          announce(b);
      }
      flush(self);
    },
    [=](ready_atom, const internal_key& k, const std::string& id, const sandbox_actor& sb,
        uint64_t req) {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "ready (session)"))
        return;
      if (s.cfg.cluster) {
        auto where = sb.node();
        if (s.lost_nodes.count(where)) {
          // Its node was declared lost (it stopped answering) and it failed
          // then: too late now.
          caf::anon_send(sb, destroy_atom::value, s.cfg.key);
          return;
        }
        --s.inflight[where][req];
        settle(self, where, req);
      }
      --s.pending;
      s.sandboxes.emplace(id, sb); // until its gone_atom, also when closing
      auto it = s.batches.find(req);
      if (s.closing) {
        // Too late: it goes with the rest, counted by close, and its batch
        // hears that it failed rather than that it is ready.
        ++s.closed_count;
        caf::anon_send(sb, destroy_atom::value, s.cfg.key);
        if (it != s.batches.end()) {
          ++it->second.failed;
          if (!it->second.rebuild.empty()) {
            auto r = s.replay.find(it->second.rebuild);
            if (r != s.replay.end()) {
              r->second.broken = make_error(errc::not_found, "session " + s.cfg.id
                                                                 + " closed");
              auto waiting = std::move(r->second.waiting);
              s.replay.erase(r);
              for (auto& f : waiting)
                f();
            }
          }
          if (it->second.listener)
            caf::anon_send(it->second.listener, failed_atom::value,
                           to_caf(make_error(errc::not_found, "sandbox " + id
                                                                + " was ready after session "
                                                                + s.cfg.id + " closed")));
          finish_batch(self, req);
        }
        return;
      }
      if (it != s.batches.end()) {
        if (!it->second.rebuild.empty()) {
          ++it->second.ready;
          auto rebuilt = it->second.rebuild;
          finish_batch(self, req);
          replay_tail(self, rebuilt, sb, 0);
          return;
        }
        // Counted when announced: the batch's reply must not overtake it.
        auto announce = [=] {
          auto& s = self->state;
          auto it = s.batches.find(req);
          if (it == s.batches.end())
            return;
          auto& b = it->second;
          ++b.ready;
          if (b.listener && b.listener.node() != self->node()) {
            // One message (and one serialization) for many.
            b.unannounced.push_back(id);
            if (b.ready + b.failed < b.count && !s.announce_scheduled) {
              s.announce_scheduled = true;
              self->send(self, flush_atom::value, process_key()); // behind what is in the mailbox
            }
          } else if (b.listener) {
            caf::anon_send(b.listener, ready_atom::value, id);
          }
          finish_batch(self, req);
        };
        if (s.log) {
          trajectory_record rec;
          rec.kind = trajectory_record::created;
          rec.sandbox = id;
          rec.env = it->second.env;
          rec.group = it->second.group;
          rec.group_count = it->second.count;
          commit(self, rec, announce);
        } else {
          announce();
        }
      }
    },
    [=](failed_atom, const internal_key& k, const caf::error& e, uint64_t req) {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "failed (session)"))
        return;
      if (auto sender = self->current_sender(); s.cfg.cluster && sender) {
        auto where = sender->node();
        if (s.lost_nodes.count(where))
          return; // failed already, when its node was lost
        --s.inflight[where][req];
        settle(self, where, req);
      }
      --s.pending;
      auto it = s.batches.find(req);
      if (it != s.batches.end()) {
        ++it->second.failed;
        if (!it->second.rebuild.empty()) {
          auto r = s.replay.find(it->second.rebuild);
          if (r != s.replay.end()) {
            r->second.materializing = false;
            r->second.broken = from_caf(e);
            r->second.broken->message = "rebuilding sandbox " + r->first + ": "
                                        + r->second.broken->message;
            auto waiting = std::move(r->second.waiting);
            r->second.waiting.clear();
            for (auto& f : waiting)
              f();
          }
        } else {
          if (s.log) {
            trajectory_record rec;
            rec.kind = trajectory_record::failed;
            rec.env = it->second.env;
            rec.group = it->second.group;
            rec.group_count = it->second.count;
            commit(self, rec);
          }
          if (it->second.listener)
            caf::anon_send(it->second.listener, failed_atom::value, e);
        }
        finish_batch(self, req);
      }
      maybe_end(self);
    },
    [=](gone_atom, const internal_key& k, const std::string& id) {
      if (!genuine(k, self->state.cfg.key, "gone (session)"))
        return;
      self->state.sandboxes.erase(id);
      maybe_end(self);
    },
  };
}

} // namespace

session_actor spawn_session(caf::actor_system& sys, session_config cfg) {
  return sys.spawn(session_impl, std::move(cfg));
}

} // namespace dsec

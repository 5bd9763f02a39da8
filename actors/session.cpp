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
  bool claimed = false;        ///< a create of the resumed trainer got it (its key)
  bool closed = false;         ///< destroyed by the trainer before the resume: never rebuilt
  bool destroyed_again = false; ///< closed, and destroyed again by the resumed trainer
  size_t next_event = 0;       ///< box.events replayed so far
};

// The labels of a sandbox (create_labels): its key, its create's key and tags.
struct box_labels {
  std::string key;
  std::string group_key;
  std::map<std::string, std::string> tags;
  uint64_t ttl_ms = 0; ///< its TTL, to say so when it ran out
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
    // create_labels: the call came with them (its listener hears ready_ids
    // with keys); its key, tags, the index of its next sandbox, their TTL
    bool labeled = false;
    std::string key;
    std::map<std::string, std::string> tags;
    uint32_t next_index = 0;
    uint64_t ttl_ms = 0;
    std::vector<std::string> unannounced_keys;
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
  // ---- keys (create_labels) ----
  std::unordered_map<std::string, box_labels> labels;  // sandbox id -> its labels
  std::unordered_map<std::string, std::string> by_key; // sandbox key -> id
  // create key -> its sandboxes live, coming back, or replaying and claimed
  std::unordered_map<std::string, std::unordered_set<std::string>> key_members;
  std::unordered_map<std::string, uint32_t> key_batches; // create key -> batches in flight
  // create key -> the log's create calls with it not yet claimed, in order (resume)
  std::unordered_map<std::string, std::deque<size_t>> logged_keys;
  uint64_t replay_claimed = 0; // claimed, not closed, not being rebuilt: in the quota
  // ---- why sandboxes went, for the requests that come after ----
  std::unordered_set<std::string> destroying; // asked by the trainer
  std::unordered_set<std::string> expired;    // their TTL ran out
  std::unordered_map<std::string, std::string> ended; // id -> why (the latest max_ended)
  std::deque<std::string> ended_order;
  // Feedback requests sent again from the log, by sandbox and seq: their
  // answers are accepted whatever became of the sandbox since.
  std::set<std::pair<std::string, uint64_t>> replayed_requests;
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
// Sandboxes whose end is remembered (to say why in a later request's error).
constexpr size_t max_ended = 65536;
// A create's key and tags: bounds.
constexpr size_t max_key = 256;
constexpr size_t max_tags = 64;
constexpr size_t max_tags_bytes = 16384;

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

// Appends a record that nobody waits for (a Chronus event, an answer): the
// next commit's fsync makes it durable, and the steps it belongs before come
// after it in the log.
void append_only(self_ptr self, const trajectory_record& rec) {
  auto& s = self->state;
  if (!s.log)
    return;
  if (auto r = s.log->append(encode_record(rec)); !r)
    std::fprintf(stderr, "dsecd: session %s: trajectory log: %s\n", s.cfg.id.c_str(),
                 r.error_value().message.c_str());
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
  if (b.listener && b.labeled) {
    caf::anon_send(b.listener, ready_atom::value,
                   ready_ids{std::move(b.unannounced), std::move(b.unannounced_keys)});
  } else if (b.listener) {
    if (b.unannounced.size() == 1)
      caf::anon_send(b.listener, ready_atom::value, std::move(b.unannounced.front()));
    else
      caf::anon_send(b.listener, ready_atom::value, ready_ids{std::move(b.unannounced), {}});
  }
  b.unannounced.clear();
  b.unannounced_keys.clear();
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
  if (!b.key.empty())
    if (auto k = s.key_batches.find(b.key); k != s.key_batches.end() && --k->second == 0)
      s.key_batches.erase(k);
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
  // A normal exit says "closed" to the trainer's calls still coming
  // (errc::closed); a session that keeps its log (its trainer died, its
  // daemon stops) ends otherwise: they hear `disconnected`.
  self->quit(s.keep_log ? caf::make_error(caf::exit_reason::user_shutdown) : caf::error{});
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
    if (auto e = s.ended.find(id); e != s.ended.end())
      return make_error(errc::closed, e->second);
    return make_error(errc::not_found, "no sandbox " + id + " in session " + s.cfg.id);
  }
  return it->second;
}

// ---- keys and ends of sandboxes -----------------------------------------------

std::string sandbox_key(const std::string& create_key, uint32_t count, uint32_t index) {
  return count == 1 ? create_key : create_key + "#" + std::to_string(index);
}

// Gives sandbox `id`, ready for batch `b`, its key (the next index of its
// create) and remembers its labels; returns the key.
template <class Batch>
std::string label_sandbox(self_ptr self, Batch& b, const std::string& id) {
  auto& s = self->state;
  auto key = sandbox_key(b.key, b.count, b.next_index++);
  s.labels[id] = box_labels{key, b.key, b.tags, b.ttl_ms};
  s.by_key[key] = id;
  s.key_members[b.key].insert(id);
  return key;
}

// A sandbox no longer counts for its create's key (it ended, or was
// destroyed while replaying).
void release_key(self_ptr self, const std::string& id) {
  auto& s = self->state;
  auto l = s.labels.find(id);
  if (l == s.labels.end())
    return;
  if (auto m = s.key_members.find(l->second.group_key); m != s.key_members.end()) {
    m->second.erase(id);
    if (m->second.empty())
      s.key_members.erase(m);
  }
}

// Remembers why sandbox `id` went, for the requests that still come for it
// (errc::closed, saying so), and forgets its labels.
void note_end(self_ptr self, const std::string& id) {
  auto& s = self->state;
  std::string why;
  if (s.destroying.erase(id) > 0) {
    why = "sandbox " + id + " was destroyed by its trainer (destroy, or its session closing)";
  } else if (s.expired.erase(id) > 0) {
    auto l = s.labels.find(id);
    auto ttl = l != s.labels.end() ? l->second.ttl_ms : 0;
    why = "sandbox " + id + " reached its TTL"
          + (ttl ? " of " + std::to_string(ttl / 1000) + "." + std::to_string(ttl % 1000 / 100)
                     + " s"
                 : std::string{})
          + " and was destroyed (give the create a longer ttl)";
  } else {
    why = "sandbox " + id + " ended on its own: it failed, or its node stopped it (dsecd's log"
          " says why)";
  }
  release_key(self, id);
  s.labels.erase(id);
  if (s.ended.insert_or_assign(id, std::move(why)).second)
    s.ended_order.push_back(id);
  while (s.ended_order.size() > max_ended) {
    auto old = std::move(s.ended_order.front());
    s.ended_order.pop_front();
    s.ended.erase(old);
    if (auto l = s.labels.find(old); l == s.labels.end())
      std::erase_if(s.by_key, [&](const auto& kv) { return kv.second == old; });
  }
}

// A create's key and tags, checked: what is wrong, named.
expected<void> check_labels(self_ptr self, const create_labels& l) {
  auto& s = self->state;
  if (l.key.size() > max_key)
    return make_error(errc::invalid_argument, "create key: at most " + std::to_string(max_key)
                                                + " bytes, got " + std::to_string(l.key.size()));
  if (l.key.find('\0') != std::string::npos)
    return make_error(errc::invalid_argument, "create key: contains a NUL byte");
  if (l.key.find('#') != std::string::npos && !s.logged_keys.count(l.key))
    return make_error(errc::invalid_argument,
                      "create key '" + l.key + "': '#' is dsec's own (\"#N\" for a create"
                      " without a key, K#i for the sandboxes of a batch); pass such a key"
                      " back only to resume its create");
  if (l.tags.size() > max_tags)
    return make_error(errc::invalid_argument, "tags: at most " + std::to_string(max_tags)
                                                + ", got " + std::to_string(l.tags.size()));
  size_t bytes = 0;
  for (const auto& [k, v] : l.tags) {
    if (k.empty())
      return make_error(errc::invalid_argument, "tags: a tag has an empty name");
    bytes += k.size() + v.size();
  }
  if (bytes > max_tags_bytes)
    return make_error(errc::invalid_argument, "tags: at most " + std::to_string(max_tags_bytes)
                                                + " bytes in all, got " + std::to_string(bytes));
  return {};
}

// What differs between two environments, for a resumed create that does not
// match its key's logged one.
std::string env_difference(const environment& logged, const environment& now) {
  std::string d;
  auto add = [&](const char* what, const std::string& a, const std::string& b) {
    if (a != b)
      d += std::string{d.empty() ? "" : ", "} + what + " " + (a.empty() ? "(none)" : a)
           + " in the log, " + (b.empty() ? "(none)" : b) + " now";
  };
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& x : v)
      out += (out.empty() ? "" : ",") + x;
    return out;
  };
  add("base", logged.base, now.base);
  add("workdir", logged.workdir, now.workdir);
  add("tools", join(logged.tools), join(now.tools));
  add("memory", std::to_string(logged.memory), std::to_string(now.memory));
  add("pids", std::to_string(logged.pids), std::to_string(now.pids));
  add("cpus", std::to_string(logged.cpus), std::to_string(now.cpus));
  add("disk", std::to_string(logged.disk), std::to_string(now.disk));
  add("net", logged.net ? "on" : "off", now.net ? "on" : "off");
  add("ttl_ms", std::to_string(logged.ttl_ms), std::to_string(now.ttl_ms));
  add("chronus", logged.chronus ? "on" : "off", now.chronus ? "on" : "off");
  add("backend", logged.backend, now.backend);
  return d.empty() ? "the same environment" : d;
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
                // (kept->truncated says the copy is short, not what the
                // requester got: it had every chunk.)
                res.out = std::move(kept->out);
                res.err = std::move(kept->err);
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
  // A streamed command's copy of its output, for the log.
  auto kept = req.stream ? std::make_shared<kept_output>() : nullptr;
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
      // has had it already, as it came, all of it. The log's copy is cut at
      // max_output per stream: then its result says truncated, which a
      // replay of it from the log reports.
      rec.result.truncated = r.truncated || kept->truncated;
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
  auto relay = spawn_relay(self, sb, requester, kept, req.max_output);
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

// Whether a replay box counts against the quota: a create of the resumed
// trainer claimed it, and it is not closed or being rebuilt (then it counts
// as pending, then live).
bool counted(const replay_box& rb) {
  return rb.claimed && !rb.closed && !rb.materializing;
}

void set_materializing(session_state& s, replay_box& rb, bool on) {
  bool before = counted(rb);
  rb.materializing = on;
  bool after = counted(rb);
  if (before != after)
    s.replay_claimed = after ? s.replay_claimed + 1 : s.replay_claimed - 1;
}

// The error of a request that a closed sandbox (destroyed by the trainer
// before the resume) cannot answer from its log.
error closed_error(self_ptr self, const std::string& id, const replay_box& rb,
                   const std::string& what) {
  auto& s = self->state;
  std::string key;
  if (auto l = s.labels.find(id); l != s.labels.end() && !l->second.key.empty())
    key = " (key " + l->second.key + ")";
  std::string last;
  for (auto it = rb.box.steps.rbegin(); it != rb.box.steps.rend(); ++it)
    if (it->kind == trajectory_record::executed) {
      last = "; its last command ('" + (it->req.argv.empty() ? std::string{} : it->req.argv.back())
             + "') ended with exit code " + std::to_string(it->result.exit_code);
      break;
    }
  return make_error(errc::closed,
                    "sandbox " + id + key + " was closed before session " + s.cfg.id
                      + " was resumed: its log answers the " + std::to_string(rb.box.steps.size())
                      + " steps it ran, in their order, and " + what + " is not step "
                      + std::to_string(rb.cursor + 1) + " of them" + last);
}

// Sends the watchers the Chronus events that sandbox `id` sent before its
// logged step `step` (replayed, with the trainer's logged answers).
void replay_events(self_ptr self, replay_box& rb, size_t step);

// Answers a command from the log when it is the step at the cursor of a
// replaying sandbox: first the Chronus events sent before it, then its
// result (streamed when asked). A closed sandbox refuses any other command.
// Returns whether `rp` was answered.
bool exec_from_log(self_ptr self, const std::string& id, const exec_request& req,
                   const caf::strong_actor_ptr& requester,
                   caf::typed_response_promise<exec_result>& rp) {
  auto& s = self->state;
  auto it = s.replay.find(id);
  if (it == s.replay.end() || it->second.materializing || it->second.broken)
    return false;
  auto& rb = it->second;
  if (rb.cursor < rb.box.steps.size()) {
    const auto& step = rb.box.steps[rb.cursor];
    // A detached command too: its process is started again when the
    // sandbox is rebuilt (materialize), not before it is needed.
    if (step.kind == trajectory_record::executed && same_command(step.req, req)
        && step.req.detach == req.detach && !rb.destroyed_again) {
      replay_events(self, rb, rb.cursor);
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
      return true;
    }
  }
  if (rb.closed) {
    rp.deliver(to_caf(closed_error(self, id, rb,
                                   "the command '" + (req.argv.empty() ? std::string{}
                                                                       : req.argv.back())
                                     + "'")));
    return true;
  }
  return false;
}

// The same for a put.
bool put_from_log(self_ptr self, const std::string& id, const std::string& dir,
                  const std::string& tar, caf::typed_response_promise<uint64_t>& rp) {
  auto& s = self->state;
  auto it = s.replay.find(id);
  if (it == s.replay.end() || it->second.materializing || it->second.broken)
    return false;
  auto& rb = it->second;
  if (rb.cursor < rb.box.steps.size() && !rb.destroyed_again) {
    const auto& step = rb.box.steps[rb.cursor];
    if (step.kind == trajectory_record::put && step.dir == dir
        && step.digest == put_digest(tar)) {
      replay_events(self, rb, rb.cursor);
      ++rb.cursor;
      rp.deliver(step.size);
      return true;
    }
  }
  if (rb.closed) {
    rp.deliver(to_caf(closed_error(self, id, rb, "the put into " + dir)));
    return true;
  }
  return false;
}

// Asks for `id` to be rebuilt from its last pack; `then` runs once it is live
// (or broken: then it finds the error in replay_box::broken).
void materialize(self_ptr self, const std::string& id, std::function<void()> then) {
  auto& s = self->state;
  auto& rb = s.replay.at(id);
  rb.waiting.push_back(std::move(then));
  if (rb.materializing)
    return;
  set_materializing(s, rb, true);
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
      set_materializing(s, rb, false);
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
  {
    // From here on the log's steps of this sandbox (if the trainer went
    // another way), and the Chronus events after step k-1, are void: a later
    // resume must not answer from them, nor replay events the commands run
    // from here send again.
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
              set_materializing(self->state, it->second, false);
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
    if (it->second.closed)
      return fail(closed_error(self, id, it->second, "this request (it needs a live sandbox)"));
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
    publish_event(self, chronus_event_msg{encode_lost_event(id, now_ns, msg), false, {}});
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

// ---- Chronus events in the log -----------------------------------------------------

void replay_events(self_ptr self, replay_box& rb, size_t step) {
  auto& evs = rb.box.events;
  while (rb.next_event < evs.size() && evs[rb.next_event].position <= step) {
    const auto& e = evs[rb.next_event++];
    if (e.feedback)
      self->state.replayed_requests.emplace(rb.box.id, e.seq);
    publish_event(self, chronus_event_msg{e.bytes, true, e.answer});
  }
}

// An event from a sandbox: logged (to be replayed by a resume, before the
// step that follows it), then handed to the watchers. A sandbox being
// rebuilt runs logged commands again, whose events were sent (and replayed)
// already: theirs are dropped.
void sandbox_event(self_ptr self, chronus_event_msg ev) {
  auto& s = self->state;
  if (!s.replay.empty()) {
    if (auto d = decode_event(as_bytes(ev.bytes))) {
      auto it = s.replay.find(d->sandbox_id);
      if (it != s.replay.end() && it->second.materializing)
        return;
    }
  }
  if (s.log) {
    trajectory_record rec;
    rec.kind = trajectory_record::event;
    rec.bytes = ev.bytes;
    append_only(self, rec);
  }
  publish_event(self, std::move(ev));
}

// ---- creates, keys and lists ------------------------------------------------------

// The sandboxes of the session as list() shows them: live ones (asked), then
// replaying ones, with their keys and tags.
caf::typed_response_promise<std::vector<sandbox_info>> list_sandboxes(self_ptr self) {
  auto& s = self->state;
  auto rp = self->make_response_promise<std::vector<sandbox_info>>();
  auto fill = [self](sandbox_info& info) {
    auto& s = self->state;
    if (auto l = s.labels.find(info.id); l != s.labels.end()) {
      info.key = l->second.key;
      info.tags = l->second.tags;
    }
  };
  struct gather {
    std::vector<sandbox_info> infos;
    size_t left = 0;
  };
  auto g = std::make_shared<gather>();
  for (auto& [id, rb] : s.replay) {
    if (rb.materializing || (rb.closed && (!rb.claimed || rb.destroyed_again)))
      continue;
    sandbox_info info;
    info.id = id;
    info.session = s.cfg.id;
    info.state = rb.closed ? "closed" : rb.broken ? "broken" : "replaying";
    info.env = rb.box.env;
    fill(info);
    g->infos.push_back(std::move(info));
  }
  g->left = s.sandboxes.size();
  if (g->left == 0) {
    rp.deliver(std::move(g->infos));
    return rp;
  }
  // 3 s for each: a sandbox on a hung node shows as "no answer" rather than
  // holding up the list.
  for (const auto& [id, sb] : s.sandboxes)
    self->request(sb, std::chrono::seconds(3), list_atom::value, s.cfg.key)
      .then(
        [=](sandbox_info& info) mutable {
          fill(info);
          g->infos.push_back(std::move(info));
          if (--g->left == 0)
            rp.deliver(std::move(g->infos));
        },
        [=, id = id](caf::error& e) mutable {
          // Gone meanwhile: left out; not answering: said so.
          if (e != caf::sec::request_receiver_down) {
            sandbox_info info;
            info.id = id;
            info.session = self->state.cfg.id;
            info.state = "no answer";
            fill(info);
            g->infos.push_back(std::move(info));
          }
          if (--g->left == 0)
            rp.deliver(std::move(g->infos));
        });
  return rp;
}

// The sandbox with a key (lookup_atom).
caf::result<sandbox_info> find_by_key(self_ptr self, const std::string& key) {
  auto& s = self->state;
  auto k = s.by_key.find(key);
  if (k == s.by_key.end())
    return to_caf(make_error(errc::not_found, "no sandbox with key '" + key + "' in session "
                                                + s.cfg.id));
  auto id = k->second;
  sandbox_info info;
  info.id = id;
  info.session = s.cfg.id;
  if (auto l = s.labels.find(id); l != s.labels.end()) {
    info.key = l->second.key;
    info.tags = l->second.tags;
  } else {
    info.key = key;
  }
  if (auto r = s.replay.find(id); r != s.replay.end() && !r->second.materializing) {
    info.state = r->second.closed ? "closed" : r->second.broken ? "broken" : "replaying";
    info.env = r->second.box.env;
    return info;
  }
  auto sb = s.sandboxes.find(id);
  if (sb == s.sandboxes.end()) {
    if (auto e = s.ended.find(id); e != s.ended.end())
      return to_caf(make_error(errc::closed, "key '" + key + "': " + e->second));
    if (auto l = s.lost_boxes.find(id); l != s.lost_boxes.end())
      return to_caf(make_error(errc::lost, "key '" + key + "': " + l->second));
    info.state = "creating"; // being rebuilt
    return info;
  }
  auto rp = self->make_response_promise<sandbox_info>();
  self->request(sb->second, std::chrono::seconds(10), list_atom::value, s.cfg.key)
    .then(
      [=](sandbox_info& live) mutable {
        live.key = info.key;
        live.tags = info.tags;
        rp.deliver(std::move(live));
      },
      [=](caf::error& e) mutable { rp.deliver(e); });
  return rp;
}

// Starts a batch of `count` sandboxes of which `ready` and `failed` are
// settled already (a resumed create's logged ones): the others are placed.
caf::result<uint32_t> start_batch(self_ptr self, environment env, uint32_t count,
                                  const caf::actor& listener, create_labels labels, bool labeled,
                                  uint64_t group, uint32_t ready, uint32_t failed) {
  auto& s = self->state;
  uint32_t fresh = count - ready - failed;
  uint64_t req = s.next_request++;
  auto& b = s.batches[req];
  b.count = count;
  b.ready = ready;
  b.failed = failed;
  b.next_index = ready;
  b.listener = listener;
  b.rp = self->make_response_promise<uint32_t>();
  b.group = group != 0 ? group : s.next_group++;
  b.env = env;
  b.labeled = labeled;
  b.key = labels.key.empty() ? "#" + std::to_string(b.group) : std::move(labels.key);
  b.tags = std::move(labels.tags);
  b.ttl_ms = env.ttl_ms != 0 ? env.ttl_ms : s.cfg.options.default_ttl_ms;
  ++s.key_batches[b.key];
  s.pending += fresh;
  auto rp = b.rp;
  placement pl;
  pl.request = req;
  pl.session_id = s.cfg.id;
  pl.ttl_ms = s.cfg.options.default_ttl_ms;
  pl.keep_upper = s.log.has_value();
  self
    ->request(s.cfg.scheduler, caf::infinite, place_atom::value, process_key(), std::move(env),
              fresh, session_actor{self}, std::move(pl))
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
}

// The quota's check for `more` sandboxes; an error saying so if they do not fit now.
std::optional<error> over_quota(self_ptr self, uint64_t more) {
  auto& s = self->state;
  uint64_t in_use = s.sandboxes.size() + s.pending + s.replay_claimed;
  if (in_use + more <= s.cfg.options.quota)
    return std::nullopt;
  return make_error(errc::overloaded,
                    "session " + s.cfg.id + " quota: " + std::to_string(in_use)
                      + " sandboxes live or coming, " + std::to_string(more)
                      + " more asked for, at most " + std::to_string(s.cfg.options.quota)
                      + " (retry once some are destroyed)");
}

// A resumed trainer's create whose key names create call `gi` of the log: it
// gets that call's sandboxes (told at once, by their old ids and keys, each
// replaying or closed), the failures the log has, and fresh sandboxes for
// the ones the log never got to.
caf::result<uint32_t> claim_logged(self_ptr self, size_t gi, environment env, uint32_t count,
                                   const caf::actor& listener, create_labels labels) {
  auto& s = self->state;
  auto g = s.groups[gi];
  auto settled = static_cast<uint32_t>(std::min<size_t>(g.ids.size() + g.failures.size(), count));
  uint32_t fresh = count - settled;
  if (auto e = over_quota(self, fresh))
    return to_caf(*e);
  auto& members = s.key_members[g.key];
  for (const auto& id : g.ids) {
    if (auto r = s.replay.find(id); r != s.replay.end()) {
      auto& rb = r->second;
      bool before = counted(rb);
      rb.claimed = true;
      if (counted(rb) && !before)
        ++s.replay_claimed;
      if (!rb.closed)
        members.insert(id);
    } else if (s.sandboxes.count(id)) {
      members.insert(id); // rebuilt already (asked by its id)
    }
  }
  if (members.empty())
    s.key_members.erase(g.key);
  if (listener && !g.ids.empty())
    caf::anon_send(listener, ready_atom::value, ready_ids{g.ids, g.keys});
  for (const auto& f : g.failures)
    if (listener) {
      auto e = f;
      e.message = "failed before session " + s.cfg.id + " was resumed (its log says so): "
                  + e.message;
      caf::anon_send(listener, failed_atom::value, to_caf(e));
    }
  if (fresh == 0)
    return static_cast<uint32_t>(g.ids.size());
  labels.key = g.key;
  return start_batch(self, std::move(env), count, listener, std::move(labels), true, g.number,
                     static_cast<uint32_t>(g.ids.size()),
                     settled - static_cast<uint32_t>(g.ids.size()));
}

// A create call (create_atom). Its key, in a resumed session, gets the
// sandboxes the log made for it; anything else gets fresh sandboxes (never
// another key's).
caf::result<uint32_t> create_call(self_ptr self, environment env, uint32_t count,
                                  const caf::actor& listener, create_labels labels,
                                  bool labeled) {
  auto& s = self->state;
  if (s.closing)
    return to_caf(make_error(errc::closed, "session " + s.cfg.id + " is closing"));
  if (count == 0)
    return uint32_t{0};
  if (env.base.empty())
    return to_caf(make_error(errc::invalid_argument, "an environment needs a base layer"));
  if (env.backend == "function")
    return to_caf(make_error(errc::invalid_argument,
                             "backend 'function' makes one sandbox per call: use call"
                             " (session::call, `dsec call`), not create"));
  if (env.backend != "container")
    return to_caf(make_error(errc::unsupported, "backend '" + env.backend
                                                  + "' is not available (container, or"
                                                    " function through call)"));
  if (count > s.cfg.options.quota)
    return to_caf(make_error(errc::invalid_argument,
                             "session " + s.cfg.id + ": a create of " + std::to_string(count)
                               + " sandboxes can never fit its quota of "
                               + std::to_string(s.cfg.options.quota)
                               + " (ask for fewer, or open the session with a larger quota)"));
  if (auto ok = check_labels(self, labels); !ok)
    return to_caf(ok.error_value());
  if (!labels.key.empty()) {
    const auto& key = labels.key;
    if (auto m = s.key_members.find(key); m != s.key_members.end())
      return to_caf(make_error(errc::already_exists,
                               "create key '" + key + "' is in use in session " + s.cfg.id
                                 + " by sandbox " + *m->second.begin()
                                 + " (destroy it first, or give another key)"));
    if (s.key_batches.count(key))
      return to_caf(make_error(errc::already_exists,
                               "create key '" + key + "' is in use in session " + s.cfg.id
                                 + " by a create still in flight (give another key)"));
    if (auto lk = s.logged_keys.find(key); lk != s.logged_keys.end() && !lk->second.empty()) {
      size_t gi = lk->second.front();
      const auto& g = s.groups[gi];
      if (!same_environment(g.env, env) || g.count != count)
        return to_caf(make_error(
          errc::invalid_argument,
          "create key '" + key + "' of session " + s.cfg.id + " was a create of "
            + std::to_string(g.count) + " before the resume, this one asks for "
            + std::to_string(count) + " (" + env_difference(g.env, env)
            + "): give it the same environment and count to resume it, or another key"));
      lk->second.pop_front();
      if (lk->second.empty())
        s.logged_keys.erase(lk);
      return claim_logged(self, gi, std::move(env), count, listener, std::move(labels));
    }
  }
  if (auto e = over_quota(self, count))
    return to_caf(*e);
  return start_batch(self, std::move(env), count, listener, std::move(labels), labeled, 0, 0,
                     0);
}

// A resumed session's start: every sandbox of its log is replaying (or
// closed, if the trainer destroyed it), claimed by the creates with its key.
// N of a pack named "<sandbox>-<N>.pack", or 0.
uint64_t pack_number(const std::string& pack, const std::string& sandbox) {
  const std::string suffix = ".pack";
  if (pack.size() <= sandbox.size() + 1 + suffix.size() || pack.compare(0, sandbox.size(), sandbox)
      || pack[sandbox.size()] != '-' || pack.compare(pack.size() - suffix.size(), suffix.size(), suffix))
    return 0;
  uint64_t n = 0;
  for (size_t i = sandbox.size() + 1; i < pack.size() - suffix.size(); ++i) {
    if (pack[i] < '0' || pack[i] > '9' || n > (UINT64_MAX - 9) / 10)
      return 0;
    n = n * 10 + static_cast<uint64_t>(pack[i] - '0');
  }
  return n;
}

void arrange_resume(self_ptr self, const trajectory_plan& plan) {
  auto& st = self->state;
  st.next_group = plan.next_group;
  st.groups = plan.groups;
  for (const auto& b : plan.boxes) {
    replay_box rb;
    rb.box = b;
    rb.closed = b.destroyed;
    st.labels[b.id] = box_labels{b.key, b.group_key, b.tags,
                                 b.env.ttl_ms ? b.env.ttl_ms : st.cfg.options.default_ttl_ms};
    if (!b.key.empty())
      st.by_key[b.key] = b.id;
    // Packs are named <sandbox>-<N>.pack, N counting up over the whole run: the
    // resumed session goes on after the highest N its log names, so that it
    // never overwrites a pack the log still points to.
    for (const auto& step : b.steps)
      if (auto n = pack_number(step.pack, b.id); n >= st.next_pack)
        st.next_pack = n + 1;
    st.replay.emplace(b.id, std::move(rb));
  }
  for (size_t i = 0; i < st.groups.size(); ++i)
    st.logged_keys[st.groups[i].key].push_back(i);
}

// Warm pools and the function backend (at the end of this file).
caf::result<uint32_t> set_pool(self_ptr self, environment env, uint32_t size);
caf::result<exec_result> function_call(self_ptr self, environment env, exec_request req);

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
  if (st.cfg.resume)
    arrange_resume(self, *st.cfg.resume);
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
      return create_call(self, std::move(env), count, listener, {}, false);
    },
    [=](create_atom, environment& env, uint32_t count, const caf::actor& listener,
        create_labels& labels) -> caf::result<uint32_t> {
      return create_call(self, std::move(env), count, listener, std::move(labels), true);
    },
    [=](lookup_atom, const std::string& key) -> caf::result<sandbox_info> {
      return find_by_key(self, key);
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
      if (exec_from_log(self, id, req, requester, rp))
        return {};
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
      if (put_from_log(self, id, dir, tar, rp))
        return {};
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
        if (it->second.closed) {
          // Destroyed before the resume, destroyed again: as it was.
          it->second.destroyed_again = true;
          rp.deliver(true);
          return {};
        }
        // Never rebuilt: nothing to tear down.
        if (counted(it->second))
          --s.replay_claimed;
        s.replay.erase(it);
        s.destroying.insert(id);
        note_end(self, id);
        commit(self, rec, [rp]() mutable { rp.deliver(true); });
        return {};
      }
      with_sandbox(
        self, id,
        [=](sandbox_actor sb) mutable {
          self->state.destroying.insert(id);
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
    [=](lifetime_atom, const std::string& id, uint64_t ms) -> caf::delegated<uint64_t> {
      constexpr uint64_t min_ms = 1000, max_ms = 30ull * 24 * 3600 * 1000;
      auto rp = self->make_response_promise<uint64_t>();
      if (ms < min_ms || ms > max_ms) {
        rp.deliver(to_caf(make_error(errc::invalid_argument,
                                     "set_ttl " + id + ": a TTL of " + std::to_string(ms)
                                       + " ms is out of range (1 s to 30 days)")));
        return {};
      }
      // A sandbox of the log not rebuilt yet has no timer to set: it is
      // rebuilt first, like for any other call on it.
      with_sandbox(
        self, id,
        [=](sandbox_actor sb) mutable {
          if (auto l = self->state.labels.find(id); l != self->state.labels.end())
            l->second.ttl_ms = ms; // said when it runs out
          forward_to<uint64_t>(self, sb, rp, lifetime_atom::value, ms);
        },
        [=](const error& e) mutable { rp.deliver(to_caf(e)); });
      return {};
    },
    [=](list_atom) -> caf::result<std::vector<sandbox_info>> { return list_sandboxes(self); },
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
        sandbox_event(self, std::move(ev));
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
      auto& s = self->state;
      auto rp = self->make_response_promise<bool>();
      if (!s.replayed_requests.empty())
        if (auto f = decode_feedback(as_bytes(fb.bytes));
            f && s.replayed_requests.erase({id, f->request_id}) > 0) {
          // An answer to a request replayed from the log: its command has
          // run, and may be over (its sandbox destroyed) by now.
          rp.deliver(true);
          return {};
        }
      if (s.replay.count(id) && !s.sandboxes.count(id)) {
        // A replayed request (or one of a sandbox that is not live): the
        // command that asked has run; the answer changes nothing.
        rp.deliver(true);
        return {};
      }
      if (s.log) {
        trajectory_record rec;
        rec.kind = trajectory_record::answered;
        rec.sandbox = id;
        rec.bytes = fb.bytes;
        append_only(self, rec);
      }
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
        auto key = label_sandbox(self, it->second, id);
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
            if (b.labeled)
              b.unannounced_keys.push_back(key);
            if (b.ready + b.failed < b.count && !s.announce_scheduled) {
              s.announce_scheduled = true;
              self->send(self, flush_atom::value, process_key()); // behind what is in the mailbox
            }
          } else if (b.listener && b.labeled) {
            caf::anon_send(b.listener, ready_atom::value, ready_ids{{id}, {key}});
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
          rec.key = key;
          rec.group_key = it->second.key;
          rec.tags = it->second.tags;
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
            set_materializing(s, r->second, false);
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
            rec.group_key = it->second.key;
            auto err = from_caf(e);
            rec.fail_code = static_cast<uint8_t>(err.code);
            rec.fail_message = err.message;
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
      note_end(self, id);
      maybe_end(self);
    },
    [=](ttl_atom, const internal_key& k, const std::string& id) {
      if (!genuine(k, self->state.cfg.key, "ttl (session)"))
        return;
      if (self->state.sandboxes.count(id))
        self->state.expired.insert(id);
    },
    [=](pool_atom, environment& env, uint32_t size) -> caf::result<uint32_t> {
      return set_pool(self, std::move(env), size);
    },
    [=](call_atom, environment& env, exec_request& req) -> caf::result<exec_result> {
      return function_call(self, std::move(env), std::move(req));
    },
  };
}

// ---- warm pools and the function backend (actors/warm_pool.hpp) -----------------

// A warm pool of this session's (session::pool): the scheduler spreads it over
// the nodes; the nodes drop it when the session ends.
caf::result<uint32_t> set_pool(self_ptr self, environment env, uint32_t size) {
  auto& s = self->state;
  if (s.closing)
    return to_caf(make_error(errc::closed, "session " + s.cfg.id + " is closing"));
  if (env.base.empty())
    return to_caf(make_error(errc::invalid_argument, "a pool's environment needs a base layer"));
  if (env.backend != "container" && env.backend != "function")
    return to_caf(make_error(errc::unsupported, "backend '" + env.backend
                                                  + "' is not available (container, function)"));
  if (size > s.cfg.options.quota)
    return to_caf(make_error(errc::invalid_argument,
                             "session " + s.cfg.id + ": a pool of " + std::to_string(size)
                               + " is larger than its quota of "
                               + std::to_string(s.cfg.options.quota)));
  if (s.log)
    return to_caf(make_error(errc::unsupported,
                             "session " + s.cfg.id + " keeps a trajectory log: its sandboxes are"
                               " made for packs, which pooled ones are not"));
  auto rp = self->make_response_promise<uint32_t>();
  self
    ->request(s.cfg.scheduler, caf::infinite, pool_atom::value, process_key(), std::move(env),
              size, session_actor{self}, s.cfg.id)
    .then(
      [=](const internal_key& k, uint32_t n) mutable {
        if (genuine(k, self->state.cfg.key, "a reply to pool"))
          rp.deliver(n);
        else
          rp.deliver(refuse("a reply to pool"));
      },
      [=](caf::error& e) mutable { rp.deliver(e); });
  return rp;
}

// The function backend (session::call): a sandbox of `env` from the session's
// create (a warm pool's when one has a ready one), the command, the
// sandbox destroyed; the reply is the command's result once it is gone. A
// helper actor does it through the session's own verbs (quota, lost nodes,
// closing all apply), and answers the caller.
caf::result<exec_result> function_call(self_ptr self, environment env, exec_request req) {
  auto& s = self->state;
  if (s.closing)
    return to_caf(make_error(errc::closed, "session " + s.cfg.id + " is closing"));
  if (env.base.empty())
    return to_caf(make_error(errc::invalid_argument, "an environment needs a base layer"));
  if (env.backend != "function" && env.backend != "container")
    return to_caf(make_error(errc::unsupported, "backend '" + env.backend
                                                  + "' is not available for a call (function)"));
  if (req.argv.empty() || req.argv[0].empty())
    return to_caf(make_error(errc::invalid_argument, "call: no command given"));
  if (req.detach || req.stream)
    return to_caf(make_error(errc::invalid_argument,
                             "call: a function call collects its output (no detach, no stream)"));
  env.backend = "container"; // what the node makes for it
  session_actor me = self;
  auto helper = self->spawn([me](caf::event_based_actor* h) -> caf::behavior {
    struct job {
      caf::response_promise rp;
      exec_request req;
      bool done = false;
    };
    auto j = std::make_shared<job>();
    auto finish = [=](caf::message m) {
      if (j->done)
        return;
      j->done = true;
      j->rp.deliver(std::move(m));
      h->quit();
    };
    return {
      [=](call_atom, environment& env, exec_request& req) {
        j->rp = h->make_response_promise();
        j->req = std::move(req);
        h->request(me, caf::infinite, create_atom::value, std::move(env), uint32_t{1},
                   caf::actor_cast<caf::actor>(h))
          .then([](uint32_t) {}, [=](caf::error& e) { finish(caf::make_message(e)); });
      },
      [=](ready_atom, const std::string& id) {
        auto destroy_then = [=](caf::message m) {
          h->request(me, caf::infinite, destroy_atom::value, id)
            .then([=](bool) { finish(m); }, [=](caf::error&) { finish(m); });
        };
        h->request(me, caf::infinite, exec_atom::value, id, j->req)
          .then([=](exec_result& r) { destroy_then(caf::make_message(std::move(r))); },
                [=](caf::error& e) { destroy_then(caf::make_message(e)); });
      },
      [=](failed_atom, const caf::error& e) { finish(caf::make_message(e)); },
    };
  });
  auto rp = self->make_response_promise<exec_result>();
  rp.delegate(helper, call_atom::value, std::move(env), std::move(req));
  return rp;
}

} // namespace

session_actor spawn_session(caf::actor_system& sys, session_config cfg) {
  return sys.spawn(session_impl, std::move(cfg));
}

} // namespace dsec

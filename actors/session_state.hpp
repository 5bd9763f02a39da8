// session_state: the private parts of the session actor (actors/session.hpp),
// shared by the files that assemble its behaviour. The session is one actor; its
// handlers (session.cpp) call into three parts:
//   session.cpp         the core: the behaviour, creates (checks, quota, batches,
//                       keys and tags), lists, closing, forwarding to sandboxes,
//                       the Chronus watchers, lost nodes
//   session_log.cpp     the trajectory log: appending and syncing records, logged
//                       commands and puts (with their packs), logged Chronus events
//   session_replay.cpp  resume and replay: answering from the log, rebuilding a
//                       sandbox from its last pack, a resumed trainer's creates
// Include it only from actors/session*.cpp.
#pragma once

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "actors/ready_ids.hpp"
#include "actors/sandbox.hpp"
#include "actors/session.hpp"
#include "actors/trajectory.hpp"
#include "actors/types.hpp"
#include "runtime/chronus.hpp"
#include "runtime/trajectory.hpp"

namespace dsec::session_detail {

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
  size_t next_policy = 0;      ///< box.policies answered (or passed) so far
  bool policy_set = false;     ///< one was answered: box.env has it, for a rebuild
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
  /// When it started (a recovered one: when the restarted coordinator
  /// rebuilt it; its nodes hand their sandboxes over from then on).
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
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
  // ---- warm pools (session::pool) ----
  // pool_key(env) -> its size as set: the pools' sandboxes hold slots for the
  // session, so they count against its quota (`pooled`, their sum).
  std::unordered_map<std::string, uint32_t> pools;
  uint64_t pooled = 0;
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

using self_ptr = session_actor::stateful_pointer<session_state>;

// ---- session.cpp ----------------------------------------------------------------

expected<sandbox_actor> find(self_ptr self, const std::string& id);
void publish_event(self_ptr self, chronus_event_msg ev);
std::optional<error> over_quota(self_ptr self, uint64_t more);
caf::result<uint32_t> start_batch(self_ptr self, environment env, uint32_t count,
                                  const caf::actor& listener, create_labels labels, bool labeled,
                                  uint64_t group, uint32_t ready, uint32_t failed,
                                  std::string near = {});

/// What a relay for a streamed command keeps of its output (see spawn_relay).
struct kept_output {
  std::string out, err;
  bool truncated = false;
};
caf::actor spawn_relay(self_ptr self, sandbox_actor sb, caf::strong_actor_ptr requester,
                       std::shared_ptr<kept_output> kept, uint64_t limit);

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

// ---- session_log.cpp ------------------------------------------------------------

void commit(self_ptr self, const trajectory_record& rec, std::function<void()> then = {});
void append_only(self_ptr self, const trajectory_record& rec);
void flush(self_ptr self);
expected<void> open_log(self_ptr self);
void logged_exec(self_ptr self, const std::string& id, sandbox_actor sb, exec_request req,
                 caf::strong_actor_ptr requester, caf::typed_response_promise<exec_result> rp);
void logged_put(self_ptr self, const std::string& id, sandbox_actor sb, std::string dir,
                std::string tar, caf::typed_response_promise<uint64_t> rp);
void sandbox_event(self_ptr self, chronus_event_msg ev);
void logged_network(self_ptr self, const std::string& id, sandbox_actor sb,
                    std::vector<std::string> allow, std::vector<std::string> deny,
                    caf::typed_response_promise<bool> rp);

// ---- session_replay.cpp ---------------------------------------------------------

bool counted(const replay_box& rb);
void set_materializing(session_state& s, replay_box& rb, bool on);
error closed_error(self_ptr self, const std::string& id, const replay_box& rb,
                   const std::string& what);
bool exec_from_log(self_ptr self, const std::string& id, const exec_request& req,
                   const caf::strong_actor_ptr& requester,
                   caf::typed_response_promise<exec_result>& rp);
bool put_from_log(self_ptr self, const std::string& id, const std::string& dir,
                  const std::string& tar, caf::typed_response_promise<uint64_t>& rp);
bool policy_from_log(self_ptr self, const std::string& id, const std::vector<std::string>& allow,
                     const std::vector<std::string>& deny, caf::typed_response_promise<bool>& rp);
void materialize(self_ptr self, const std::string& id, std::function<void()> then);
void replay_tail(self_ptr self, const std::string& id, sandbox_actor sb, size_t next);
caf::result<uint32_t> claim_logged(self_ptr self, size_t gi, environment env, uint32_t count,
                                   const caf::actor& listener, create_labels labels);
void arrange_resume(self_ptr self, const trajectory_plan& plan);

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

} // namespace dsec::session_detail

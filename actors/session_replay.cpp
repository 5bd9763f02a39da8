// The session actor's resume and replay (see actors/session_state.hpp; the session
// is one actor, assembled from session.cpp, session_log.cpp and this file): a
// resumed session's sandboxes answer from their logged steps while the trainer
// repeats them, are rebuilt from their last pack when it goes another way, and
// a resumed trainer's creates claim the sandboxes the log made for their keys.
#include <algorithm>
#include <cstdint>

#include "actors/session_state.hpp"

namespace dsec::session_detail {

namespace {

// Sends the watchers the Chronus events that sandbox `id` sent before its
// logged step `step` (replayed, with the trainer's logged answers).
void replay_events(self_ptr self, replay_box& rb, size_t step) {
  auto& evs = rb.box.events;
  while (rb.next_event < evs.size() && evs[rb.next_event].position <= step) {
    const auto& e = evs[rb.next_event++];
    if (e.feedback)
      self->state.replayed_requests.emplace(rb.box.id, e.seq);
    publish_event(self, chronus_event_msg{e.bytes, true, e.answer});
  }
}

} // namespace

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
  // A command whose stdin the trainer feeds after it started (a handle's,
  // open_stdin) cannot be known to be the logged one when it starts: the log
  // does not answer it. It runs, on the sandbox rebuilt as it was before it.
  bool fed_later = req.open_stdin && req.transfer == transfer_none;
  if (rb.cursor < rb.box.steps.size() && !fed_later) {
    const auto& step = rb.box.steps[rb.cursor];
    // A detached command too: its process is started again when the
    // sandbox is rebuilt (materialize), not before it is needed.
    if (step.kind == trajectory_record::executed && same_command(step.req, req)
        && step.req.detach == req.detach && !rb.destroyed_again) {
      replay_events(self, rb, rb.cursor);
      ++rb.cursor;
      auto r = step.result;
      if (req.handle && req.transfer == transfer_none) {
        // A handle's command says its id first: 0, as it does not run. (A
        // streamed put's handle, told nothing, learns the logged end.)
        if (auto to = caf::actor_cast<caf::actor>(requester))
          caf::anon_send(to, output_chunk{id, 0, 0, {}});
      }
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

// The same for a policy change (set_network): answered when it is the one the
// log has after the steps answered so far, with the same rules; the sandbox
// stays replaying, and a rebuild later makes it with that policy. Changes the
// trainer did not make again before the steps after them are passed over.
bool policy_from_log(self_ptr self, const std::string& id, const std::vector<std::string>& allow,
                     const std::vector<std::string>& deny, caf::typed_response_promise<bool>& rp) {
  auto& s = self->state;
  auto it = s.replay.find(id);
  if (it == s.replay.end() || it->second.materializing || it->second.broken
      || it->second.closed || it->second.destroyed_again)
    return false;
  auto& rb = it->second;
  auto& ps = rb.box.policies;
  while (rb.next_policy < ps.size() && ps[rb.next_policy].position < rb.cursor)
    ++rb.next_policy;
  if (rb.next_policy == ps.size() || ps[rb.next_policy].position != rb.cursor
      || ps[rb.next_policy].allow != allow || ps[rb.next_policy].deny != deny)
    return false;
  ++rb.next_policy;
  rb.box.env.allow = allow;
  rb.box.env.deny = deny;
  rb.policy_set = true;
  rp.deliver(true);
  return true;
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
    // The policy it is rebuilt with, when the resumed trainer set one again
    // (the truncation voided the log's after step k-1).
    if (rb.policy_set) {
      trajectory_record pol;
      pol.kind = trajectory_record::network;
      pol.sandbox = id;
      pol.env.allow = rb.box.env.allow;
      pol.env.deny = rb.box.env.deny;
      commit(self, pol);
    }
  }
  uint64_t req = s.next_request++;
  auto& b = s.batches[req];
  b.count = 1;
  b.rebuild = id;
  ++s.pending;
  placement pl;
  pl.request = req;
  pl.session_id = s.cfg.id;
  pl.session = s.cfg.options;
  pl.owned = s.cfg.trainer || s.cfg.owned;
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
    // Collected: a handle's command too (its stdin was closed at the start:
    // one fed later is never answered from the log, so never run again).
    req.stream = req.handle = false;
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

} // namespace dsec::session_detail

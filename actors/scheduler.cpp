#include "actors/scheduler.hpp"

#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <sys/random.h>
#include <sys/stat.h>

#include <cstdio>

#include <unordered_map>

#include "actors/session.hpp"
#include "actors/trajectory.hpp"
#include "actors/types.hpp"

namespace dsec {

namespace {

struct scheduler_state {
  static inline const char* name = "dsec.scheduler";

  scheduler_config cfg;
  std::unordered_map<std::string, session_actor> sessions;
  /// Sandboxes of resumed sessions, by id: served through their session,
  /// which answers from the log or rebuilds them.
  std::unordered_map<std::string, std::string> resumed;
  bool shutting_down = false;
};

using self_ptr = scheduler_actor::stateful_pointer<scheduler_state>;

std::string new_session_id() {
  unsigned char b[4] = {};
  (void) ::getrandom(b, sizeof b, 0);
  static const char hex[] = "0123456789abcdef";
  std::string s = "s-";
  for (auto x : b) {
    s += hex[x >> 4];
    s += hex[x & 15];
  }
  return s;
}

// Finds a sandbox and hands the request to it: through its session if that
// was resumed (it may not have been rebuilt yet), else on the node.
template <class Result, class Atom, class... Ts>
caf::result<Result> by_id(self_ptr self, const std::string& id, Atom atom, Ts... xs) {
  auto rp = self->template make_response_promise<Result>();
  auto& s = self->state;
  if (auto r = s.resumed.find(id); r != s.resumed.end()) {
    if (auto sess = s.sessions.find(r->second); sess != s.sessions.end()) {
      rp.delegate(sess->second, atom, id, xs...);
      return rp;
    }
  }
  self->request(s.cfg.node, std::chrono::seconds(30), lookup_atom::value, id)
    .then(
      [=](sandbox_actor& sb) mutable {
        // Through its session: one with a trajectory log records what its
        // sandboxes do (a session without one hands the request straight on).
        self->request(sb, std::chrono::seconds(30), list_atom::value)
          .then(
            [=](sandbox_info& info) mutable {
              auto& s = self->state;
              if (auto sess = s.sessions.find(info.session); sess != s.sessions.end())
                rp.delegate(sess->second, atom, id, xs...);
              else
                rp.delegate(sb, atom, xs...);
            },
            [=](caf::error&) mutable { rp.delegate(sb, atom, xs...); });
      },
      [=](caf::error& e) mutable { rp.deliver(e); });
  return rp;
}

scheduler_actor::behavior_type scheduler_impl(self_ptr self, scheduler_config cfg) {
  self->state.cfg = std::move(cfg);
  {
    // The daemon's own session, for sandboxes the command line detaches
    // (`dsec run --detach` without --session): nobody owns it, so they live
    // until removed or until their TTL.
    session_config sc;
    sc.id = "default";
    sc.options.quota = 1u << 20;
    sc.options.name = "default";
    sc.scheduler = self;
    // Not emplace(sc.id, spawn_session(.., std::move(sc))): the key would be
    // read from the moved-from sc.id, i.e. empty.
    auto id = sc.id;
    self->state.sessions.emplace(std::move(id), spawn_session(self->system(), std::move(sc)));
  }
  if (self->state.cfg.trajectory_keep.count() > 0 && !self->state.cfg.trajectories.empty())
    self->send(self, ttl_atom::value);
  return {
    [=](ttl_atom) {
      auto& s = self->state;
      for (const auto& what : expire_trajectories(s.cfg.trajectories, s.cfg.trajectory_keep,
                                                  [&](const std::string& id) {
                                                    return s.sessions.count(id) > 0;
                                                  }))
        std::printf("dsecd: removed %s\n", what.c_str());
      std::fflush(stdout);
      self->delayed_send(self, std::chrono::hours(1), ttl_atom::value);
    },
    [=](open_atom, session_options& opts,
        const caf::actor& trainer) -> caf::result<session_actor, std::string> {
      auto& s = self->state;
      if (s.shutting_down)
        return to_caf(make_error(errc::overloaded, "the daemon is shutting down"));
      if (opts.quota == 0)
        return to_caf(make_error(errc::invalid_argument, "a session's quota must be at least 1"));
      auto id = new_session_id();
      // Not the id of a session that may still be resumed either.
      auto taken = [&](const std::string& x) {
        struct stat st {};
        return s.sessions.count(x) > 0
               || (!s.cfg.trajectories.empty()
                   && ::stat(trajectory_dir(s.cfg.trajectories, x).c_str(), &st) == 0);
      };
      while (taken(id))
        id = new_session_id();
      if (opts.trajectory && s.cfg.trajectories.empty())
        return to_caf(make_error(errc::unsupported,
                                 "this daemon keeps no trajectory logs (no state dir)"));
      session_config sc;
      sc.id = id;
      sc.options = std::move(opts);
      sc.trainer = trainer;
      sc.scheduler = self;
      sc.trajectories = s.cfg.trajectories;
      auto sess = spawn_session(self->system(), std::move(sc));
      s.sessions.emplace(id, sess);
      return {sess, id};
    },
    [=](resume_atom, const std::string& id,
        const caf::actor& trainer) -> caf::result<session_actor, std::string> {
      auto& s = self->state;
      if (s.shutting_down)
        return to_caf(make_error(errc::overloaded, "the daemon is shutting down"));
      if (id.empty() || id.find('/') != std::string::npos || id == "." || id == "..")
        return to_caf(make_error(errc::invalid_argument, "'" + id + "' is not a session id"));
      if (s.sessions.count(id))
        return to_caf(make_error(errc::in_use, "session " + id
                                                 + " is live: use it, or close it, rather"
                                                   " than resume it"));
      if (s.cfg.trajectories.empty())
        return to_caf(make_error(errc::unsupported,
                                 "this daemon keeps no trajectory logs (no state dir)"));
      auto plan = load_trajectory(s.cfg.trajectories, id);
      if (!plan)
        return to_caf(plan.error_value());
      session_config sc;
      sc.id = id;
      sc.options = plan->options;
      sc.trainer = trainer;
      sc.scheduler = self;
      sc.trajectories = s.cfg.trajectories;
      for (const auto& b : plan->boxes)
        if (!b.destroyed)
          s.resumed[b.id] = id;
      sc.resume = std::make_shared<const trajectory_plan>(std::move(*plan));
      auto sess = spawn_session(self->system(), std::move(sc));
      s.sessions.emplace(id, sess);
      return {sess, id};
    },
    [=](lookup_atom, const std::string& id) -> caf::result<session_actor> {
      auto& s = self->state;
      auto it = s.sessions.find(id);
      if (it == s.sessions.end())
        return to_caf(make_error(errc::not_found, "no session " + id));
      return it->second;
    },
    [=](place_atom, environment& env, uint32_t count, session_actor& session,
        placement& pl) -> caf::delegated<uint32_t> {
      // One node: it gets everything (the node refuses what it has no slot for).
      return self->delegate(self->state.cfg.node, spawn_atom::value, std::move(env), count,
                            std::move(session), std::move(pl));
    },
    [=](exec_atom, const std::string& id, const exec_request& req) {
      return by_id<exec_result>(self, id, exec_atom::value, req);
    },
    [=](put_atom, const std::string& id, const std::string& dir, const std::string& tar) {
      return by_id<uint64_t>(self, id, put_atom::value, dir, tar);
    },
    [=](get_atom, const std::string& id, const std::string& path) {
      return by_id<std::string>(self, id, get_atom::value, path);
    },
    [=](feedback_atom, const std::string& id, const chronus_feedback_msg& fb) {
      return by_id<bool>(self, id, feedback_atom::value, fb);
    },
    [=](destroy_atom, const std::string& id) {
      return by_id<bool>(self, id, destroy_atom::value);
    },
    [=](list_atom) -> caf::delegated<std::vector<sandbox_info>> {
      return self->delegate(self->state.cfg.node, list_atom::value);
    },
    [=](stats_atom) -> caf::result<node_stats> {
      auto rp = self->make_response_promise<node_stats>();
      auto sessions = static_cast<uint32_t>(self->state.sessions.size());
      self->request(self->state.cfg.node, std::chrono::seconds(10), stats_atom::value)
        .then(
          [=](node_stats& ns) mutable {
            ns.sessions = sessions;
            rp.deliver(std::move(ns));
          },
          [=](caf::error& e) mutable { rp.deliver(e); });
      return rp;
    },
    [=](gone_atom, const std::string& session_id) {
      auto& s = self->state;
      s.sessions.erase(session_id);
      std::erase_if(s.resumed, [&](const auto& kv) { return kv.second == session_id; });
    },
    [=](shutdown_atom) -> caf::delegated<uint32_t> {
      auto& s = self->state;
      s.shutting_down = true;
      // Closed, but their trajectory logs stay: a restarted daemon resumes them.
      for (auto& [id, sess] : s.sessions)
        caf::anon_send(sess, shutdown_atom::value);
      return self->delegate(s.cfg.node, shutdown_atom::value);
    },
  };
}

} // namespace

scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_config cfg) {
  return sys.spawn(scheduler_impl, std::move(cfg));
}

} // namespace dsec

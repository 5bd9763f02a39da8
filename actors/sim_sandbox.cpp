#include "actors/sim_sandbox.hpp"

#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <utility>
#include <vector>

#include "actors/sandbox.hpp"
#include "actors/types.hpp"
#include "runtime/clock.hpp"

namespace dsec {

namespace {

using clock_type = std::chrono::steady_clock;

enum class phase : uint8_t { creating, ready, destroying };

// Kept small: one of these per live simulated sandbox.
struct sim_state {
  static inline const char* name = "dsec.sim_sandbox";

  std::shared_ptr<const sim_common> c;
  std::string id;
  uint64_t request = 0;
  uint64_t created_ms = 0;
  uint64_t ttl_end_ms = 0;  // when its TTL runs out (unix ms), 0: never
  uint64_t ttl_setting = 0; // the TTL timer that counts (lifetime_atom makes a new one)
  phase ph = phase::creating;
  uint32_t running = 0; // commands waiting for their modelled latency
  uint64_t next_exec = 1;
  // Commands in flight (only with a modelled exec latency) and destroy calls.
  std::vector<std::pair<uint64_t, caf::typed_response_promise<exec_result>>> execs;
  std::vector<caf::typed_response_promise<bool>> destroy_waiters;
};

using self_ptr = sandbox_actor::stateful_pointer<sim_state>;

const char* phase_name(const sim_state& s) {
  switch (s.ph) {
    case phase::creating: return "creating";
    case phase::ready: return s.running == 0 ? "ready" : "running";
    case phase::destroying: return "destroying";
  }
  return "unknown";
}

void become_ready(self_ptr self) {
  auto& s = self->state;
  if (s.ph != phase::creating)
    return;
  s.ph = phase::ready;
  s.created_ms = unix_ms();
  self->send(s.c->session, ready_atom::value, s.c->key, s.id, sandbox_actor{self}, s.request);
  self->send(s.c->node, ready_atom::value, process_key(), s.id);
  if (s.c->env.ttl_ms > 0) {
    s.ttl_end_ms = s.created_ms + s.c->env.ttl_ms;
    self->delayed_send(self, std::chrono::milliseconds(s.c->env.ttl_ms), ttl_atom::value,
                       process_key(), s.ttl_setting);
  }
}

void finish_destroy(self_ptr self) {
  auto& s = self->state;
  for (auto& [eid, rp] : s.execs)
    rp.deliver(to_caf(make_error(errc::sandbox_failed, "sandbox " + s.id + " was destroyed")));
  s.execs.clear();
  tell_end(self, s.c->key, s.c->session, s.c->node, s.id, s.request, s.created_ms != 0, false);
  for (auto& rp : s.destroy_waiters)
    rp.deliver(true);
  s.destroy_waiters.clear();
  self->quit();
}

void begin_destroy(self_ptr self) {
  auto& s = self->state;
  if (s.ph == phase::destroying)
    return;
  s.ph = phase::destroying;
  if (s.c->model.destroy.count() == 0)
    return finish_destroy(self);
  self->delayed_send(self, s.c->model.destroy, reaped_atom::value, process_key());
}

caf::error not_ready(const sim_state& s) {
  return to_caf(make_error(s.ph == phase::creating ? errc::invalid_argument : errc::not_found,
                           "sandbox " + s.id
                             + (s.ph == phase::creating ? " is not ready yet"
                                                        : " is being destroyed")));
}

caf::error no_files(const sim_state& s, const char* what) {
  return to_caf(make_error(errc::unsupported,
                           std::string{what} + ": sandbox " + s.id
                             + " is simulated (dsecd --backend sim): it has no files"));
}

sandbox_actor::behavior_type sim_impl(self_ptr self, std::shared_ptr<const sim_common> c,
                                      std::string id, uint64_t request) {
  auto& st = self->state;
  st.c = std::move(c);
  st.id = std::move(id);
  st.request = request;
  // The session ending ends its sandboxes.
  self->monitor(st.c->session);
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source == self->state.c->session.address()
        && really_down(self->state.c->session, "a down message of a sandbox's session"))
      begin_destroy(self);
  });
  if (st.c->model.create.count() == 0)
    become_ready(self);
  else
    self->delayed_send(self, st.c->model.create, event_atom::value, process_key());
  return {
    [=](pack_atom, const internal_key& k,
        const std::string&) -> caf::result<internal_key, std::string> {
      if (!genuine(k, self->state.c->key, "pack (sandbox)"))
        return refuse("pack");
      return no_files(self->state, "pack");
    },
    [=](exec_atom, const internal_key& k, const exec_request& req) -> caf::result<exec_result> {
      auto& s = self->state;
      if (!genuine(k, s.c->key, "exec (sandbox)"))
        return refuse("exec");
      if (s.ph != phase::ready)
        return not_ready(s);
      if (req.transfer != transfer_none) // a streamed put or get (docs/actors.md, "Transfers")
        return no_files(s, req.transfer == transfer_put ? "put" : "get");
      if (req.argv.empty() || req.argv[0].empty())
        return to_caf(make_error(errc::invalid_argument, "no command given"));
      if (req.tty)
        return to_caf(make_error(errc::unsupported, "terminals (exec -t, pty=): sandbox " + s.id
                                                      + " is simulated and has none"));
      if (req.trusted && !s.c->env.chronus)
        return to_caf(make_error(errc::invalid_argument,
                                 "a trusted command needs a sandbox made with Chronus; sandbox "
                                   + s.id + " was not"));
      if (req.pristine && !req.trusted)
        return to_caf(make_error(errc::invalid_argument,
                                 "a pristine command must be a trusted one (--pristine needs "
                                 "--trusted)"));
      if (req.handle || req.open_stdin)
        return to_caf(make_error(errc::unsupported,
                                 "process handles: sandbox " + s.id
                                   + " is simulated (dsecd --backend sim): it runs no process"));
      // Detached: it "runs" and nobody waits; streamed: no output to stream.
      if (req.detach || s.c->model.exec.count() == 0)
        return exec_result{};
      auto eid = s.next_exec++;
      auto rp = self->make_response_promise<exec_result>();
      s.execs.emplace_back(eid, rp);
      ++s.running;
      self->delayed_send(self, s.c->model.exec, timeout_atom::value, process_key(), eid);
      return rp;
    },
    [=](timeout_atom, const internal_key& k, uint64_t eid) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "timeout (sandbox)"))
        return;
      for (auto it = s.execs.begin(); it != s.execs.end(); ++it)
        if (it->first == eid) {
          auto rp = std::move(it->second);
          s.execs.erase(it);
          --s.running;
          exec_result r;
          r.duration_us = static_cast<uint64_t>(s.c->model.exec.count());
          rp.deliver(std::move(r));
          return;
        }
    },
    [=](feedback_atom, const internal_key& k, const chronus_feedback_msg&) -> caf::result<bool> {
      if (!genuine(k, self->state.c->key, "feedback (sandbox)"))
        return refuse("feedback");
      return to_caf(make_error(errc::not_found, "sandbox " + self->state.id
                                                  + " has no Chronus (it is simulated)"));
    },
    [=](signal_atom, const internal_key& k, int32_t) -> caf::result<bool> {
      auto& s = self->state;
      if (!genuine(k, s.c->key, "signal (sandbox)"))
        return refuse("signal");
      if (s.ph != phase::ready)
        return to_caf(make_error(errc::not_found, "sandbox " + s.id + " is not running"));
      return true;
    },
    [=](signal_atom, const internal_key& k, uint64_t, int32_t) -> caf::result<bool> {
      if (!genuine(k, self->state.c->key, "signal (sandbox)"))
        return refuse("signal");
      return to_caf(make_error(errc::not_found, "sandbox " + self->state.id
                                                  + " is simulated: no command runs in it"));
    },
    [=](stdin_atom, const internal_key& k, uint64_t, std::string&,
        bool) -> caf::result<uint64_t> {
      if (!genuine(k, self->state.c->key, "stdin (sandbox)"))
        return refuse("stdin");
      return to_caf(make_error(errc::not_found, "sandbox " + self->state.id
                                                  + " is simulated: no command runs in it"));
    },
    [=](stdin_atom, const internal_key&, uint64_t) {},
    [=](resize_atom, const internal_key& k, uint64_t, uint16_t,
        uint16_t) -> caf::result<bool> {
      if (!genuine(k, self->state.c->key, "resize (sandbox)"))
        return refuse("resize");
      return to_caf(make_error(errc::unsupported, "terminals (exec -t, pty=): sandbox "
                                                    + self->state.id
                                                    + " is simulated and has none"));
    },
    [=](credit_atom, const internal_key& k, uint64_t, uint64_t) -> caf::result<bool> {
      if (!genuine(k, self->state.c->key, "credit (sandbox)"))
        return refuse("credit");
      return false; // no command runs in it
    },
    [=](put_atom, const internal_key& k, const std::string& dir,
        const std::string& tar) -> caf::result<uint64_t> {
      auto& s = self->state;
      if (!genuine(k, s.c->key, "put (sandbox)"))
        return refuse("put");
      if (dir.empty() || dir.front() != '/')
        return to_caf(make_error(errc::invalid_argument,
                                 "put: the destination must be an absolute path, not '" + dir
                                   + "'"));
      if (s.ph != phase::ready)
        return not_ready(s);
      return uint64_t{tar.size()}; // accepted, and forgotten
    },
    [=](get_atom, const internal_key& k, const std::string&) -> caf::result<std::string> {
      if (!genuine(k, self->state.c->key, "get (sandbox)"))
        return refuse("get");
      return no_files(self->state, "get");
    },
    [=](destroy_atom, const internal_key& k) -> caf::result<bool> {
      if (!genuine(k, self->state.c->key, "destroy (sandbox)"))
        return refuse("destroy");
      auto rp = self->make_response_promise<bool>();
      self->state.destroy_waiters.push_back(rp);
      begin_destroy(self);
      return rp;
    },
    [=](destroy_atom, const internal_key& k, const std::string&) { // (no reason kept here)
      if (genuine(k, self->state.c->key, "destroy (sandbox)"))
        begin_destroy(self);
    },
    [=](list_atom, const internal_key& k) -> caf::result<sandbox_info> {
      auto& s = self->state;
      if (!genuine(k, s.c->key, "list (sandbox)"))
        return refuse("list");
      sandbox_info info;
      info.id = s.id;
      info.session = s.c->session_id;
      info.node = s.c->node_name;
      info.state = phase_name(s);
      info.env = s.c->env;
      info.created_ms = s.created_ms;
      if (s.ttl_end_ms != 0) {
        auto end = s.ttl_end_ms;
        auto now = unix_ms();
        info.ttl_left_ms = end > now ? end - now : 0;
      }
      info.running = s.running;
      return info;
    },
    [=](event_atom, const internal_key& k) { // the modelled creation is over
      if (genuine(k, process_key(), "event (sandbox)"))
        become_ready(self);
    },
    [=](output_atom, const internal_key&, uint64_t, uint8_t, std::string&, bool) {},
    [=](reaped_atom, const internal_key& k) { // the modelled destruction is over
      if (genuine(k, process_key(), "reaped (sandbox)") && self->state.ph == phase::destroying)
        finish_destroy(self);
    },
    [=](lifetime_atom, const internal_key& k, uint64_t ms) -> caf::result<uint64_t> {
      if (!genuine(k, self->state.c->key, "lifetime (sandbox)"))
        return refuse("lifetime");
      auto& s = self->state;
      if (s.ph != phase::ready)
        return to_caf(make_error(errc::invalid_argument,
                                 "sandbox " + s.id + " is not ready: its TTL can be set once it is"));
      ++s.ttl_setting;
      s.ttl_end_ms = unix_ms() + ms;
      self->delayed_send(self, std::chrono::milliseconds(ms), ttl_atom::value, process_key(),
                         s.ttl_setting);
      return ms;
    },
    [=](network_atom, const internal_key& k, const std::vector<std::string>&,
        const std::vector<std::string>&) -> caf::result<bool> {
      if (!genuine(k, self->state.c->key, "network (sandbox)"))
        return refuse("network");
      return to_caf(make_error(errc::unsupported,
                               "a simulated sandbox has no network policy to change"));
    },
    [=](expose_atom, const internal_key& k, uint16_t) -> caf::result<exposed_port> {
      if (!genuine(k, self->state.c->key, "expose (sandbox)"))
        return refuse("expose");
      return to_caf(make_error(errc::unsupported, "a simulated sandbox has no port to expose"));
    },
    [=](logs_atom, const internal_key& k, const logs_request&) -> caf::result<logs_reply> {
      if (!genuine(k, self->state.c->key, "logs (sandbox)"))
        return refuse("logs");
      return to_caf(make_error(errc::unsupported, "a simulated sandbox's commands have no output"));
    },
    [=](usage_atom, const internal_key& k, bool) -> caf::result<sandbox_usage> {
      if (!genuine(k, self->state.c->key, "usage (sandbox)"))
        return refuse("usage");
      return to_caf(make_error(errc::unsupported,
                               "a simulated sandbox has no processes and uses nothing"));
    },
    [=](ttl_atom, const internal_key& k, uint64_t setting) {
      if (genuine(k, process_key(), "ttl (sandbox)") && setting == self->state.ttl_setting)
        begin_destroy(self);
    },
    // Never orphaned (a simulated sandbox ends with its session, even when its
    // coordinator's process went away): nothing to adopt.
    [=](adopt_atom, const internal_key& k, const caf::actor&, const create_labels&, uint32_t) {
      (void) genuine(k, process_key(), "adopt (sim sandbox)");
    },
    [=](orphan_atom, const internal_key& k, uint64_t) {
      (void) genuine(k, process_key(), "orphan (sim sandbox)");
    },
    [=](claim_atom, const internal_key& k, const caf::actor&, const std::string&, uint64_t,
        uint64_t, bool) -> caf::result<bool> {
      if (!genuine(k, process_key(), "claim (sim sandbox)"))
        return refuse("claim");
      return false; // a simulated node keeps no warm pools
    },
    // ---- snapshots (issue 16): a simulated sandbox has no processes or files ----
    [=](pause_atom, const internal_key& k, bool) -> caf::result<bool> {
      if (!genuine(k, self->state.c->key, "pause (sandbox)"))
        return refuse("pause");
      return no_files(self->state, "pause");
    },
    [=](snapshot_atom, const internal_key& k,
        const std::string&) -> caf::result<internal_key, std::string> {
      if (!genuine(k, self->state.c->key, "snapshot (sandbox)"))
        return refuse("snapshot");
      return no_files(self->state, "snapshot");
    },
  };
}

} // namespace

sandbox_actor spawn_sim_sandbox(caf::actor_system& sys, std::shared_ptr<const sim_common> common,
                                std::string id, uint64_t request) {
  return sys.spawn(sim_impl, std::move(common), std::move(id), request);
}

} // namespace dsec

#include "actors/session.hpp"

#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <deque>
#include <memory>
#include <unordered_map>

#include "actors/sandbox.hpp"
#include "actors/types.hpp"

namespace dsec {

namespace {

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
  };
  std::unordered_map<uint64_t, batch> batches;
  uint32_t pending = 0; // asked for, not yet ready or failed
  uint64_t next_request = 1;
  bool closing = false;
  uint32_t closed_count = 0;
  std::vector<caf::typed_response_promise<uint32_t>> close_waiters;
  // Chronus: who watches the events, and those kept while nobody did.
  std::vector<caf::actor> watchers;
  std::deque<chronus_event_msg> backlog;
  size_t backlog_bytes = 0;
  uint64_t dropped = 0; // the oldest kept events, dropped when the backlog was full
};

// Events kept for a watcher that has not come yet; beyond either limit, the
// oldest go.
constexpr size_t max_backlog = 65536;
constexpr size_t max_backlog_bytes = 64u << 20;

using self_ptr = session_actor::stateful_pointer<session_state>;

void finish_batch(self_ptr self, uint64_t req) {
  auto& s = self->state;
  auto it = s.batches.find(req);
  if (it == s.batches.end())
    return;
  auto& b = it->second;
  if (b.ready + b.failed < b.count)
    return;
  b.rp.deliver(b.ready);
  s.batches.erase(it);
}

void maybe_end(self_ptr self) {
  auto& s = self->state;
  if (!s.closing || !s.sandboxes.empty() || s.pending > 0)
    return;
  // The scheduler first: once close() has returned, the session is not found.
  caf::anon_send(s.cfg.scheduler, gone_atom::value, s.cfg.id);
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
    caf::anon_send(sb, destroy_atom::value);
  maybe_end(self);
}

// Finds a sandbox of this session, or says why not.
expected<sandbox_actor> find(self_ptr self, const std::string& id) {
  auto& s = self->state;
  auto it = s.sandboxes.find(id);
  if (it == s.sandboxes.end())
    return make_error(errc::not_found, "no sandbox " + id + " in session " + s.cfg.id);
  return it->second;
}

session_actor::behavior_type session_impl(self_ptr self, session_config cfg) {
  self->state.cfg = std::move(cfg);
  if (self->state.cfg.trainer)
    self->monitor(self->state.cfg.trainer);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    if (s.cfg.trainer && dm.source == s.cfg.trainer.address()) {
      close_session(self);
      return;
    }
    auto& w = s.watchers;
    w.erase(std::remove_if(w.begin(), w.end(),
                           [&](const caf::actor& a) { return a.address() == dm.source; }),
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
      uint64_t in_use = s.sandboxes.size() + s.pending;
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
      s.pending += count;
      auto rp = b.rp;
      self
        ->request(s.cfg.scheduler, caf::infinite, place_atom::value, std::move(env), count,
                  session_actor{self}, req, s.cfg.id, s.cfg.options.default_ttl_ms)
        .then([](uint32_t) {},
              [=](caf::error& e) {
                // Nothing was placed: every one of them failed.
                auto& s = self->state;
                auto it = s.batches.find(req);
                if (it == s.batches.end())
                  return;
                uint32_t left = it->second.count - it->second.ready - it->second.failed;
                s.pending -= left;
                it->second.failed += left;
                if (it->second.listener) // one failure for each sandbox, as always
                  for (uint32_t i = 0; i < left; ++i)
                    caf::anon_send(it->second.listener, failed_atom::value, e);
                finish_batch(self, req);
              });
      return rp;
    },
    [=](exec_atom, const std::string& id, exec_request& req)
      -> caf::delegated<exec_result> {
      auto sb = find(self, id);
      if (!sb) {
        auto rp = self->make_response_promise<exec_result>();
        rp.deliver(to_caf(sb.error_value()));
        return {};
      }
      // The sandbox answers the caller directly (and streams output to it).
      return self->delegate(*sb, exec_atom::value, std::move(req));
    },
    [=](put_atom, const std::string& id, std::string& dir,
        std::string& tar) -> caf::delegated<uint64_t> {
      auto sb = find(self, id);
      if (!sb) {
        auto rp = self->make_response_promise<uint64_t>();
        rp.deliver(to_caf(sb.error_value()));
        return {};
      }
      return self->delegate(*sb, put_atom::value, std::move(dir), std::move(tar));
    },
    [=](get_atom, const std::string& id, std::string& path) -> caf::delegated<std::string> {
      auto sb = find(self, id);
      if (!sb) {
        auto rp = self->make_response_promise<std::string>();
        rp.deliver(to_caf(sb.error_value()));
        return {};
      }
      return self->delegate(*sb, get_atom::value, std::move(path));
    },
    [=](destroy_atom, const std::string& id) -> caf::delegated<bool> {
      auto sb = find(self, id);
      if (!sb) {
        auto rp = self->make_response_promise<bool>();
        rp.deliver(to_caf(sb.error_value()));
        return {};
      }
      return self->delegate(*sb, destroy_atom::value);
    },
    [=](list_atom) -> caf::result<std::vector<sandbox_info>> {
      std::vector<sandbox_actor> boxes;
      for (auto& [id, sb] : self->state.sandboxes)
        boxes.push_back(sb);
      return gather_infos(self, {}, boxes);
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
    [=](chronus_atom, chronus_event_msg& ev) {
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
    },
    [=](feedback_atom, const std::string& id,
        chronus_feedback_msg& fb) -> caf::delegated<bool> {
      auto sb = find(self, id);
      if (!sb) {
        auto rp = self->make_response_promise<bool>();
        rp.deliver(to_caf(sb.error_value()));
        return {};
      }
      return self->delegate(*sb, feedback_atom::value, std::move(fb));
    },
    [=](close_atom) -> caf::result<uint32_t> {
      auto rp = self->make_response_promise<uint32_t>();
      self->state.close_waiters.push_back(rp);
      close_session(self);
      return rp;
    },
    [=](ready_atom, const std::string& id, const sandbox_actor& sb, uint64_t req) {
      auto& s = self->state;
      --s.pending;
      s.sandboxes.emplace(id, sb); // until its gone_atom, also when closing
      auto it = s.batches.find(req);
      if (s.closing) {
        // Too late: it goes with the rest, counted by close, and its batch
        // hears that it failed rather than that it is ready.
        ++s.closed_count;
        caf::anon_send(sb, destroy_atom::value);
        if (it != s.batches.end()) {
          ++it->second.failed;
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
        ++it->second.ready;
        if (it->second.listener)
          caf::anon_send(it->second.listener, ready_atom::value, id);
        finish_batch(self, req);
      }
    },
    [=](failed_atom, const caf::error& e, uint64_t req) {
      auto& s = self->state;
      --s.pending;
      auto it = s.batches.find(req);
      if (it != s.batches.end()) {
        ++it->second.failed;
        if (it->second.listener)
          caf::anon_send(it->second.listener, failed_atom::value, e);
        finish_batch(self, req);
      }
      maybe_end(self);
    },
    [=](gone_atom, const std::string& id) {
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

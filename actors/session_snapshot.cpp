// The session's snapshot verbs (issue 16): pause/resume of one sandbox or of
// all, pack_diff (snapshot) and fork. Over the session's state
// (actors/session_state.hpp), like session_log.cpp and session_replay.cpp.
#include <chrono>
#include <memory>

#include "actors/session_state.hpp"
#include "runtime/clock.hpp"
#include "runtime/log.hpp"

namespace dsec::session_detail {

caf::result<bool> pause_one(self_ptr self, const std::string& id, bool on) {
  auto rp = self->make_response_promise<bool>();
  with_sandbox(
    self, id, [=](sandbox_actor sb) mutable { forward_to<bool>(self, sb, rp, pause_atom::value, on); },
    [=](const error& e) mutable { rp.deliver(to_caf(e)); });
  return rp;
}

caf::result<uint32_t> pause_all(self_ptr self, bool on) {
  auto& s = self->state;
  auto rp = self->make_response_promise<uint32_t>();
  if (s.sandboxes.empty()) {
    rp.deliver(uint32_t{0});
    return rp;
  }
  struct tally {
    size_t left = 0;
    uint32_t changed = 0;
    std::optional<caf::error> failure;
  };
  auto t = std::make_shared<tally>();
  t->left = s.sandboxes.size();
  auto one = [=]() mutable {
    if (--t->left > 0)
      return;
    // Every sandbox answered; one that could not be paused (still being
    // created, or going) is left as it is and does not fail the others.
    rp.deliver(t->changed);
  };
  for (auto& [id, sb] : s.sandboxes)
    self->request(sb, std::chrono::seconds(30), pause_atom::value, s.cfg.key, on)
      .then([=](bool changed) mutable { t->changed += changed ? 1 : 0; one(); },
            [=](caf::error&) mutable { one(); });
  return rp;
}

caf::result<std::string> snapshot_one(self_ptr self, const std::string& id,
                                      const std::string& ref) {
  auto rp = self->make_response_promise<std::string>();
  if (auto r = parse_layer_ref(ref); !r) {
    rp.deliver(to_caf(make_error(errc::invalid_argument, "snapshot --as '" + ref
                                                           + "': " + r.error_value().message)));
    return rp;
  }
  with_sandbox(
    self, id,
    [=](sandbox_actor sb) mutable {
      auto key = self->state.cfg.key;
      self->request(sb, caf::infinite, snapshot_atom::value, key, ref)
        .then(
          [=](const internal_key& k, std::string& digest) mutable {
            if (!genuine(k, self->state.cfg.key, "a reply to snapshot")) {
              rp.deliver(refuse("a reply to snapshot"));
              return;
            }
            // A copy in the coordinator's store, where every node fetches
            // layers (nothing to do on one node), before the answer: once
            // it returns, the snapshot can be used on any node. If the copy
            // fails, it is used on its own node only (placement follows the
            // nodes' layer lists), and the answer is still the digest.
            self->request(self->state.cfg.scheduler, caf::infinite, copy_atom::value,
                          process_key(), ref, id)
              .then([=](const internal_key&, bool) mutable { rp.deliver(digest); },
                    [=](caf::error& e) mutable {
                      log::write(log::level::warn, "snapshot",
                                 "a snapshot was not copied to the coordinator: it is used on "
                                 "its node only",
                                 {{"sandbox", id}, {"layer", ref},
                                  {"error", from_caf(e).message}});
                      rp.deliver(digest);
                    });
          },
          [=](caf::error& e) mutable { rp.deliver(e); });
    },
    [=](const error& e) mutable { rp.deliver(to_caf(e)); });
  return rp;
}

caf::result<uint32_t> fork_one(self_ptr self, const std::string& id, uint32_t count,
                               const caf::actor& listener) {
  auto rp = self->make_response_promise<uint32_t>();
  if (count == 0 || count > self->state.cfg.options.quota) {
    rp.deliver(to_caf(make_error(errc::invalid_argument,
                                 "fork " + id + " -n " + std::to_string(count)
                                   + ": the count must be 1 to the session's quota ("
                                   + std::to_string(self->state.cfg.options.quota) + ")")));
    return rp;
  }
  with_sandbox(
    self, id,
    [=](sandbox_actor sb) mutable {
      auto key = self->state.cfg.key;
      // Its environment first (as the node made it), then one diff for all.
      self->request(sb, std::chrono::seconds(30), list_atom::value, key)
        .then(
          [=](sandbox_info& info) mutable {
            auto ref = "fork-" + id + "@" + std::to_string(unix_ms());
            self->request(sb, caf::infinite, snapshot_atom::value, self->state.cfg.key, ref)
              .then(
                [=](const internal_key& k, std::string&) mutable {
                  if (!genuine(k, self->state.cfg.key, "a reply to snapshot")) {
                    rp.deliver(refuse("a reply to snapshot"));
                    return;
                  }
                  environment env = info.env;
                  env.base.clear();
                  env.workdir.clear();
                  env.tools.clear();
                  env.snapshot = ref;
                  session_actor me = self;
                  // In a cluster the diff is copied into the coordinator's
                  // store first, so the forks may go to any node (each
                  // fetches it once); if that fails, they all go to the
                  // source's node, where the diff is.
                  auto create = [=](bool anywhere) mutable {
                    auto done = [=](uint32_t n) mutable { rp.deliver(n); };
                    auto fail = [=](caf::error& e) mutable { rp.deliver(e); };
                    if (anywhere)
                      self->request(me, caf::infinite, create_atom::value, env, count, listener)
                        .then(done, fail);
                    else
                      self->request(me, caf::infinite, create_atom::value, env, count, listener,
                                    create_labels{}, id)
                        .then(done, fail);
                  };
                  self->request(self->state.cfg.scheduler, caf::infinite, copy_atom::value,
                                process_key(), ref, id)
                    .then([=](const internal_key&, bool) mutable { create(true); },
                          [=](caf::error& e) mutable {
                            log::write(log::level::warn, "snapshot",
                                       "a fork's diff was not copied to the coordinator: "
                                       "its sandboxes stay on the source's node",
                                       {{"sandbox", id}, {"error", from_caf(e).message}});
                            create(false);
                          });
                },
                [=](caf::error& e) mutable { rp.deliver(e); });
          },
          [=](caf::error& e) mutable { rp.deliver(e); });
    },
    [=](const error& e) mutable { rp.deliver(to_caf(e)); });
  return rp;
}

} // namespace dsec::session_detail

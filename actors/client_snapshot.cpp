// The client's snapshot verbs (issue 16): pause/resume, snapshot (pack_diff)
// and fork, by sandbox id (the scheduler) and in a session.
#include "actors/client.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/client_request.hpp"
#include "actors/ready_ids.hpp"
#include "actors/types.hpp"
#include "actors/thread_guard.hpp"

namespace dsec {

using namespace detail;

namespace {

// A fork's new sandboxes come like a create's: (ready, id) per sandbox to a
// listener, then the count. `dest` is a scheduler or a session.
template <class Handle>
void fork_batch(caf::actor_system& sys, const caf::actor& identity, const Handle& dest,
                const std::string& id, uint32_t count, completion<std::vector<std::string>> done) {
  struct batch {
    completion<std::vector<std::string>> done;
    std::vector<std::string> ids;
    std::optional<error> first_failure;
  };
  auto b = std::make_shared<batch>();
  b->done = std::move(done);
  auto owner = watch_owner(identity);
  caller_thread_guard pin; // see thread_guard.hpp
  sys.spawn([b, dest, owner, id, count](caf::event_based_actor* self) -> caf::behavior {
    watch_lost(self, dest, owner, [b](error e) { b->done(std::move(e)); });
    self->request(dest, caf::infinite, fork_atom::value, id, count, caf::actor{self})
      .then(
        [=](uint32_t) {
          unwatch(self, dest, owner);
          if (b->ids.empty() && b->first_failure)
            b->done(std::move(*b->first_failure));
          else
            b->done(std::move(b->ids));
          self->quit();
        },
        [=](caf::error& e) {
          unwatch(self, dest, owner);
          b->done(from_caf(e));
          self->quit();
        });
    return {
      [=](ready_atom, std::string& sid) { b->ids.push_back(std::move(sid)); },
      [=](ready_atom, ready_ids& r) {
        for (auto& sid : r.ids)
          b->ids.push_back(std::move(sid));
      },
      [=](failed_atom, caf::error& e) {
        if (!b->first_failure)
          b->first_failure = from_caf(e);
      },
    };
  });
}

} // namespace

// ---- by sandbox id ----------------------------------------------------------------

expected<bool> client::pause(const std::string& id) {
  return blocking<bool>([&](auto& w) { pause_async(id, true, w.done()); });
}

expected<bool> client::resume(const std::string& id) {
  return blocking<bool>([&](auto& w) { pause_async(id, false, w.done()); });
}

expected<std::string> client::snapshot(const std::string& id, const std::string& ref) {
  return blocking<std::string>([&](auto& w) { snapshot_async(id, ref, w.done()); });
}

expected<std::vector<std::string>> client::fork(const std::string& id, uint32_t count) {
  return blocking<std::vector<std::string>>([&](auto& w) { fork_async(id, count, w.done()); });
}

void client::pause_async(const std::string& id, bool on, completion<bool> done) {
  async_call<bool>(*sys_, identity_, scheduler(), std::move(done), pause_atom::value, id, on);
}

void client::snapshot_async(const std::string& id, const std::string& ref,
                            completion<std::string> done) {
  async_call<std::string>(*sys_, identity_, scheduler(), std::move(done), snapshot_atom::value,
                          id, ref);
}

void client::fork_async(const std::string& id, uint32_t count,
                        completion<std::vector<std::string>> done) {
  fork_batch(*sys_, identity_, scheduler(), id, count, std::move(done));
}

// ---- in a session ------------------------------------------------------------------

expected<bool> session::pause(const std::string& id) {
  return blocking<bool>([&](auto& w) { pause_async(id, true, w.done()); });
}

expected<bool> session::resume(const std::string& id) {
  return blocking<bool>([&](auto& w) { pause_async(id, false, w.done()); });
}

expected<uint32_t> session::pause_all() {
  return blocking<uint32_t>([&](auto& w) { pause_all_async(true, w.done()); });
}

expected<uint32_t> session::resume_all() {
  return blocking<uint32_t>([&](auto& w) { pause_all_async(false, w.done()); });
}

expected<std::string> session::snapshot(const std::string& id, const std::string& ref) {
  return blocking<std::string>([&](auto& w) { snapshot_async(id, ref, w.done()); });
}

expected<std::vector<std::string>> session::fork(const std::string& id, uint32_t count) {
  return blocking<std::vector<std::string>>([&](auto& w) { fork_async(id, count, w.done()); });
}

void session::pause_async(const std::string& id, bool on, completion<bool> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<bool>(*client_->sys_, client_->identity_, handle(), std::move(done),
                   pause_atom::value, id, on);
}

void session::pause_all_async(bool on, completion<uint32_t> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<uint32_t>(*client_->sys_, client_->identity_, handle(), std::move(done),
                       pause_atom::value, on);
}

void session::snapshot_async(const std::string& id, const std::string& ref,
                             completion<std::string> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<std::string>(*client_->sys_, client_->identity_, handle(), std::move(done),
                          snapshot_atom::value, id, ref);
}

void session::fork_async(const std::string& id, uint32_t count,
                         completion<std::vector<std::string>> done) {
  if (auto e = closed_error())
    return done(*e);
  fork_batch(*client_->sys_, client_->identity_, handle(), id, count, std::move(done));
}

} // namespace dsec

// dsec::session: a session's verbs (create, find, exec, put, get, destroy,
// set_ttl, list, close, answer), each asynchronous through the request path
// of client_request.hpp, and blocking as the asynchronous call and a wait.
// Watching its Chronus events: client_watch.cpp.
#include "actors/client.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/client_request.hpp"
#include "actors/ready_ids.hpp"
#include "actors/types.hpp"
#include "actors/thread_guard.hpp"

namespace dsec {

using namespace detail;

std::optional<error> session::closed_error() const {
  if (!closed_->load())
    return std::nullopt;
  return make_error(errc::closed, "session " + id_ + " was closed (by close() on this handle):"
                                    " open or resume another");
}

// ---- session: blocking calls (the asynchronous ones and a wait) ----------------------

expected<std::vector<std::string>>
session::create(const environment& env, uint32_t count,
                const std::function<void(const std::string&)>& on_ready,
                const std::function<void(const error&)>& on_failed) {
  // on_ready and on_failed run on this thread, as the sandboxes come.
  return blocking<std::vector<std::string>>([&](auto& w) {
    create_async(env, count, w.done(), w.relay(on_ready), w.relay(on_failed));
  });
}

expected<std::vector<created_sandbox>>
session::create(const environment& env, uint32_t count, const create_labels& labels,
                const std::function<void(const created_sandbox&)>& on_ready,
                const std::function<void(const error&)>& on_failed) {
  return blocking<std::vector<created_sandbox>>([&](auto& w) {
    create_async(env, count, labels, w.done(), w.relay(on_ready), w.relay(on_failed));
  });
}

expected<sandbox_info> session::find(const std::string& key) {
  return blocking<sandbox_info>([&](auto& w) { find_async(key, w.done()); });
}

expected<exec_result> session::exec(const std::string& id, const exec_request& req,
                                    const output_fn& on_output) {
  // The output, if streamed, is written on this thread, as it comes, and
  // credited once written (blocking_streamed_exec).
  return blocking<exec_result>([&](auto& w) {
    if (!on_output)
      return exec_async(id, req, w.done());
    if (auto e = closed_error())
      return w.done()(*e);
    blocking_streamed_exec(*client_->sys_, client_->identity_, handle(), w, on_output, id, req);
  });
}

// put and get: actors/client_transfer.cpp

expected<void> session::destroy(const std::string& id) {
  return blocking<void>([&](auto& w) { destroy_async(id, w.done()); });
}

expected<uint64_t> session::set_ttl(const std::string& id, std::chrono::milliseconds ttl) {
  return blocking<uint64_t>([&](auto& w) { set_ttl_async(id, ttl, w.done()); });
}

expected<void> session::set_network(const std::string& id, const std::vector<std::string>& allow,
                                    const std::vector<std::string>& deny) {
  return blocking<void>([&](auto& w) { set_network_async(id, allow, deny, w.done()); });
}

expected<exposed_port> session::expose(const std::string& id, uint16_t port) {
  return blocking<exposed_port>([&](auto& w) { expose_async(id, port, w.done()); });
}

expected<logs_reply> session::logs(const std::string& id, const logs_request& q) {
  if (auto e = closed_error())
    return *e;
  return blocking<logs_reply>([&](auto& w) {
    async_call<logs_reply>(*client_->sys_, client_->identity_, handle(), w.done(),
                           logs_atom::value, id, q);
  });
}

expected<sandbox_usage> session::usage(const std::string& id, bool processes) {
  return blocking<sandbox_usage>([&](auto& w) { usage_async(id, processes, w.done()); });
}

void session::usage_async(const std::string& id, bool processes,
                          completion<sandbox_usage> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<sandbox_usage>(*client_->sys_, client_->identity_, handle(), std::move(done),
                            usage_atom::value, id, processes);
}

expected<std::vector<sandbox_info>> session::list() {
  return blocking<std::vector<sandbox_info>>([&](auto& w) { list_async(w.done()); });
}

expected<uint32_t> session::close() {
  return blocking<uint32_t>([&](auto& w) { close_async(w.done()); });
}

expected<void> session::answer(const std::string& id, const chronus_feedback& fb) {
  return blocking<void>([&](auto& w) { answer_async(id, fb, w.done()); });
}

// ---- session: asynchronous variants --------------------------------------------------

void session::create_async(const environment& env, uint32_t count,
                           completion<std::vector<std::string>> done,
                           std::function<void(const std::string&)> on_ready,
                           std::function<void(const error&)> on_failed) {
  std::function<void(const created_sandbox&)> ready;
  if (on_ready)
    ready = [on_ready = std::move(on_ready)](const created_sandbox& c) { on_ready(c.id); };
  create_async_impl(env, count, std::nullopt,
                    [done = std::move(done)](expected<std::vector<created_sandbox>> r) {
                      if (!r)
                        return done(std::move(r).error_value());
                      std::vector<std::string> ids;
                      for (auto& c : *r)
                        ids.push_back(std::move(c.id));
                      done(std::move(ids));
                    },
                    std::move(ready), std::move(on_failed));
}

void session::create_async(const environment& env, uint32_t count, const create_labels& labels,
                           completion<std::vector<created_sandbox>> done,
                           std::function<void(const created_sandbox&)> on_ready,
                           std::function<void(const error&)> on_failed) {
  create_async_impl(env, count, labels, std::move(done), std::move(on_ready),
                    std::move(on_failed));
}

void session::create_async_impl(const environment& env, uint32_t count,
                                std::optional<create_labels> labels,
                                completion<std::vector<created_sandbox>> done,
                                std::function<void(const created_sandbox&)> on_ready,
                                std::function<void(const error&)> on_failed) {
  if (auto e = closed_error())
    return done(*e);
  // What the helper collects while the batch comes in.
  struct batch {
    completion<std::vector<created_sandbox>> done;
    std::function<void(const created_sandbox&)> on_ready;
    std::function<void(const error&)> on_failed;
    std::vector<created_sandbox> ids;
    std::optional<error> first_failure;
  };
  auto b = std::make_shared<batch>();
  b->done = std::move(done);
  b->on_ready = std::move(on_ready);
  b->on_failed = std::move(on_failed);
  auto h = handle();
  auto owner = watch_owner(client_->identity_);
  caller_thread_guard pin; // see thread_guard.hpp
  client_->sys_->spawn([b, h, owner, env, count,
                        labels](caf::event_based_actor* self) -> caf::behavior {
    watch_lost(self, h, owner, [b](error e) { b->done(std::move(e)); });
    auto then = [=](auto&& rh) {
      rh.then(
        [=](uint32_t) {
          unwatch(self, h, owner);
          if (b->ids.empty() && b->first_failure && count > 0)
            b->done(std::move(*b->first_failure)); // none at all: say why
          else
            b->done(std::move(b->ids));
          self->quit();
        },
        [=](caf::error& e) {
          unwatch(self, h, owner);
          b->done(from_caf(e));
          self->quit();
        });
    };
    if (labels)
      then(self->request(h, caf::infinite, create_atom::value, env, count, caf::actor{self},
                         *labels));
    else
      then(self->request(h, caf::infinite, create_atom::value, env, count, caf::actor{self}));
    return {
      [=](ready_atom, std::string& id) {
        created_sandbox c{std::move(id), {}};
        if (b->on_ready)
          b->on_ready(c);
        b->ids.push_back(std::move(c));
      },
      [=](ready_atom, ready_ids& r) {
        for (size_t i = 0; i < r.ids.size(); ++i) {
          created_sandbox c{std::move(r.ids[i]), i < r.keys.size() ? std::move(r.keys[i])
                                                                    : std::string{}};
          if (b->on_ready)
            b->on_ready(c);
          b->ids.push_back(std::move(c));
        }
      },
      [=](failed_atom, caf::error& e) {
        auto err = from_caf(e);
        if (b->on_failed)
          b->on_failed(err);
        if (!b->first_failure)
          b->first_failure = std::move(err);
      },
    };
  });
}

void session::find_async(const std::string& key, completion<sandbox_info> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<sandbox_info>(*client_->sys_, client_->identity_, handle(), std::move(done),
                           lookup_atom::value, key);
}

void session::exec_async(const std::string& id, const exec_request& req,
                         completion<exec_result> done, output_fn on_output) {
  if (auto e = closed_error())
    return done(*e);
  if (on_output)
    return async_streamed_exec(*client_->sys_, client_->identity_, handle(), std::move(done),
                               std::move(on_output), id, req);
  async_call<exec_result>(*client_->sys_, client_->identity_, handle(), std::move(done),
                          exec_atom::value, id, req);
}

void session::put_async(const std::string& id, const std::string& dir, std::string tar,
                        completion<uint64_t> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<uint64_t>(*client_->sys_, client_->identity_, handle(), std::move(done),
                       put_atom::value, id, dir, std::move(tar));
}

void session::get_async(const std::string& id, const std::string& path,
                        completion<std::string> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<std::string>(*client_->sys_, client_->identity_, handle(), std::move(done),
                          get_atom::value, id, path);
}

void session::destroy_async(const std::string& id, completion<void> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<bool>(*client_->sys_, client_->identity_, handle(), as_void(std::move(done)),
                   destroy_atom::value, id);
}

void session::set_ttl_async(const std::string& id, std::chrono::milliseconds ttl,
                            completion<uint64_t> done) {
  if (auto e = closed_error())
    return done(*e);
  if (ttl.count() <= 0)
    return done(make_error(errc::invalid_argument,
                           "set_ttl " + id + ": the TTL must be positive"));
  async_call<uint64_t>(*client_->sys_, client_->identity_, handle(), std::move(done),
                       lifetime_atom::value, id, static_cast<uint64_t>(ttl.count()));
}

void session::set_network_async(const std::string& id, std::vector<std::string> allow,
                                std::vector<std::string> deny, completion<void> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<bool>(*client_->sys_, client_->identity_, handle(), as_void(std::move(done)),
                   network_atom::value, id, std::move(allow), std::move(deny));
}

void session::expose_async(const std::string& id, uint16_t port,
                           completion<exposed_port> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<exposed_port>(*client_->sys_, client_->identity_, handle(), std::move(done),
                           expose_atom::value, id, port);
}

void session::list_async(completion<std::vector<sandbox_info>> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<std::vector<sandbox_info>>(*client_->sys_, client_->identity_, handle(),
                                        std::move(done), list_atom::value);
}

void session::close_async(completion<uint32_t> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<uint32_t>(
    *client_->sys_, client_->identity_, handle(),
    [closed = closed_, done = std::move(done)](expected<uint32_t> n) {
      if (n)
        closed->store(true);
      done(std::move(n));
    },
    close_atom::value);
}

void session::answer_async(const std::string& id, const chronus_feedback& fb,
                           completion<void> done) {
  if (auto e = closed_error())
    return done(*e);
  auto msg = feedback_bytes(fb);
  if (!msg)
    return done(std::move(msg).error_value());
  async_call<bool>(*client_->sys_, client_->identity_, handle(), as_void(std::move(done)),
                   feedback_atom::value, id, std::move(*msg));
}

// ---- warm pools and the function backend (actors/warm_pool.hpp) -----------------

expected<uint32_t> session::pool(const environment& env, uint32_t size) {
  auto took = blocking<uint32_t>([&](auto& w) {
    if (auto e = closed_error())
      return w.done()(*e);
    async_call<uint32_t>(*client_->sys_, client_->identity_, handle(), w.done(), pool_atom::value,
                         env, size);
  });
  if (took)
    link_->remember_pool(env, size); // set again after a reattach (client.cpp)
  return took;
}

namespace {

environment as_function(environment env) {
  if (env.backend == backend_container)
    env.backend = "function";
  return env;
}

} // namespace

expected<exec_result> session::call(const environment& env, const exec_request& req) {
  return blocking<exec_result>([&](auto& w) { call_async(env, req, w.done()); });
}

void session::call_async(const environment& env, const exec_request& req,
                         completion<exec_result> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<exec_result>(*client_->sys_, client_->identity_, handle(), std::move(done),
                          call_atom::value, as_function(env), req);
}


} // namespace dsec

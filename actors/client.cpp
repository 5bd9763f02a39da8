#include "actors/client.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "actors/types.hpp"

namespace dsec {

namespace {

// Blocking request/response on a fresh scoped actor (so calls from several
// threads do not share a mailbox).
template <class Result, class Handle, class... Ts>
expected<Result> call(caf::actor_system& sys, const Handle& dest, Ts&&... xs) {
  caf::scoped_actor self{sys};
  std::optional<expected<Result>> out;
  self->request(dest, caf::infinite, std::forward<Ts>(xs)...)
    .receive([&](Result& r) { out.emplace(std::move(r)); },
             [&](caf::error& e) { out.emplace(from_caf(e)); });
  return std::move(*out);
}

// What a helper actor hands to the calling thread.
struct mailbox {
  struct item {
    enum { ready, failed, output, done } kind;
    std::string text; // id, or output data
    uint8_t stream = 0;
    error err;
    uint32_t count = 0;
    exec_result result;
    bool ok = true;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<item> q;

  void push(item it) {
    {
      std::lock_guard<std::mutex> g{mu};
      q.push_back(std::move(it));
    }
    cv.notify_one();
  }
  item pop() {
    std::unique_lock<std::mutex> lk{mu};
    cv.wait(lk, [&] { return !q.empty(); });
    auto it = std::move(q.front());
    q.pop_front();
    return it;
  }
};

// Runs a command with streamed output: a helper actor makes the request (so
// the sandbox streams to it) and forwards chunks and the result to this thread.
template <class Handle, class... Ts>
expected<exec_result> streamed_exec(caf::actor_system& sys, const Handle& dest,
                                    const output_fn& on_output, Ts... xs) {
  auto box = std::make_shared<mailbox>();
  sys.spawn([box, dest, xs...](caf::event_based_actor* self) -> caf::behavior {
    self->request(dest, caf::infinite, xs...)
      .then(
        [=](exec_result& r) {
          mailbox::item it{mailbox::item::done};
          it.result = std::move(r);
          box->push(std::move(it));
          self->quit();
        },
        [=](caf::error& e) {
          mailbox::item it{mailbox::item::done};
          it.ok = false;
          it.err = from_caf(e);
          box->push(std::move(it));
          self->quit();
        });
    return {
      [=](output_chunk& c) {
        mailbox::item it{mailbox::item::output};
        it.stream = c.stream;
        it.text = std::move(c.data);
        box->push(std::move(it));
      },
    };
  });
  for (;;) {
    auto it = box->pop();
    if (it.kind == mailbox::item::output) {
      on_output(it.stream, it.text);
      continue;
    }
    if (!it.ok)
      return it.err;
    return std::move(it.result);
  }
}

} // namespace

void client::configure(caf::actor_system_config& cfg) {
  register_types(cfg);
  cfg.load<caf::io::middleman>();
}

client::client(caf::actor_system& sys, scheduler_actor scheduler)
  : sys_(&sys), scheduler_(std::move(scheduler)) {
  // The trainer's identity: owned sessions monitor it.
  identity_ = sys.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](shutdown_atom) {}};
  });
}

client::~client() {
  caf::anon_send_exit(identity_, caf::exit_reason::user_shutdown);
}

expected<std::unique_ptr<client>> client::connect(caf::actor_system& sys,
                                                  const std::string& host, uint16_t port) {
  auto s = sys.middleman().remote_actor<scheduler_actor>(host, port);
  if (!s) {
    auto e = from_caf(s.error());
    e.code = errc::disconnected;
    e.message = "cannot reach a dsecd at " + host + ":" + std::to_string(port) + ": "
                + sys.render(s.error());
    return e;
  }
  return std::unique_ptr<client>{new client(sys, std::move(*s))};
}

std::unique_ptr<client> client::attach(caf::actor_system& sys, scheduler_actor scheduler) {
  return std::unique_ptr<client>{new client(sys, std::move(scheduler))};
}

expected<std::unique_ptr<session>> client::open_session(const session_options& opts,
                                                        bool owned) {
  caf::scoped_actor self{*sys_};
  std::optional<error> err;
  std::unique_ptr<session> out;
  self
    ->request(scheduler_, caf::infinite, open_atom::value, opts,
              owned ? identity_ : caf::actor{})
    .receive(
      [&](session_actor& h, std::string& id) {
        out.reset(new session(*this, std::move(h), std::move(id)));
      },
      [&](caf::error& e) { err = from_caf(e); });
  if (err)
    return *err;
  return out;
}

expected<std::unique_ptr<session>> client::find_session(const std::string& id) {
  DSEC_TRY(h, call<session_actor>(*sys_, scheduler_, lookup_atom::value, id));
  return std::unique_ptr<session>{new session(*this, std::move(h), id)};
}

expected<exec_result> client::exec(const std::string& id, const exec_request& req,
                                   const output_fn& on_output) {
  if (on_output) {
    auto r = req;
    r.stream = true;
    return streamed_exec(*sys_, scheduler_, on_output, exec_atom::value, id, r);
  }
  return call<exec_result>(*sys_, scheduler_, exec_atom::value, id, req);
}

expected<uint64_t> client::put(const std::string& id, const std::string& dir, std::string tar) {
  return call<uint64_t>(*sys_, scheduler_, put_atom::value, id, dir, std::move(tar));
}

expected<std::string> client::get(const std::string& id, const std::string& path) {
  return call<std::string>(*sys_, scheduler_, get_atom::value, id, path);
}

expected<void> client::destroy(const std::string& id) {
  DSEC_TRY(ok, call<bool>(*sys_, scheduler_, destroy_atom::value, id));
  (void) ok;
  return {};
}

expected<std::vector<sandbox_info>> client::list() {
  return call<std::vector<sandbox_info>>(*sys_, scheduler_, list_atom::value);
}

expected<node_stats> client::stats() {
  return call<node_stats>(*sys_, scheduler_, stats_atom::value);
}

expected<std::vector<std::string>>
session::create(const environment& env, uint32_t count,
                const std::function<void(const std::string&)>& on_ready,
                const std::function<void(const error&)>& on_failed) {
  auto box = std::make_shared<mailbox>();
  auto h = handle_;
  client_->sys_->spawn([box, h, env, count](caf::event_based_actor* self) -> caf::behavior {
    self->request(h, caf::infinite, create_atom::value, env, count, caf::actor{self})
      .then(
        [=](uint32_t n) {
          mailbox::item it{mailbox::item::done};
          it.count = n;
          box->push(std::move(it));
          self->quit();
        },
        [=](caf::error& e) {
          mailbox::item it{mailbox::item::done};
          it.ok = false;
          it.err = from_caf(e);
          box->push(std::move(it));
          self->quit();
        });
    return {
      [=](ready_atom, std::string& id) {
        mailbox::item it{mailbox::item::ready};
        it.text = std::move(id);
        box->push(std::move(it));
      },
      [=](failed_atom, caf::error& e) {
        mailbox::item it{mailbox::item::failed};
        it.err = from_caf(e);
        box->push(std::move(it));
      },
    };
  });
  std::vector<std::string> ids;
  std::optional<error> first_failure;
  for (;;) {
    auto it = box->pop();
    switch (it.kind) {
      case mailbox::item::ready:
        if (on_ready)
          on_ready(it.text);
        ids.push_back(std::move(it.text));
        break;
      case mailbox::item::failed:
        if (!first_failure)
          first_failure = it.err;
        if (on_failed)
          on_failed(it.err);
        break;
      case mailbox::item::done:
        if (!it.ok)
          return it.err;
        if (ids.empty() && first_failure && count > 0)
          return *first_failure; // none at all: say why
        return ids;
      case mailbox::item::output:
        break;
    }
  }
}

expected<exec_result> session::exec(const std::string& id, const exec_request& req,
                                    const output_fn& on_output) {
  if (on_output) {
    auto r = req;
    r.stream = true;
    return streamed_exec(*client_->sys_, handle_, on_output, exec_atom::value, id, r);
  }
  return call<exec_result>(*client_->sys_, handle_, exec_atom::value, id, req);
}

expected<uint64_t> session::put(const std::string& id, const std::string& dir, std::string tar) {
  return call<uint64_t>(*client_->sys_, handle_, put_atom::value, id, dir, std::move(tar));
}

expected<std::string> session::get(const std::string& id, const std::string& path) {
  return call<std::string>(*client_->sys_, handle_, get_atom::value, id, path);
}

expected<void> session::destroy(const std::string& id) {
  DSEC_TRY(ok, call<bool>(*client_->sys_, handle_, destroy_atom::value, id));
  (void) ok;
  return {};
}

expected<std::vector<sandbox_info>> session::list() {
  return call<std::vector<sandbox_info>>(*client_->sys_, handle_, list_atom::value);
}

expected<uint32_t> session::close() {
  return call<uint32_t>(*client_->sys_, handle_, close_atom::value);
}

} // namespace dsec

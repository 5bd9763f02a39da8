#include "actors/client.hpp"
#include "actors/ready_ids.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/sec.hpp>
#include <caf/send.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

#include "actors/types.hpp"

namespace dsec {

namespace {

// What a reply is to the caller: one value as it is; the scheduler's list,
// two values (the sandboxes, the nodes that did not answer), as one.
template <class Result>
struct reply_of {
  template <class Self, class F>
  static auto on(Self*, F f) {
    return [f](Result& r) mutable { f(std::move(r)); };
  }
};
template <>
struct reply_of<sandbox_list> {
  template <class Self, class F>
  static auto on(Self*, F f) {
    return [f](std::vector<sandbox_info>& xs, std::vector<std::string>& missing) mutable {
      f(sandbox_list{std::move(xs), std::move(missing)});
    };
  }
};

// The outcome of one call, handed from a helper actor to the calling thread.
template <class T>
struct outcome {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<expected<T>> value;

  void set(expected<T> v) {
    {
      std::lock_guard<std::mutex> g{mu};
      if (value)
        return; // the first outcome counts
      value.emplace(std::move(v));
    }
    cv.notify_one();
  }
  expected<T> get() {
    std::unique_lock<std::mutex> lk{mu};
    cv.wait(lk, [&] { return value.has_value(); });
    return std::move(*value);
  }
};

// Why a call's destination went away. A session that ended normally was
// closed (errc::closed: a retry cannot succeed); one that ended otherwise,
// or a daemon, is gone (disconnected: reconnect, resume).
template <class Handle>
error gone_error(caf::event_based_actor* self, const caf::error& reason) {
  if constexpr (std::is_same_v<Handle, session_actor>) {
    if (!reason)
      return make_error(errc::closed, "the session was closed (by close(), or `dsec session "
                                      "close`): open or resume another");
    if (reason == caf::exit_reason::user_shutdown)
      return make_error(errc::disconnected,
                        "the session ended without being closed (its daemon stopped, or its"
                        " trainer went away): resume it once a daemon serves its state dir");
  }
  (void) self;
  // (An empty reason, a normal exit, has no category to look at.)
  auto why = reason ? in_words(reason) : std::string{"it ended"};
  return make_error(errc::disconnected, "no answer: the daemon or the session is gone: " + why);
}

// Makes the helper `self` report `dest` going away (its daemon's connection
// dropped, or the daemon shut down) through `on_lost`, then quit. Without it a
// call would wait forever: CAF drops, without an error, what is sent to the
// proxy of an actor whose node is gone, and never answers requests in flight.
template <class Handle>
void watch_dest(caf::event_based_actor* self, const Handle& dest,
           std::function<void(error)> on_lost) {
  auto addr = dest.address();
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source != addr)
      return;
    on_lost(gone_error<Handle>(self, dm.reason));
    self->quit();
  });
  self->monitor(dest);
}

// Blocking request/response through a helper actor that watches `dest`, so
// that calls from several threads do not share a mailbox and a lost daemon
// gives `disconnected` instead of a wait forever.
template <class Result, class Handle, class... Ts>
expected<Result> call(caf::actor_system& sys, const Handle& dest, Ts... xs) {
  auto out = std::make_shared<outcome<Result>>();
  sys.spawn([out, dest, ... xs = std::move(xs)](caf::event_based_actor* self) mutable {
    watch_dest(self, dest, [out](error e) { out->set(std::move(e)); });
    self->request(dest, caf::infinite, std::move(xs)...)
      .then(
        reply_of<Result>::on(self, [=](Result r) {
          self->demonitor(dest.address());
          out->set(std::move(r));
          self->quit();
        }),
        [=](caf::error& e) {
          self->demonitor(dest.address());
          out->set(from_caf(e));
          self->quit();
        });
  });
  return out->get();
}

// What a helper actor hands to the calling thread.
struct mailbox {
  struct item {
    enum kind_t { ready, failed, output, done } kind = done;
    std::string text; // id, or output data
    std::string key;  // a ready sandbox's key
    uint8_t stream = 0;
    error err;
    uint32_t count = 0;
    exec_result result;
    bool ok = true;

    static item of(kind_t k) {
      item it;
      it.kind = k;
      return it;
    }
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
  void fail(error e) {
    item it;
    it.kind = item::done;
    it.ok = false;
    it.err = std::move(e);
    push(std::move(it));
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
    watch_dest(self, dest, [box](error e) { box->fail(std::move(e)); });
    self->request(dest, caf::infinite, xs...)
      .then(
        [=](exec_result& r) {
          self->demonitor(dest.address());
          auto it = mailbox::item::of(mailbox::item::done);
          it.result = std::move(r);
          box->push(std::move(it));
          self->quit();
        },
        [=](caf::error& e) {
          self->demonitor(dest.address());
          box->fail(from_caf(e));
          self->quit();
        });
    return {
      [=](output_chunk& c) {
        auto it = mailbox::item::of(mailbox::item::output);
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

// ---- asynchronous calls ------------------------------------------------------------

// Like watch_dest, and also reports `owner` going away (the client's identity:
// the client object was destroyed) unless `owner` is null.
//
// The monitor of `dest` is kept by `owner` (the client's identity: one per
// destination, see watcher_impl), which forwards its down_msg to each helper
// registered: a monitor per call on the session would cost a walk of CAF's
// list of monitors per call (quadratic in the calls in flight).
using hub_watch_atom = caf::atom_constant<caf::atom("hubwatch")>;
using hub_unwatch_atom = caf::atom_constant<caf::atom("hubunwatch")>;

template <class Handle>
void watch_lost(caf::event_based_actor* self, const Handle& dest, const caf::actor& owner,
                std::function<void(error)> on_lost) {
  auto addr = dest.address();
  auto owner_addr = owner ? owner.address() : caf::actor_addr{};
  self->set_down_handler([=](caf::down_msg& dm) {
    if (owner_addr && dm.source == owner_addr) {
      on_lost(make_error(errc::disconnected, "no answer: the client was closed first"));
      self->quit();
      return;
    }
    if (dm.source != addr)
      return;
    on_lost(gone_error<Handle>(self, dm.reason));
    self->quit();
  });
  if (!owner) {
    self->monitor(dest);
    return;
  }
  self->request(owner, caf::infinite, hub_watch_atom::value, caf::actor_cast<caf::actor>(dest))
    .then([](bool) {},
          [=](caf::error&) { // the identity is gone
            on_lost(make_error(errc::disconnected, "no answer: the client was closed first"));
            self->quit();
          });
}

// Stops the monitors of watch_lost (monitors left behind would pile up on a
// long-lived actor such as the client's identity, one per call).
template <class Handle>
void unwatch(caf::event_based_actor* self, const Handle& dest, const caf::actor& owner) {
  if (owner)
    self->send(owner, hub_unwatch_atom::value, dest.address());
  else
    self->demonitor(dest.address());
}

// The client's identity: owned sessions monitor it, and it watches the
// destinations of the calls in flight for them (watch_lost). When a
// destination goes, each call watching it gets the down_msg; when the
// identity ends (the client is closed), each call gets a down_msg from it.
caf::behavior watcher_impl(caf::event_based_actor* self) {
  struct state {
    // destination -> the helpers watching it
    std::unordered_map<caf::actor_addr, std::unordered_map<caf::actor_addr, caf::actor>> by_dest;
    std::unordered_map<caf::actor_addr, caf::error> gone; // destinations that went, and why
  };
  auto st = std::make_shared<state>();
  auto me = self->address();
  self->attach_functor([st, me](const caf::error& reason) {
    for (auto& [dest, helpers] : st->by_dest)
      for (auto& [addr, h] : helpers)
        caf::anon_send(h, caf::down_msg{me, reason});
    st->by_dest.clear();
  });
  self->set_down_handler([=](caf::down_msg& dm) {
    auto it = st->by_dest.find(dm.source);
    if (it == st->by_dest.end())
      return;
    for (auto& [addr, h] : it->second)
      caf::anon_send(h, caf::down_msg{dm.source, dm.reason});
    st->by_dest.erase(it);
    if (st->gone.size() > 4096)
      st->gone.clear(); // (a call to one of those then waits for its own timeout)
    st->gone.emplace(dm.source, dm.reason);
  });
  return {
    [](shutdown_atom) {},
    [=](hub_watch_atom, const caf::actor& dest) -> bool {
      auto helper = caf::actor_cast<caf::actor>(self->current_sender());
      if (!helper || !dest)
        return true;
      auto addr = dest.address();
      if (auto g = st->gone.find(addr); g != st->gone.end()) {
        caf::anon_send(helper, caf::down_msg{addr, g->second});
        return true;
      }
      auto [it, fresh] = st->by_dest.try_emplace(addr);
      it->second.emplace(helper.address(), helper);
      if (fresh)
        self->monitor(dest);
      return true;
    },
    [=](hub_unwatch_atom, const caf::actor_addr& dest) {
      auto sender = self->current_sender();
      if (!sender)
        return;
      auto it = st->by_dest.find(dest);
      if (it != st->by_dest.end())
        it->second.erase(sender->address());
    },
  };
}

// The asynchronous counterpart of call(): a helper actor makes the request and
// hands the outcome to `done` on its CAF thread. `done` runs exactly once: with
// the reply, the error, or `disconnected` when `dest` or `owner` goes away.
template <class Result, class Handle, class... Ts>
void async_request(caf::actor_system& sys, const caf::actor& owner, const Handle& dest,
                   completion<Result> done, output_fn on_output, Ts... xs) {
  auto fin = std::make_shared<completion<Result>>(std::move(done));
  sys.spawn([fin, owner, dest, on_output = std::move(on_output),
             ... xs = std::move(xs)](caf::event_based_actor* self) mutable -> caf::behavior {
    watch_lost(self, dest, owner, [fin](error e) { (*fin)(std::move(e)); });
    self->request(dest, caf::infinite, std::move(xs)...)
      .then(
        reply_of<Result>::on(self, [=](Result r) {
          unwatch(self, dest, owner);
          (*fin)(std::move(r));
          self->quit();
        }),
        [=](caf::error& e) {
          unwatch(self, dest, owner);
          (*fin)(from_caf(e));
          self->quit();
        });
    // A streamed exec's output comes to the helper (it made the request).
    return {
      [=](output_chunk& c) {
        if (on_output)
          on_output(c.stream, c.data);
      },
    };
  });
}

template <class Result, class Handle, class... Ts>
void async_call(caf::actor_system& sys, const caf::actor& owner, const Handle& dest,
                completion<Result> done, Ts... xs) {
  async_request<Result>(sys, owner, dest, std::move(done), output_fn{}, std::move(xs)...);
}

// A reply of `true` (destroy, feedback) as expected<void>.
completion<bool> as_void(completion<void> done) {
  return [done = std::move(done)](expected<bool> r) {
    if (!r)
      done(std::move(r).error_value());
    else
      done(expected<void>{});
  };
}

// exec_async with streamed output: each chunk goes to `on_output` before
// `done` gets the result.
template <class Handle, class... Ts>
void async_streamed_exec(caf::actor_system& sys, const caf::actor& owner, const Handle& dest,
                         completion<exec_result> done, output_fn on_output, Ts... xs) {
  async_request<exec_result>(sys, owner, dest, std::move(done), std::move(on_output),
                             std::move(xs)...);
}

} // namespace

void client::configure(caf::actor_system_config& cfg) {
  register_types(cfg);
  cfg.load<caf::io::middleman>();
  // A heartbeat every second keeps the link alive however long a command
  // runs or the trainer idles: dsecd drops a link only after its
  // --client-timeout (30 s) of silence. The daemon beats too; a daemon that
  // is silent for a minute (hung, or cut off) is taken for gone.
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::seconds(1)});
  cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::seconds(60)});
}

expected<void> client::configure(caf::actor_system_config& cfg, const tls_options& tls) {
  configure(cfg);
  return configure_tls(cfg, tls);
}

client::client(caf::actor_system& sys, scheduler_actor scheduler)
  : sys_(&sys), scheduler_(std::move(scheduler)) {
  // The trainer's identity: owned sessions monitor it.
  identity_ = sys.spawn(watcher_impl);
}

client::~client() {
  caf::anon_send_exit(identity_, caf::exit_reason::user_shutdown);
}

expected<std::unique_ptr<client>> client::connect(caf::actor_system& sys,
                                                  const std::string& host, uint16_t port) {
  auto s = dsec::connect(sys, host, port, sys.message_types<scheduler_actor>());
  if (!s) {
    auto e = std::move(s).error_value();
    // "cannot reach HOST:PORT: why" -> "cannot reach a dsecd at HOST:PORT: why"
    const std::string prefix = "cannot reach ";
    if (e.message.compare(0, prefix.size(), prefix) == 0)
      e.message.insert(prefix.size(), "a dsecd at ");
    return e;
  }
  return std::unique_ptr<client>{
    new client(sys, caf::actor_cast<scheduler_actor>(std::move(*s)))};
}

std::unique_ptr<client> client::attach(caf::actor_system& sys, scheduler_actor scheduler) {
  return std::unique_ptr<client>{new client(sys, std::move(scheduler))};
}

namespace {

// Asks the scheduler for a session with (atom, arg, trainer): open or resume.
template <class Atom, class Arg>
expected<std::pair<session_actor, std::string>>
session_call(caf::actor_system& sys, const scheduler_actor& dest, Atom atom, Arg arg,
             caf::actor trainer) {
  using opened = std::pair<session_actor, std::string>;
  auto out = std::make_shared<outcome<opened>>();
  sys.spawn([out, dest, atom, arg, trainer](caf::event_based_actor* self) {
    watch_dest(self, dest, [out](error e) { out->set(std::move(e)); });
    self->request(dest, caf::infinite, atom, arg, trainer)
      .then(
        [=](session_actor& h, std::string& id) {
          self->demonitor(dest.address());
          out->set(opened{std::move(h), std::move(id)});
          self->quit();
        },
        [=](caf::error& e) {
          self->demonitor(dest.address());
          out->set(from_caf(e));
          self->quit();
        });
  });
  return out->get();
}

} // namespace

expected<std::unique_ptr<session>> client::open_session(const session_options& opts,
                                                        bool owned) {
  DSEC_TRY(o, session_call(*sys_, scheduler_, open_atom::value, opts,
                           owned ? identity_ : caf::actor{}));
  return std::unique_ptr<session>{new session(*this, std::move(o.first), std::move(o.second))};
}

expected<std::unique_ptr<session>> client::resume_session(const std::string& id, bool owned) {
  DSEC_TRY(o, session_call(*sys_, scheduler_, resume_atom::value, id,
                           owned ? identity_ : caf::actor{}));
  return std::unique_ptr<session>{new session(*this, std::move(o.first), std::move(o.second))};
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
  DSEC_TRY(all, list_all());
  return std::move(all.sandboxes);
}

expected<sandbox_list> client::list_all() {
  return call<sandbox_list>(*sys_, scheduler_, list_atom::value);
}

expected<node_stats> client::stats() {
  return call<node_stats>(*sys_, scheduler_, stats_atom::value);
}

expected<std::vector<member_info>> client::cluster() {
  return call<std::vector<member_info>>(*sys_, scheduler_, cluster_atom::value);
}

// ---- client: asynchronous variants ---------------------------------------------------

namespace {

using opened_session = std::pair<session_actor, std::string>;

// async_call for the scheduler's (session_actor, id) replies to open and resume.
template <class... Ts>
void async_open(caf::actor_system& sys, const caf::actor& owner, const scheduler_actor& dest,
                completion<opened_session> done, Ts... xs) {
  auto fin = std::make_shared<completion<opened_session>>(std::move(done));
  sys.spawn([fin, owner, dest, xs...](caf::event_based_actor* self) {
    watch_lost(self, dest, owner, [fin](error e) { (*fin)(std::move(e)); });
    self->request(dest, caf::infinite, xs...)
      .then(
        [=](session_actor& h, std::string& id) {
          unwatch(self, dest, owner);
          (*fin)(opened_session{std::move(h), std::move(id)});
          self->quit();
        },
        [=](caf::error& e) {
          unwatch(self, dest, owner);
          (*fin)(from_caf(e));
          self->quit();
        });
  });
}

} // namespace

void client::open_session_async(const session_options& opts,
                                completion<std::unique_ptr<session>> done, bool owned) {
  auto trainer = owned ? identity_ : caf::actor{};
  async_open(
    *sys_, identity_, scheduler_,
    [this, done = std::move(done)](expected<opened_session> o) {
      if (!o)
        return done(std::move(o).error_value());
      done(std::unique_ptr<session>{new session(*this, std::move(o->first), std::move(o->second))});
    },
    open_atom::value, opts, trainer);
}

void client::resume_session_async(const std::string& id,
                                  completion<std::unique_ptr<session>> done, bool owned) {
  auto trainer = owned ? identity_ : caf::actor{};
  async_open(
    *sys_, identity_, scheduler_,
    [this, done = std::move(done)](expected<opened_session> o) {
      if (!o)
        return done(std::move(o).error_value());
      done(std::unique_ptr<session>{new session(*this, std::move(o->first), std::move(o->second))});
    },
    resume_atom::value, id, trainer);
}

void client::exec_async(const std::string& id, const exec_request& req,
                        completion<exec_result> done, output_fn on_output) {
  if (on_output) {
    auto r = req;
    r.stream = true;
    return async_streamed_exec(*sys_, identity_, scheduler_, std::move(done),
                               std::move(on_output), exec_atom::value, id, r);
  }
  async_call<exec_result>(*sys_, identity_, scheduler_, std::move(done), exec_atom::value, id,
                          req);
}

void client::put_async(const std::string& id, const std::string& dir, std::string tar,
                       completion<uint64_t> done) {
  async_call<uint64_t>(*sys_, identity_, scheduler_, std::move(done), put_atom::value, id, dir,
                       std::move(tar));
}

void client::get_async(const std::string& id, const std::string& path,
                       completion<std::string> done) {
  async_call<std::string>(*sys_, identity_, scheduler_, std::move(done), get_atom::value, id,
                          path);
}

void client::destroy_async(const std::string& id, completion<void> done) {
  async_call<bool>(*sys_, identity_, scheduler_, as_void(std::move(done)), destroy_atom::value,
                   id);
}

void client::list_async(completion<std::vector<sandbox_info>> done) {
  list_all_async([done = std::move(done)](expected<sandbox_list> r) {
    if (!r)
      done(std::move(r).error_value());
    else
      done(std::move(r->sandboxes));
  });
}

void client::list_all_async(completion<sandbox_list> done) {
  async_call<sandbox_list>(*sys_, identity_, scheduler_, std::move(done), list_atom::value);
}

void client::stats_async(completion<node_stats> done) {
  async_call<node_stats>(*sys_, identity_, scheduler_, std::move(done), stats_atom::value);
}

// ---- session ---------------------------------------------------------------------------

namespace {

// A create through a helper actor, blocking: with `labels` the labeled
// create_atom (ready_ids with keys), else the plain one. `on_ready` and
// `on_failed` run on the calling thread.
expected<std::vector<created_sandbox>>
blocking_create(caf::actor_system& sys, const session_actor& h, const environment& env,
                uint32_t count, std::optional<create_labels> labels,
                const std::function<void(const created_sandbox&)>& on_ready,
                const std::function<void(const error&)>& on_failed) {
  auto box = std::make_shared<mailbox>();
  sys.spawn([box, h, env, count, labels](caf::event_based_actor* self) -> caf::behavior {
    watch_dest(self, h, [box](error e) { box->fail(std::move(e)); });
    auto then = [=](auto&& rh) {
      rh.then(
        [=](uint32_t n) {
          self->demonitor(h.address());
          auto it = mailbox::item::of(mailbox::item::done);
          it.count = n;
          box->push(std::move(it));
          self->quit();
        },
        [=](caf::error& e) {
          self->demonitor(h.address());
          box->fail(from_caf(e));
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
        auto it = mailbox::item::of(mailbox::item::ready);
        it.text = std::move(id);
        box->push(std::move(it));
      },
      [=](ready_atom, ready_ids& r) {
        for (size_t i = 0; i < r.ids.size(); ++i) {
          auto it = mailbox::item::of(mailbox::item::ready);
          it.text = std::move(r.ids[i]);
          if (i < r.keys.size())
            it.key = std::move(r.keys[i]);
          box->push(std::move(it));
        }
      },
      [=](failed_atom, caf::error& e) {
        auto it = mailbox::item::of(mailbox::item::failed);
        it.err = from_caf(e);
        box->push(std::move(it));
      },
    };
  });
  std::vector<created_sandbox> made;
  std::optional<error> first_failure;
  for (;;) {
    auto it = box->pop();
    switch (it.kind) {
      case mailbox::item::ready: {
        created_sandbox c{std::move(it.text), std::move(it.key)};
        if (on_ready)
          on_ready(c);
        made.push_back(std::move(c));
        break;
      }
      case mailbox::item::failed:
        if (!first_failure)
          first_failure = it.err;
        if (on_failed)
          on_failed(it.err);
        break;
      case mailbox::item::done:
        if (!it.ok)
          return it.err;
        if (made.empty() && first_failure && count > 0)
          return *first_failure; // none at all: say why
        return made;
      case mailbox::item::output:
        break;
    }
  }
}

} // namespace

std::optional<error> session::closed_error() const {
  if (!closed_->load())
    return std::nullopt;
  return make_error(errc::closed, "session " + id_ + " was closed (by close() on this handle):"
                                    " open or resume another");
}

expected<std::vector<std::string>>
session::create(const environment& env, uint32_t count,
                const std::function<void(const std::string&)>& on_ready,
                const std::function<void(const error&)>& on_failed) {
  if (auto e = closed_error())
    return *e;
  std::function<void(const created_sandbox&)> ready;
  if (on_ready)
    ready = [&](const created_sandbox& c) { on_ready(c.id); };
  DSEC_TRY(made, blocking_create(*client_->sys_, handle_, env, count, std::nullopt, ready,
                                 on_failed));
  std::vector<std::string> ids;
  for (auto& c : made)
    ids.push_back(std::move(c.id));
  return ids;
}

expected<std::vector<created_sandbox>>
session::create(const environment& env, uint32_t count, const create_labels& labels,
                const std::function<void(const created_sandbox&)>& on_ready,
                const std::function<void(const error&)>& on_failed) {
  if (auto e = closed_error())
    return *e;
  return blocking_create(*client_->sys_, handle_, env, count, labels, on_ready, on_failed);
}

expected<sandbox_info> session::find(const std::string& key) {
  if (auto e = closed_error())
    return *e;
  return dsec::call<sandbox_info>(*client_->sys_, handle_, lookup_atom::value, key);
}

void session::find_async(const std::string& key, completion<sandbox_info> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<sandbox_info>(*client_->sys_, client_->identity_, handle_, std::move(done),
                           lookup_atom::value, key);
}

expected<exec_result> session::exec(const std::string& id, const exec_request& req,
                                    const output_fn& on_output) {
  if (auto e = closed_error())
    return *e;
  if (on_output) {
    auto r = req;
    r.stream = true;
    return streamed_exec(*client_->sys_, handle_, on_output, exec_atom::value, id, r);
  }
  return dsec::call<exec_result>(*client_->sys_, handle_, exec_atom::value, id, req);
}

expected<uint64_t> session::put(const std::string& id, const std::string& dir, std::string tar) {
  if (auto e = closed_error())
    return *e;
  return dsec::call<uint64_t>(*client_->sys_, handle_, put_atom::value, id, dir, std::move(tar));
}

expected<std::string> session::get(const std::string& id, const std::string& path) {
  if (auto e = closed_error())
    return *e;
  return dsec::call<std::string>(*client_->sys_, handle_, get_atom::value, id, path);
}

expected<void> session::destroy(const std::string& id) {
  if (auto e = closed_error())
    return *e;
  DSEC_TRY(ok, dsec::call<bool>(*client_->sys_, handle_, destroy_atom::value, id));
  (void) ok;
  return {};
}

expected<uint64_t> session::set_ttl(const std::string& id, std::chrono::milliseconds ttl) {
  if (auto e = closed_error())
    return *e;
  if (ttl.count() <= 0)
    return make_error(errc::invalid_argument, "set_ttl " + id + ": the TTL must be positive");
  return dsec::call<uint64_t>(*client_->sys_, handle_, lifetime_atom::value, id,
                        static_cast<uint64_t>(ttl.count()));
}

expected<std::vector<sandbox_info>> session::list() {
  if (auto e = closed_error())
    return *e;
  return dsec::call<std::vector<sandbox_info>>(*client_->sys_, handle_, list_atom::value);
}

expected<uint32_t> session::close() {
  if (auto e = closed_error())
    return *e;
  auto n = dsec::call<uint32_t>(*client_->sys_, handle_, close_atom::value);
  if (n)
    closed_->store(true);
  return n;
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
  auto h = handle_;
  auto owner = client_->identity_;
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

void session::exec_async(const std::string& id, const exec_request& req,
                         completion<exec_result> done, output_fn on_output) {
  if (auto e = closed_error())
    return done(*e);
  if (on_output) {
    auto r = req;
    r.stream = true;
    return async_streamed_exec(*client_->sys_, client_->identity_, handle_, std::move(done),
                               std::move(on_output), exec_atom::value, id, r);
  }
  async_call<exec_result>(*client_->sys_, client_->identity_, handle_, std::move(done),
                          exec_atom::value, id, req);
}

void session::put_async(const std::string& id, const std::string& dir, std::string tar,
                        completion<uint64_t> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<uint64_t>(*client_->sys_, client_->identity_, handle_, std::move(done),
                       put_atom::value, id, dir, std::move(tar));
}

void session::get_async(const std::string& id, const std::string& path,
                        completion<std::string> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<std::string>(*client_->sys_, client_->identity_, handle_, std::move(done),
                          get_atom::value, id, path);
}

void session::destroy_async(const std::string& id, completion<void> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<bool>(*client_->sys_, client_->identity_, handle_, as_void(std::move(done)),
                   destroy_atom::value, id);
}

void session::set_ttl_async(const std::string& id, std::chrono::milliseconds ttl,
                            completion<uint64_t> done) {
  if (auto e = closed_error())
    return done(*e);
  if (ttl.count() <= 0)
    return done(make_error(errc::invalid_argument,
                           "set_ttl " + id + ": the TTL must be positive"));
  async_call<uint64_t>(*client_->sys_, client_->identity_, handle_, std::move(done),
                       lifetime_atom::value, id, static_cast<uint64_t>(ttl.count()));
}

void session::list_async(completion<std::vector<sandbox_info>> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<std::vector<sandbox_info>>(*client_->sys_, client_->identity_, handle_,
                                        std::move(done), list_atom::value);
}

void session::close_async(completion<uint32_t> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<uint32_t>(
    *client_->sys_, client_->identity_, handle_,
    [closed = closed_, done = std::move(done)](expected<uint32_t> n) {
      if (n)
        closed->store(true);
      done(std::move(n));
    },
    close_atom::value);
}

// ---- Chronus -------------------------------------------------------------------

struct event_stream::queue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<chronus_event_msg> events; // as they came, decoded when pulled
  std::optional<error> end;             // why no more will come
  std::function<void(const chronus_event&)> on_event;
  std::function<void(const error&)> on_end;

  void push(chronus_event_msg m) {
    if (on_event) {
      if (auto ev = decode(m))
        on_event(*ev);
      return;
    }
    {
      std::lock_guard<std::mutex> g{mu};
      events.push_back(std::move(m));
    }
    cv.notify_one();
  }
  // The event, with what a resumed session says about it (replayed, the
  // logged answer).
  static expected<chronus_event> decode(const chronus_event_msg& m) {
    DSEC_TRY(ev, decode_event(as_bytes(m.bytes)));
    ev.replayed = m.replayed;
    if (!m.answer.empty())
      if (auto fb = decode_feedback(as_bytes(m.answer)))
        ev.answer = std::move(*fb);
    return ev;
  }
  void finish(error e) {
    bool first = false;
    {
      std::lock_guard<std::mutex> g{mu};
      if (!end) {
        end = e;
        first = true;
      }
    }
    cv.notify_all();
    if (first && on_end)
      on_end(e);
  }
};

expected<std::optional<chronus_event>> event_stream::next(std::chrono::milliseconds timeout) {
  chronus_event_msg m;
  {
    std::unique_lock<std::mutex> lk{q_->mu};
    if (!q_->cv.wait_for(lk, timeout, [&] { return !q_->events.empty() || q_->end; }))
      return std::optional<chronus_event>{};
    if (q_->events.empty())
      return *q_->end;
    m = std::move(q_->events.front());
    q_->events.pop_front();
  }
  DSEC_TRY(ev, queue::decode(m));
  return std::optional<chronus_event>{std::move(ev)};
}

event_stream::~event_stream() {
  if (helper_)
    caf::anon_send_exit(helper_, caf::exit_reason::user_shutdown);
}

namespace {

// A helper actor subscribes to the session and feeds the queue until the
// session goes (or the stream is dropped, which ends the helper).
expected<std::unique_ptr<event_stream>>
start_watch(caf::actor_system& sys, const session_actor& h,
            std::function<void(const chronus_event&)> on_event,
            std::function<void(const error&)> on_end = {}) {
  auto q = std::make_shared<event_stream::queue>();
  q->on_event = std::move(on_event);
  q->on_end = std::move(on_end);
  auto subscribed = std::make_shared<outcome<uint64_t>>();
  auto helper = sys.spawn([q, h, subscribed](caf::event_based_actor* self) -> caf::behavior {
    auto addr = h.address();
    self->set_down_handler([=](caf::down_msg& dm) {
      if (dm.source != addr)
        return;
      auto e = make_error(errc::disconnected, "the session is gone (closed, or its daemon)");
      subscribed->set(e);
      q->finish(e);
      self->quit();
    });
    self->monitor(h);
    self->request(h, caf::infinite, watch_atom::value, caf::actor{self})
      .then([=](uint64_t kept) { subscribed->set(kept); },
            [=](caf::error& e) {
              auto err = from_caf(e);
              subscribed->set(err);
              q->finish(err);
              self->quit();
            });
    return {
      [=](chronus_atom, chronus_event_msg& m) { q->push(std::move(m)); },
    };
  });
  auto kept = subscribed->get();
  if (!kept) {
    caf::anon_send_exit(helper, caf::exit_reason::user_shutdown);
    return std::move(kept).error_value();
  }
  return std::make_unique<event_stream>(std::move(q), std::move(helper), *kept);
}

expected<chronus_feedback_msg> feedback_bytes(const chronus_feedback& fb) {
  DSEC_TRY_VOID(check_feedback(fb));
  return chronus_feedback_msg{encode_feedback(fb)};
}

} // namespace

expected<std::unique_ptr<event_stream>> session::watch() {
  if (auto e = closed_error())
    return *e;
  return start_watch(*client_->sys_, handle_, {});
}

expected<std::unique_ptr<event_stream>>
session::watch(std::function<void(const chronus_event&)> on_event) {
  if (auto e = closed_error())
    return *e;
  if (!on_event)
    return make_error(errc::invalid_argument, "watch: no callback given");
  return start_watch(*client_->sys_, handle_, std::move(on_event));
}

expected<std::unique_ptr<event_stream>>
session::watch(std::function<void(const chronus_event&)> on_event,
               std::function<void(const error&)> on_end) {
  if (auto e = closed_error())
    return *e;
  if (!on_event)
    return make_error(errc::invalid_argument, "watch: no callback given");
  return start_watch(*client_->sys_, handle_, std::move(on_event), std::move(on_end));
}

void session::answer_async(const std::string& id, const chronus_feedback& fb,
                           completion<void> done) {
  if (auto e = closed_error())
    return done(*e);
  auto msg = feedback_bytes(fb);
  if (!msg)
    return done(std::move(msg).error_value());
  async_call<bool>(*client_->sys_, client_->identity_, handle_, as_void(std::move(done)),
                   feedback_atom::value, id, std::move(*msg));
}

void client::answer_async(const std::string& id, const chronus_feedback& fb,
                          completion<void> done) {
  auto msg = feedback_bytes(fb);
  if (!msg)
    return done(std::move(msg).error_value());
  async_call<bool>(*sys_, identity_, scheduler_, as_void(std::move(done)), feedback_atom::value,
                   id, std::move(*msg));
}

expected<void> session::answer(const std::string& id, const chronus_feedback& fb) {
  if (auto e = closed_error())
    return *e;
  DSEC_TRY(msg, feedback_bytes(fb));
  DSEC_TRY(ok, dsec::call<bool>(*client_->sys_, handle_, feedback_atom::value, id, std::move(msg)));
  (void) ok;
  return {};
}

expected<void> client::answer(const std::string& id, const chronus_feedback& fb) {
  DSEC_TRY(msg, feedback_bytes(fb));
  DSEC_TRY(ok, call<bool>(*sys_, scheduler_, feedback_atom::value, id, std::move(msg)));
  (void) ok;
  return {};
}

// ---- warm pools and the function backend ------------------------------------------

expected<uint32_t> client::pool(const environment& env, uint32_t size) {
  return call<uint32_t>(*sys_, scheduler_, pool_atom::value, env, size);
}

expected<std::vector<pool_info>> client::pools() {
  return call<std::vector<pool_info>>(*sys_, scheduler_, pool_atom::value);
}

expected<uint32_t> session::pool(const environment& env, uint32_t size) {
  if (auto e = closed_error())
    return *e;
  return dsec::call<uint32_t>(*client_->sys_, handle_, pool_atom::value, env, size);
}

namespace {

environment as_function(environment env) {
  if (env.backend == "container")
    env.backend = "function";
  return env;
}

} // namespace

expected<exec_result> session::call(const environment& env, const exec_request& req) {
  if (auto e = closed_error())
    return *e;
  return dsec::call<exec_result>(*client_->sys_, handle_, call_atom::value, as_function(env), req);
}

void session::call_async(const environment& env, const exec_request& req,
                         completion<exec_result> done) {
  if (auto e = closed_error())
    return done(*e);
  async_call<exec_result>(*client_->sys_, client_->identity_, handle_, std::move(done),
                          call_atom::value, as_function(env), req);
}

} // namespace dsec

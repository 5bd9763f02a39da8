// dsec::client: the connection to a dsecd (or an embedded daemon), the request
// path every call takes (client_request.hpp: a helper actor per call; a
// blocking call is the asynchronous one and a wait), and the verbs by sandbox
// id. The session's verbs are in client_session.cpp, watching Chronus events
// in client_watch.cpp.
#include "actors/client.hpp"

#include <algorithm>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/send.hpp>

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "actors/client_request.hpp"
#include "actors/types.hpp"
#include "actors/thread_guard.hpp"

namespace dsec {

using namespace detail;

namespace {

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
  : sys_(&sys), link_(std::make_shared<client_link>()) {
  link_->scheduler = std::move(scheduler);
  // The trainer's identity: owned sessions monitor it.
  caller_thread_guard pin; // see thread_guard.hpp
  identity_ = sys.spawn(watcher_impl);
}

client::~client() {
  if (reconnector_)
    caf::anon_send_exit(reconnector_, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(identity_, caf::exit_reason::user_shutdown);
}

scheduler_actor client::scheduler() const {
  return link_->get();
}

uint64_t client::reconnects() const {
  std::lock_guard<std::mutex> g{link_->mu};
  return link_->reconnects;
}

bool client::wait_connected(std::chrono::milliseconds d) const {
  std::unique_lock<std::mutex> lk{link_->mu};
  return link_->cv.wait_for(lk, d, [&] { return link_->up; });
}

session_actor session::handle() const {
  return link_->get();
}

std::unique_ptr<session> client::make_session(session_actor h, std::string id,
                                              const session_options& opts, bool owned) {
  auto l = std::make_shared<session_link>();
  l->handle = std::move(h);
  l->id = id;
  l->options = opts;
  l->owned = owned;
  std::unique_ptr<session> out{new session(*this, l, std::move(id))};
  l->closed = out->closed_;
  std::lock_guard<std::mutex> g{link_->mu};
  std::erase_if(link_->sessions, [](const std::weak_ptr<session_link>& w) { return w.expired(); });
  link_->sessions.push_back(std::move(l));
  return out;
}

namespace {

// Connects to host:port (the error names a dsecd there).
expected<scheduler_actor> reach(caf::actor_system& sys, const std::string& host,
                                uint16_t port) {
  auto s = dsec::connect(sys, host, port, sys.message_types<scheduler_actor>());
  if (!s) {
    auto e = std::move(s).error_value();
    // "cannot reach HOST:PORT: why" -> "cannot reach a dsecd at HOST:PORT: why"
    const std::string prefix = "cannot reach ";
    if (e.message.compare(0, prefix.size(), prefix) == 0)
      e.message.insert(prefix.size(), "a dsecd at ");
    return e;
  }
  return caf::actor_cast<scheduler_actor>(std::move(*s));
}

using reconnect_atom = caf::atom_constant<caf::atom("reconnect")>;
using reached_atom = caf::atom_constant<caf::atom("reached")>;

// One connect of the reconnector's, on a detached helper of its own (a
// connect blocks its thread): it answers the reconnector with the scheduler,
// or with nothing, and ends. It holds nothing of anybody's after that, so an
// actor system being destroyed never waits for it for long.
caf::behavior reach_impl(caf::event_based_actor* self, caf::actor reconnector, std::string host,
                         uint16_t port) {
  return {[=](reconnect_atom) {
    auto sch = reach(self->system(), host, port);
    if (sch)
      caf::anon_send(reconnector, reached_atom::value, *sch);
    else
      caf::anon_send(reconnector, reached_atom::value);
    self->quit();
  }};
}

// A connected client's reconnector (an ordinary actor: its connects run on
// detached helpers, reach_impl, so it never blocks a CAF thread, and a
// reference to it that something keeps cannot hold up the actor system's
// end, which waits only for detached actors to be destroyed). It monitors the
// scheduler; when the link drops (the daemon
// died or restarted) it connects again, to each of the client's addresses in
// turn, with backoff (100 ms doubling to 2 s), then reattaches every session
// handle the client made that was not closed: an opened one by its id and
// options (the daemon finds it, or rebuilds it for the sandboxes its nodes
// kept: docs/cluster.md), one with a trajectory log by resuming it. Calls
// meanwhile fail with errc::disconnected (their helpers watch the old actors).
caf::behavior reconnector_impl(caf::event_based_actor* self, std::shared_ptr<client_link> link,
                               caf::actor identity) {
  struct state {
    size_t next = 0;
    std::chrono::milliseconds backoff{0};
    caf::actor_addr watched;
    bool reaching = false; // a helper's connect is under way
  };
  auto st = std::make_shared<state>();
  auto watch = [=] {
    auto sch = link->get();
    if (!sch)
      return;
    st->watched = sch.address();
    self->monitor(sch);
  };
  watch();
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source != st->watched)
      return;
    {
      std::lock_guard<std::mutex> g{link->mu};
      link->up = false;
    }
    st->backoff = std::chrono::milliseconds(0);
    self->send(self, reconnect_atom::value);
  });
  return {
    [=](reconnect_atom) {
      const auto& addrs = link->addresses;
      if (addrs.empty() || st->reaching)
        return;
      const auto& [host, port] = addrs[st->next++ % addrs.size()];
      st->reaching = true;
      auto helper = self->system().spawn<caf::detached>(reach_impl, caf::actor{self}, host, port);
      caf::anon_send(helper, reconnect_atom::value);
    },
    [=](reached_atom) { // that connect failed: the next address, after the backoff
      using std::chrono::milliseconds;
      st->reaching = false;
      st->backoff = st->backoff.count() == 0 ? milliseconds(100)
                                             : std::min(milliseconds(2000), st->backoff * 2);
      self->delayed_send(self, st->backoff, reconnect_atom::value);
    },
    [=](reached_atom, scheduler_actor& reached) {
      st->reaching = false;
      auto sch = std::optional<scheduler_actor>{std::move(reached)};
      std::vector<std::shared_ptr<session_link>> sessions;
      {
        std::lock_guard<std::mutex> g{link->mu};
        link->scheduler = *sch;
        ++link->reconnects;
        for (auto& w : link->sessions)
          if (auto l = w.lock(); l && !(l->closed && l->closed->load()))
            sessions.push_back(std::move(l));
      }
      watch();
      auto left = std::make_shared<size_t>(sessions.size());
      auto settle = [=] {
        if (*left > 0 && --*left > 0)
          return;
        {
          std::lock_guard<std::mutex> g{link->mu};
          link->up = true;
        }
        link->cv.notify_all();
      };
      if (sessions.empty()) {
        *left = 1;
        settle();
      }
      // No timeouts on these requests: a request's timeout is a delayed message
      // that holds this actor until it fires, and an actor system being
      // destroyed waits for its detached actors to be gone (a client destroyed
      // within 30 s of a reconnect hung its actor system's destructor). A
      // scheduler that dies meanwhile fails them (its down message starts the
      // next reconnect).
      for (auto& l : sessions) {
        auto trainer = l->owned ? identity : caf::actor{};
        auto got = [=](session_actor& h, std::string&) {
          l->set(h);
          // Its warm pools ended with the coordinator's process: set them
          // again (best effort: a pool the nodes cannot fill now is refilled
          // as they come back, one that is refused is logged by the daemon).
          for (auto& [env, size] : l->pools_now())
            self->request(h, caf::infinite, pool_atom::value, env, size)
              .then([](uint32_t) {}, [](caf::error&) {});
          settle();
        };
        auto failed = [=](caf::error&) { settle(); }; // its calls fail: the actor is gone
        if (l->options.trajectory)
          self->request(*sch, caf::infinite, resume_atom::value, l->id, trainer)
            .then(got, failed);
        else
          self->request(*sch, caf::infinite, reattach_atom::value, l->id, l->options,
                        l->owned, trainer)
            .then(got, failed);
      }
    },
  };
}

} // namespace

expected<std::unique_ptr<client>> client::connect(caf::actor_system& sys,
                                                  const std::string& host, uint16_t port) {
  return connect(sys, std::vector<std::pair<std::string, uint16_t>>{{host, port}});
}

expected<std::unique_ptr<client>>
client::connect(caf::actor_system& sys,
                const std::vector<std::pair<std::string, uint16_t>>& addresses) {
  if (addresses.empty())
    return make_error(errc::invalid_argument, "connect: no address given");
  std::optional<error> last;
  for (const auto& [host, port] : addresses) {
    auto s = reach(sys, host, port);
    if (!s) {
      last = std::move(s).error_value();
      continue;
    }
    std::unique_ptr<client> c{new client(sys, std::move(*s))};
    c->link_->addresses = addresses;
    caller_thread_guard pin; // see thread_guard.hpp
    c->reconnector_ = sys.spawn(reconnector_impl, c->link_, c->identity_);
    return c;
  }
  return std::move(*last);
}

std::unique_ptr<client> client::attach(caf::actor_system& sys, scheduler_actor scheduler) {
  return std::unique_ptr<client>{new client(sys, std::move(scheduler))};
}

expected<chronus_feedback_msg> detail::feedback_bytes(const chronus_feedback& fb) {
  DSEC_TRY_VOID(check_feedback(fb));
  return chronus_feedback_msg{encode_feedback(fb)};
}

// ---- client: blocking calls (the asynchronous ones and a wait) -----------------------

expected<std::unique_ptr<session>> client::open_session(const session_options& opts,
                                                        bool owned) {
  return blocking<std::unique_ptr<session>>(
    [&](auto& w) { open_session_async(opts, w.done(), owned); });
}

expected<std::unique_ptr<session>> client::resume_session(const std::string& id, bool owned) {
  return blocking<std::unique_ptr<session>>(
    [&](auto& w) { resume_session_async(id, w.done(), owned); });
}

expected<std::unique_ptr<session>> client::find_session(const std::string& id) {
  DSEC_TRY(h, blocking<session_actor>([&](auto& w) {
             async_call<session_actor>(*sys_, identity_, scheduler(), w.done(),
                                       lookup_atom::value, id);
           }));
  // Found by its name: the handle carries the session's id.
  std::string real = id;
  if (auto all = sessions(); all) {
    for (const auto& x : *all)
      if (x.state == "live" && x.id != id && x.name == id)
        real = x.id;
  }
  return make_session(std::move(h), real, session_options{}, false);
}

expected<exec_result> client::exec(const std::string& id, const exec_request& req,
                                   const output_fn& on_output) {
  // The output, if streamed, is written on this thread, as it comes, and
  // credited once written (blocking_streamed_exec).
  return blocking<exec_result>([&](auto& w) {
    if (!on_output)
      return exec_async(id, req, w.done());
    blocking_streamed_exec(*sys_, identity_, scheduler(), w, on_output, id, req);
  });
}

// put and get: actors/client_transfer.cpp

expected<void> client::destroy(const std::string& id) {
  return blocking<void>([&](auto& w) { destroy_async(id, w.done()); });
}

expected<void> client::set_network(const std::string& id, const std::vector<std::string>& allow,
                                   const std::vector<std::string>& deny) {
  return blocking<void>([&](auto& w) {
    async_call<bool>(*sys_, identity_, scheduler(), as_void(w.done()), network_atom::value, id,
                     allow, deny);
  });
}

expected<exposed_port> client::expose(const std::string& id, uint16_t port) {
  return blocking<exposed_port>([&](auto& w) {
    async_call<exposed_port>(*sys_, identity_, scheduler(), w.done(), expose_atom::value, id,
                             port);
  });
}

expected<logs_reply> client::logs(const std::string& id, const logs_request& q) {
  return blocking<logs_reply>([&](auto& w) {
    async_call<logs_reply>(*sys_, identity_, scheduler(), w.done(), logs_atom::value, id, q);
  });
}

expected<sandbox_usage> client::usage(const std::string& id, bool processes) {
  return blocking<sandbox_usage>([&](auto& w) {
    async_call<sandbox_usage>(*sys_, identity_, scheduler(), w.done(), usage_atom::value, id,
                              processes);
  });
}

expected<void> client::signal(const std::string& id, uint64_t exec, int sig) {
  return blocking<void>([&](auto& w) {
    async_call<bool>(*sys_, identity_, scheduler(), as_void(w.done()), signal_atom::value, id,
                     exec, static_cast<int32_t>(sig));
  });
}

expected<std::vector<sandbox_info>> client::list() {
  return blocking<std::vector<sandbox_info>>([&](auto& w) { list_async(w.done()); });
}

expected<sandbox_list> client::list_all() {
  return blocking<sandbox_list>([&](auto& w) { list_all_async(w.done()); });
}

expected<node_stats> client::stats() {
  return blocking<node_stats>([&](auto& w) { stats_async(w.done()); });
}

expected<std::vector<member_info>> client::cluster() {
  return blocking<std::vector<member_info>>([&](auto& w) {
    async_call<std::vector<member_info>>(*sys_, identity_, scheduler(), w.done(),
                                         cluster_atom::value);
  });
}

expected<uint32_t> client::cordon(const std::string& node, bool on) {
  return blocking<uint32_t>([&](auto& w) { cordon_async(node, on, w.done()); });
}

expected<uint32_t> client::drain(const std::string& node, std::chrono::milliseconds timeout) {
  return blocking<uint32_t>([&](auto& w) { drain_async(node, timeout, w.done()); });
}

expected<void> client::answer(const std::string& id, const chronus_feedback& fb) {
  return blocking<void>([&](auto& w) { answer_async(id, fb, w.done()); });
}

// ---- client: asynchronous calls ------------------------------------------------------

namespace {

using opened_session = std::pair<session_actor, std::string>;

// async_call for the scheduler's (session_actor, id) replies to open and resume.
template <class... Ts>
void async_open(caf::actor_system& sys, const caf::actor& owner, const scheduler_actor& dest,
                completion<opened_session> done, Ts... xs) {
  auto fin = std::make_shared<completion<opened_session>>(std::move(done));
  caller_thread_guard pin; // see thread_guard.hpp
  sys.spawn([fin, owner = watch_owner(owner), dest, xs...](caf::event_based_actor* self) {
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
    *sys_, identity_, scheduler(),
    [this, opts, owned, done = std::move(done)](expected<opened_session> o) {
      if (!o)
        return done(std::move(o).error_value());
      done(make_session(std::move(o->first), std::move(o->second), opts, owned));
    },
    open_atom::value, opts, trainer);
}

void client::resume_session_async(const std::string& id,
                                  completion<std::unique_ptr<session>> done, bool owned) {
  auto trainer = owned ? identity_ : caf::actor{};
  async_open(
    *sys_, identity_, scheduler(),
    [this, owned, done = std::move(done)](expected<opened_session> o) {
      if (!o)
        return done(std::move(o).error_value());
      session_options opts;
      opts.trajectory = true; // a reconnect resumes it again
      done(make_session(std::move(o->first), std::move(o->second), opts, owned));
    },
    resume_atom::value, id, trainer);
}

void client::exec_async(const std::string& id, const exec_request& req,
                        completion<exec_result> done, output_fn on_output) {
  if (on_output)
    return async_streamed_exec(*sys_, identity_, scheduler(), std::move(done),
                               std::move(on_output), id, req);
  async_call<exec_result>(*sys_, identity_, scheduler(), std::move(done), exec_atom::value, id,
                          req);
}

void client::put_async(const std::string& id, const std::string& dir, std::string tar,
                       completion<uint64_t> done) {
  async_call<uint64_t>(*sys_, identity_, scheduler(), std::move(done), put_atom::value, id, dir,
                       std::move(tar));
}

void client::get_async(const std::string& id, const std::string& path,
                       completion<std::string> done) {
  async_call<std::string>(*sys_, identity_, scheduler(), std::move(done), get_atom::value, id,
                          path);
}

void client::destroy_async(const std::string& id, completion<void> done) {
  async_call<bool>(*sys_, identity_, scheduler(), as_void(std::move(done)), destroy_atom::value,
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
  async_call<sandbox_list>(*sys_, identity_, scheduler(), std::move(done), list_atom::value);
}

void client::stats_async(completion<node_stats> done) {
  async_call<node_stats>(*sys_, identity_, scheduler(), std::move(done), stats_atom::value);
}

void client::cordon_async(const std::string& node, bool on, completion<uint32_t> done) {
  async_call<uint32_t>(*sys_, identity_, scheduler(), std::move(done), cordon_atom::value, node,
                       on);
}

void client::drain_async(const std::string& node, std::chrono::milliseconds timeout,
                         completion<uint32_t> done) {
  async_call<uint32_t>(*sys_, identity_, scheduler(), std::move(done), drain_atom::value, node,
                       static_cast<uint64_t>(std::max<int64_t>(0, timeout.count())));
}

void client::answer_async(const std::string& id, const chronus_feedback& fb,
                          completion<void> done) {
  auto msg = feedback_bytes(fb);
  if (!msg)
    return done(std::move(msg).error_value());
  async_call<bool>(*sys_, identity_, scheduler(), as_void(std::move(done)), feedback_atom::value,
                   id, std::move(*msg));
}

// ---- warm pools (actors/warm_pool.hpp) --------------------------------------------

expected<uint32_t> client::pool(const environment& env, uint32_t size) {
  return blocking<uint32_t>([&](auto& w) {
    async_call<uint32_t>(*sys_, identity_, scheduler(), w.done(), pool_atom::value, env, size);
  });
}

expected<std::vector<session_summary>> client::sessions() {
  return blocking<std::vector<session_summary>>([&](auto& w) {
    async_call<std::vector<session_summary>>(*sys_, identity_, scheduler(), w.done(),
                                             sessions_atom::value);
  });
}

expected<std::vector<pool_info>> client::pools() {
  return blocking<std::vector<pool_info>>([&](auto& w) {
    async_call<std::vector<pool_info>>(*sys_, identity_, scheduler(), w.done(), pool_atom::value);
  });
}


} // namespace dsec

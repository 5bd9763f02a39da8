// The request path of dsec::client (private to client*.cpp): one small
// event-based actor per call makes the request, watches its destination (and
// the client) go away, and hands the outcome to a completion. A blocking call
// is this path and a wait (dsec::waiter, in client.hpp).
#pragma once

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "actors/client.hpp"
#include "actors/types.hpp"
#include "actors/thread_guard.hpp"

namespace dsec::detail {

// A session handle's shared part: the session's actor as the client reaches
// it now (a reattach after a reconnect replaces it), and what a reattach
// needs to ask for it again.
struct session_link {
  mutable std::mutex mu;
  session_actor handle;
  std::string id;
  session_options options;
  bool owned = false;
  std::shared_ptr<std::atomic<bool>> closed; // close() succeeded on the handle
  // The warm pools set through the handle (session::pool), the last size for
  // each environment: set again after a reattach, since a session's pools end
  // with the coordinator's process that held it.
  std::vector<std::pair<environment, uint32_t>> pools;

  void remember_pool(const environment& env, uint32_t size) {
    std::lock_guard<std::mutex> g{mu};
    for (auto it = pools.begin(); it != pools.end(); ++it)
      if (it->first == env) {
        if (size == 0)
          pools.erase(it);
        else
          it->second = size;
        return;
      }
    if (size > 0)
      pools.emplace_back(env, size);
  }
  std::vector<std::pair<environment, uint32_t>> pools_now() const {
    std::lock_guard<std::mutex> g{mu};
    return pools;
  }

  session_actor get() const {
    std::lock_guard<std::mutex> g{mu};
    return handle;
  }
  void set(session_actor h) {
    std::lock_guard<std::mutex> g{mu};
    handle = std::move(h);
  }
};

// A client's connection: the daemon's scheduler as it reaches it now, the
// addresses it may reconnect to (none: an embedded daemon's), and the
// session handles it made (reattached after each reconnect).
struct client_link {
  mutable std::mutex mu;
  std::condition_variable cv; // the link came back
  scheduler_actor scheduler;
  bool up = true;
  std::vector<std::pair<std::string, uint16_t>> addresses;
  std::vector<std::weak_ptr<session_link>> sessions;
  uint64_t reconnects = 0;

  scheduler_actor get() const {
    std::lock_guard<std::mutex> g{mu};
    return scheduler;
  }
};

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
// dropped, or the daemon shut down) through `on_lost`, then quit: without it a
// call would wait forever, as CAF drops, without an error, what is sent to the
// proxy of an actor whose node is gone, and never answers requests in flight.
// It also reports `owner` going away (the client's identity: the client object
// was destroyed) unless `owner` is null.
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


// How a call's helper watches its destination. An asynchronous call: through
// the client's identity (watch_lost's `owner`: one monitor per destination
// however many calls are in flight). A blocking call (made inside blocking(),
// on the calling thread): directly, as CAF then tells it of a destination
// that is already gone before it bounces the request, so the error says who
// went (the daemon, or the session and why) rather than that "what was asked
// ended before it answered".
inline thread_local bool t_blocking_call = false;

inline caf::actor watch_owner(const caf::actor& identity) {
  return t_blocking_call ? caf::actor{} : identity;
}

// Flow control of a streamed exec whose output is consumed elsewhere (a
// blocking call's waiting thread, which runs the relayed on_output): the
// helper notes the command's id, and whoever consumed a chunk calls consumed(),
// which credits it to the daemon. Chunks of command 0 (a session's replay
// from its log) are nobody's to credit.
struct output_ack {
  std::atomic<uint64_t> exec{0};
  std::function<void(uint64_t exec, uint64_t bytes)> send;
  void consumed(uint64_t bytes) const {
    if (auto e = exec.load(); e != 0 && bytes != 0 && send)
      send(e, bytes);
  }
};

// The request path of every call, blocking or not: a helper actor makes the
// request and hands the outcome to `done` on its CAF thread. `done` runs exactly once: with
// the reply, the error, or `disconnected` when `dest` or `owner` goes away.
// With `credit` (a streamed exec whose request has a window), each chunk of
// output is acknowledged to `dest` once `on_output` returned (the credit verb,
// docs/actors.md "Transfers"), so the sandbox sends no more than the window
// ahead of what was consumed; with `ack` as well, on_output only hands the
// chunk on, and what consumes it acknowledges it (output_ack).
template <class Result, class Handle, class... Ts>
void async_request(caf::actor_system& sys, const caf::actor& owner, const Handle& dest,
                   completion<Result> done, output_fn on_output, bool credit,
                   std::shared_ptr<output_ack> ack, Ts... xs) {
  auto fin = std::make_shared<completion<Result>>(std::move(done));
  caller_thread_guard pin; // see thread_guard.hpp
  sys.spawn([fin, owner = watch_owner(owner), dest, on_output = std::move(on_output), credit,
             ack = std::move(ack),
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
        if (ack)
          ack->exec = c.exec;
        if (on_output)
          on_output(c.stream, c.data);
        if (credit && !ack && !c.data.empty())
          self->request(dest, caf::infinite, credit_atom::value, c.sandbox, c.exec,
                        static_cast<uint64_t>(c.data.size()))
            .then([](bool) {}, [](caf::error&) {}); // a command that ended: nothing owed
      },
    };
  });
}

template <class Result, class Handle, class... Ts>
void async_call(caf::actor_system& sys, const caf::actor& owner, const Handle& dest,
                completion<Result> done, Ts... xs) {
  async_request<Result>(sys, owner, dest, std::move(done), output_fn{}, false, nullptr,
                        std::move(xs)...);
}

// A reply of `true` (destroy, feedback) as expected<void>.
inline completion<bool> as_void(completion<void> done) {
  return [done = std::move(done)](expected<bool> r) {
    if (!r)
      done(std::move(r).error_value());
    else
      done(expected<void>{});
  };
}

// exec_async with streamed output: each chunk goes to `on_output` before
// `done` gets the result; `req.window` (streamed_window unless set) bounds what
// the sandbox sends ahead of what on_output took (with `ack`: of what its
// consumer acknowledged).
constexpr uint64_t streamed_window = 1u << 20;
template <class Handle>
void async_streamed_exec(caf::actor_system& sys, const caf::actor& owner, const Handle& dest,
                         completion<exec_result> done, output_fn on_output,
                         const std::string& id, exec_request req,
                         std::shared_ptr<output_ack> ack = nullptr) {
  req.stream = true;
  if (req.window == 0)
    req.window = streamed_window;
  async_request<exec_result>(sys, owner, dest, std::move(done), std::move(on_output), true,
                             std::move(ack), exec_atom::value, id, std::move(req));
}

// The blocking form of a streamed exec: on_output runs on the waiting thread,
// and each chunk is credited once it returned, so a caller that is slow to
// consume holds the command back instead of queueing its output.
template <class Handle, class Waiter>
void blocking_streamed_exec(caf::actor_system& sys, const caf::actor& owner, const Handle& dest,
                            Waiter& w, const output_fn& on_output, const std::string& id,
                            const exec_request& req) {
  auto ack = std::make_shared<output_ack>();
  ack->send = [&sys, owner, dest, id](uint64_t exec, uint64_t bytes) {
    async_call<bool>(sys, owner, dest, [](expected<bool>) {}, credit_atom::value, id, exec,
                     bytes);
  };
  auto consume = [on_output, ack](uint8_t stream, std::string_view data) {
    on_output(stream, data);
    ack->consumed(data.size());
  };
  async_streamed_exec(sys, owner, dest, w.done(), w.relay(output_fn{consume}), id, req,
                      std::move(ack));
}

// The blocking form of a call: `start(w)` starts the asynchronous call with
// the waiter's completion; this waits for its outcome.
template <class T, class Start>
expected<T> blocking(Start&& start) {
  waiter<T> w;
  {
    struct scope {
      bool was = t_blocking_call;
      scope() { t_blocking_call = true; }
      ~scope() { t_blocking_call = was; }
    } s;
    start(w);
  }
  return w.get();
}

/// A feedback answer as the wire carries it; invalid_argument if it is not one.
expected<chronus_feedback_msg> feedback_bytes(const chronus_feedback& fb);

} // namespace dsec::detail

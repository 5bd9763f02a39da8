// dsec::event_stream and session::watch: a session's Chronus events, pulled
// from a queue or pushed to a callback, fed by a helper actor subscribed to
// the session until the session goes or the stream is dropped.
#include "actors/client.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "actors/types.hpp"
#include "actors/thread_guard.hpp"
#include "runtime/chronus.hpp"

namespace dsec {

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
  waiter<uint64_t> subscription;
  auto subscribed = subscription.done(); // its outcome, then the events
  caller_thread_guard pin; // see thread_guard.hpp
  auto helper = sys.spawn([q, h, subscribed](caf::event_based_actor* self) -> caf::behavior {
    auto addr = h.address();
    self->set_down_handler([=](caf::down_msg& dm) {
      if (dm.source != addr)
        return;
      auto e = make_error(errc::disconnected, "the session is gone (closed, or its daemon)");
      subscribed(e);
      q->finish(e);
      self->quit();
    });
    self->monitor(h);
    self->request(h, caf::infinite, watch_atom::value, caf::actor{self})
      .then([=](uint64_t kept) { subscribed(kept); },
            [=](caf::error& e) {
              auto err = from_caf(e);
              subscribed(err);
              q->finish(err);
              self->quit();
            });
    return {
      [=](chronus_atom, chronus_event_msg& m) { q->push(std::move(m)); },
    };
  });
  auto kept = subscription.get();
  if (!kept) {
    caf::anon_send_exit(helper, caf::exit_reason::user_shutdown);
    return std::move(kept).error_value();
  }
  return std::make_unique<event_stream>(std::move(q), std::move(helper), *kept);
}

} // namespace

expected<std::unique_ptr<event_stream>> session::watch() {
  if (auto e = closed_error())
    return *e;
  return start_watch(*client_->sys_, handle(), {});
}

expected<std::unique_ptr<event_stream>>
session::watch(std::function<void(const chronus_event&)> on_event) {
  if (auto e = closed_error())
    return *e;
  if (!on_event)
    return make_error(errc::invalid_argument, "watch: no callback given");
  return start_watch(*client_->sys_, handle(), std::move(on_event));
}

expected<std::unique_ptr<event_stream>>
session::watch(std::function<void(const chronus_event&)> on_event,
               std::function<void(const error&)> on_end) {
  if (auto e = closed_error())
    return *e;
  if (!on_event)
    return make_error(errc::invalid_argument, "watch: no callback given");
  return start_watch(*client_->sys_, handle(), std::move(on_event), std::move(on_end));
}

} // namespace dsec

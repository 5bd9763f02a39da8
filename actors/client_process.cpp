// dsec::process: a command started with a handle (exec_request.handle; issues
// 20 and 23). One helper actor makes the exec request and holds it until the
// command ends: the sandbox tells it the command's id (an output_chunk of
// stream 0), streams the output to it when asked, and SIGKILLs the command if
// it goes away (cancel() makes the helper go). The stdin and signal verbs go by sandbox
// id and command id, through the scheduler (client::start) or the session
// (session::start), as every by-sandbox verb does.
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "actors/client.hpp"
#include "actors/client_request.hpp"
#include "actors/types.hpp"
#include "actors/thread_guard.hpp"

namespace dsec {

using namespace detail;

// The stdin verbs of one command in the order they were made (issue 20).
// One actor (the writer) sends them, at most stdin_in_flight at a time: CAF
// keeps the order of one sender's messages to one receiver, the scheduler (by
// a route it remembers) and the session hand a sandbox's verbs on in the order
// they came, and the sandbox queues what finds its buffer full; so several
// pieces are on their way at once and still reach the command in order. A
// helper per call, as the other verbs have, would not keep the order.
using stdin_pump_atom = caf::atom_constant<caf::atom("stdinpump")>;
constexpr size_t stdin_in_flight = 4;

struct stdin_queue {
  struct item {
    std::string data;
    bool close = false;
    completion<uint64_t> done;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<item> waiting;     // not sent yet
  std::optional<error> broken;  // a piece failed: what follows fails the same
  uint64_t unacked = 0;         // bytes write() gave that the daemon did not take yet
  bool answered = false;        // a write() saw its pieces answered
};

struct process::state {
  caf::actor_system* sys = nullptr;
  caf::actor owner; // the client's identity
  std::variant<scheduler_actor, session_actor> dest;
  std::string sandbox;
  caf::actor helper; // holds the exec request while the command runs

  std::mutex mu;
  std::condition_variable cv;
  std::optional<expected<uint64_t>> id;     // the command's id, or why it never ran
  std::optional<expected<exec_result>> end; // the first outcome counts
  completion<exec_result> on_end;            // told the end, once
  std::shared_ptr<stdin_queue> stdin_q;      // with `writer`, once something was written
  caf::actor writer;

  ~state() {
    if (writer)
      caf::anon_send(writer, close_atom::value); // it goes once what is in flight is answered
  }

  void set_id(expected<uint64_t> r) {
    {
      std::lock_guard<std::mutex> g{mu};
      if (id)
        return;
      id.emplace(std::move(r));
    }
    cv.notify_all();
  }
  void set_end(expected<exec_result> r) {
    {
      std::lock_guard<std::mutex> g{mu};
      if (end)
        return;
      if (!id) // it never ran, or its news came after its end
        id.emplace(r ? expected<uint64_t>{make_error(errc::closed, "the command ended")}
                     : expected<uint64_t>{r.error_value()});
      end.emplace(std::move(r));
    }
    cv.notify_all();
    if (on_end) {
      auto f = std::move(on_end);
      on_end = nullptr;
      f(*end);
    }
  }

  // Runs `f(dest)` with the typed destination.
  template <class F>
  void with_dest(F&& f) {
    std::visit([&](auto& d) { f(d); }, dest);
  }
};

namespace {

// Flow control: `bytes` of command `eid`'s streamed output were consumed.
void send_credit(const std::shared_ptr<process::state>& st, uint64_t eid, uint64_t bytes) {
  st->with_dest([&](auto& dest) {
    async_call<bool>(*st->sys, st->owner, dest, [](expected<bool>) {}, credit_atom::value,
                     st->sandbox, eid, bytes);
  });
}

// The helper: asks for the command, takes its id and its output, and hands
// the end to the state. close_atom (cancel) makes it go, and the sandbox
// SIGKILLs the command its requester left.
void spawn_starter(const std::shared_ptr<process::state>& st, exec_request req,
                   output_fn on_output) {
  req.handle = true;
  if (on_output)
    req.stream = true;
  if (on_output && req.window == 0 && req.transfer == transfer_none)
    req.window = 1u << 20; // streamed output is flow-controlled (credit below)
  // A get's consumer credits what its sink took (get_into); other streamed
  // output is credited once on_output returned.
  bool auto_credit = req.window > 0 && req.transfer == transfer_none;
  st->with_dest([&](auto& dest) {
    caller_thread_guard pin; // see thread_guard.hpp
    st->helper = st->sys->spawn([st, dest, owner = st->owner, id = st->sandbox,
                                 req = std::move(req), on_output = std::move(on_output),
                                 auto_credit](
                                  caf::event_based_actor* self) mutable -> caf::behavior {
      watch_lost(self, dest, owner, [st](error e) { st->set_end(std::move(e)); });
      self->request(dest, caf::infinite, exec_atom::value, id, std::move(req))
        .then(
          [=](exec_result& r) mutable {
            unwatch(self, dest, owner);
            st->set_end(std::move(r));
            self->quit();
          },
          [=](caf::error& e) mutable {
            unwatch(self, dest, owner);
            st->set_end(from_caf(e));
            self->quit();
          });
      return {
        [=](output_chunk& c) {
          if (c.stream == 0)
            st->set_id(c.exec);
          else if (on_output) {
            on_output(c.stream, c.data);
            if (auto_credit)
              send_credit(st, c.exec, c.data.size());
          }
        },
        [=](close_atom) {
          unwatch(self, dest, owner);
          st->set_end(make_error(errc::closed, "the command was cancelled (process::cancel)"));
          self->quit();
        },
      };
    });
  });
}

std::shared_ptr<process::state> make_state(caf::actor_system& sys, caf::actor owner,
                                           std::variant<scheduler_actor, session_actor> dest,
                                           const std::string& id) {
  auto st = std::make_shared<process::state>();
  st->sys = &sys;
  st->owner = std::move(owner);
  st->dest = std::move(dest);
  st->sandbox = id;
  return st;
}

} // namespace

std::unique_ptr<process> client::start(const std::string& id, const exec_request& req,
                                       output_fn on_output, completion<exec_result> on_end) {
  auto st = make_state(*sys_, identity_, scheduler(), id);
  st->on_end = std::move(on_end);
  spawn_starter(st, req, std::move(on_output));
  return std::make_unique<process>(std::move(st));
}

std::unique_ptr<process> session::start(const std::string& id, const exec_request& req,
                                        output_fn on_output, completion<exec_result> on_end) {
  auto st = make_state(*client_->sys_, client_->identity_, handle(), id);
  st->on_end = std::move(on_end);
  if (auto e = closed_error())
    st->set_end(*e);
  else
    spawn_starter(st, req, std::move(on_output));
  return std::make_unique<process>(std::move(st));
}

const std::string& process::sandbox() const {
  return st_->sandbox;
}

expected<uint64_t> process::id() {
  std::unique_lock<std::mutex> lk{st_->mu};
  st_->cv.wait(lk, [&] { return st_->id.has_value(); });
  return *st_->id;
}

// The error of a stdin verb on a command that ended (as far as we know).
std::optional<error> ended_already(process::state& st) {
  std::lock_guard<std::mutex> g{st.mu};
  if (!st.end)
    return std::nullopt;
  return make_error(errc::closed, "the stdin of a command that ended (in sandbox " + st.sandbox
                                    + ")");
}

// The id a stdin verb goes to: closed when the command ended or does not run.
expected<uint64_t> stdin_target(process& p, process::state& st) {
  if (auto e = ended_already(st))
    return *e;
  auto eid = p.id();
  if (!eid)
    return make_error(errc::closed,
                      "stdin of a command that does not run: " + eid.error_value().message);
  return eid;
}

namespace {

// The writer's own state: where its pieces go and the completions of those
// in flight (by sequence number), which hear of a lost destination too.
template <class Handle>
struct writer_ctx {
  std::shared_ptr<stdin_queue> q;
  Handle dest;
  caf::actor owner;
  std::string sandbox;
  uint64_t exec = 0;
  uint64_t next = 0;
  std::map<uint64_t, completion<uint64_t>> flight;
  bool ending = false; // the handle is gone: quit once nothing is in flight
};

// Fails what waits and what is in flight with `e`; what comes after fails too.
template <class Handle>
void fail_all(writer_ctx<Handle>& c, const error& e) {
  std::deque<stdin_queue::item> left;
  {
    std::lock_guard<std::mutex> g{c.q->mu};
    if (!c.q->broken)
      c.q->broken = e;
    left.swap(c.q->waiting);
  }
  c.q->cv.notify_all();
  auto flight = std::move(c.flight);
  c.flight.clear();
  for (auto& [seq, done] : flight)
    done(e);
  for (auto& it : left)
    it.done(e);
}

// Sends what waits, up to stdin_in_flight pieces on their way.
template <class Handle>
void pump(caf::event_based_actor* self, const std::shared_ptr<writer_ctx<Handle>>& c) {
  while (c->flight.size() < stdin_in_flight) {
    stdin_queue::item it;
    {
      std::lock_guard<std::mutex> g{c->q->mu};
      if (c->q->waiting.empty())
        break;
      it = std::move(c->q->waiting.front());
      c->q->waiting.pop_front();
    }
    auto seq = c->next++;
    c->flight.emplace(seq, std::move(it.done));
    auto answer = [c, seq](expected<uint64_t> r) {
      auto f = c->flight.find(seq);
      if (f == c->flight.end())
        return; // failed already (fail_all)
      auto done = std::move(f->second);
      c->flight.erase(f);
      if (!r)
        fail_all(*c, r.error_value());
      done(std::move(r));
    };
    self->request(c->dest, caf::infinite, stdin_atom::value, c->sandbox, c->exec,
                  std::move(it.data), it.close)
      .then(
        [=](uint64_t n) {
          answer(n);
          pump(self, c);
        },
        [=](caf::error& e) {
          answer(from_caf(e));
          pump(self, c);
        });
  }
  if (c->ending && c->flight.empty()) {
    unwatch(self, c->dest, c->owner);
    self->quit();
  }
}

template <class Handle>
caf::actor spawn_writer(caf::actor_system& sys, std::shared_ptr<writer_ctx<Handle>> c) {
  caller_thread_guard pin; // see thread_guard.hpp
  return sys.spawn([c](caf::event_based_actor* self) -> caf::behavior {
    watch_lost(self, c->dest, c->owner, [c](error e) { fail_all(*c, e); });
    return {
      [=](stdin_pump_atom) { pump(self, c); },
      [=](close_atom) {
        c->ending = true;
        pump(self, c);
      },
    };
  });
}

// The command's stdin queue, its writer started with the first write.
expected<std::shared_ptr<stdin_queue>> stdin_of(process& p, process::state& st) {
  auto eid = stdin_target(p, st);
  if (!eid)
    return std::move(eid).error_value();
  std::lock_guard<std::mutex> g{st.mu};
  if (!st.stdin_q) {
    st.stdin_q = std::make_shared<stdin_queue>();
    st.with_dest([&](auto& dest) {
      using handle = std::decay_t<decltype(dest)>;
      auto c = std::make_shared<writer_ctx<handle>>();
      c->q = st.stdin_q;
      c->dest = dest;
      c->owner = st.owner;
      c->sandbox = st.sandbox;
      c->exec = *eid;
      st.writer = spawn_writer(*st.sys, std::move(c));
    });
  }
  return st.stdin_q;
}

// Queues a piece (or the close) behind what was queued before.
void enqueue(process::state& st, stdin_queue& q, std::string data, bool close,
             completion<uint64_t> done) {
  {
    std::unique_lock<std::mutex> lk{q.mu};
    if (q.broken) {
      auto e = *q.broken;
      lk.unlock();
      return done(std::move(e));
    }
    q.waiting.push_back({std::move(data), close, std::move(done)});
  }
  caf::anon_send(st.writer, stdin_pump_atom::value);
}

} // namespace

void process::write_async(std::string data, completion<uint64_t> done) {
  auto q = stdin_of(*this, *st_);
  if (!q)
    return done(std::move(q).error_value());
  enqueue(*st_, **q, std::move(data), false, std::move(done));
}

expected<void> process::write(std::string_view data) {
  auto q = stdin_of(*this, *st_);
  if (!q)
    return std::move(q).error_value();
  auto& sq = **q;
  // In pieces the daemon takes one at a time: each waits for room there.
  constexpr size_t piece = 128u << 10;
  for (size_t off = 0; off < data.size(); off += piece) {
    auto part = data.substr(off, piece);
    {
      std::lock_guard<std::mutex> g{sq.mu};
      if (sq.broken)
        return *sq.broken;
      sq.unacked += part.size();
    }
    enqueue(*st_, sq, std::string{part}, false, [q = *q, n = part.size()](expected<uint64_t> r) {
      {
        std::lock_guard<std::mutex> g{q->mu};
        q->unacked -= n;
        if (!r && !q->broken)
          q->broken = r.error_value();
      }
      q->cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lk{sq.mu};
  // The first write waits for every byte (a stdin that is not open fails it
  // at once); later ones leave up to stdin_window in flight.
  size_t leave = sq.answered ? stdin_window : 0;
  sq.cv.wait(lk, [&] { return sq.broken || sq.unacked <= leave; });
  sq.answered = true;
  if (sq.broken)
    return *sq.broken;
  return {};
}

void process::close_stdin_async(completion<void> done) {
  auto q = stdin_of(*this, *st_);
  if (!q)
    return done(std::move(q).error_value());
  enqueue(*st_, **q, std::string{}, true, [done = std::move(done)](expected<uint64_t> r) {
    if (!r)
      return done(std::move(r).error_value());
    done(expected<void>{});
  });
}

expected<void> process::close_stdin() {
  auto r = blocking<void>([&](auto& w) { close_stdin_async(w.done()); });
  if (!r)
    return r;
  // The close was answered after every piece before it (one sender, in
  // order); one of them may still have failed.
  std::shared_ptr<stdin_queue> q;
  {
    std::lock_guard<std::mutex> g{st_->mu};
    q = st_->stdin_q;
  }
  if (q) {
    std::lock_guard<std::mutex> g{q->mu};
    if (q->broken)
      return *q->broken;
  }
  return r;
}

void process::signal_async(int sig, completion<void> done) {
  auto st = st_;
  auto eid = id();
  if (!eid)
    return done(make_error(errc::not_found, "signal to a command that does not run: "
                                              + eid.error_value().message));
  st->with_dest([&](auto& dest) {
    async_call<bool>(*st->sys, st->owner, dest, as_void(std::move(done)), signal_atom::value,
                     st->sandbox, *eid, static_cast<int32_t>(sig));
  });
}

expected<void> process::signal(int sig) {
  return blocking<void>([&](auto& w) { signal_async(sig, w.done()); });
}

void process::resize_async(uint16_t rows, uint16_t cols, completion<void> done) {
  auto st = st_;
  if (auto e = ended_already(*st))
    return done(make_error(errc::closed, "resize of a command that ended (in sandbox "
                                           + st->sandbox + ")"));
  auto eid = id();
  if (!eid)
    return done(make_error(errc::not_found, "resize of a command that does not run: "
                                              + eid.error_value().message));
  st->with_dest([&](auto& dest) {
    async_call<bool>(*st->sys, st->owner, dest, as_void(std::move(done)), resize_atom::value,
                     st->sandbox, *eid, rows, cols);
  });
}

expected<void> process::resize(uint16_t rows, uint16_t cols) {
  return blocking<void>([&](auto& w) { resize_async(rows, cols, w.done()); });
}

expected<exec_result> process::wait() {
  std::unique_lock<std::mutex> lk{st_->mu};
  st_->cv.wait(lk, [&] { return st_->end.has_value(); });
  return *st_->end;
}

bool process::wait_for(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lk{st_->mu};
  return st_->cv.wait_for(lk, d, [&] { return st_->end.has_value(); });
}

void process::credit(uint64_t bytes) {
  auto eid = id();
  if (eid && bytes > 0)
    send_credit(st_, *eid, bytes);
}

void process::cancel() {
  st_->set_end(make_error(errc::closed, "the command was cancelled (process::cancel)"));
  if (st_->helper)
    caf::anon_send(st_->helper, close_atom::value);
}

} // namespace dsec

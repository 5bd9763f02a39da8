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
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "actors/client.hpp"
#include "actors/client_request.hpp"
#include "actors/types.hpp"

namespace dsec {

using namespace detail;

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

void process::write_async(std::string data, completion<uint64_t> done) {
  auto st = st_;
  auto eid = stdin_target(*this, *st);
  if (!eid)
    return done(std::move(eid).error_value());
  st->with_dest([&](auto& dest) {
    async_call<uint64_t>(*st->sys, st->owner, dest, std::move(done), stdin_atom::value,
                         st->sandbox, *eid, std::move(data), false);
  });
}

expected<void> process::write(std::string_view data) {
  // In pieces the daemon takes one at a time: each waits for room there.
  constexpr size_t piece = 128u << 10;
  for (size_t off = 0; off < data.size(); off += piece) {
    auto r = blocking<uint64_t>(
      [&](auto& w) { write_async(std::string{data.substr(off, piece)}, w.done()); });
    if (!r)
      return std::move(r).error_value();
  }
  return {};
}

void process::close_stdin_async(completion<void> done) {
  auto st = st_;
  auto eid = stdin_target(*this, *st);
  if (!eid)
    return done(std::move(eid).error_value());
  st->with_dest([&](auto& dest) {
    async_call<uint64_t>(
      *st->sys, st->owner, dest,
      [done = std::move(done)](expected<uint64_t> r) {
        if (!r)
          return done(std::move(r).error_value());
        done(expected<void>{});
      },
      stdin_atom::value, st->sandbox, *eid, std::string{}, true);
  });
}

expected<void> process::close_stdin() {
  return blocking<void>([&](auto& w) { close_stdin_async(w.done()); });
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

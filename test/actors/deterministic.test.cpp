// The node's actors (layer_cache, node, scheduler, session, sandbox) under CAF's
// test_coordinator ("scheduler.policy" = testing), over the real runtime: real
// sandboxes from a temporary state dir (test/actors/common.hpp), no mocks.
//
// Every message is handled on this thread, when the test says so (world::step).
// Timers (a sandbox's TTL, an exec's timeout) are on the test clock: they fire
// when the test advances it, never by waiting. What the kernel does (init's
// control socket, its pidfd, the commands' pipes) reaches the actors through the
// engine's reactor thread; the world keeps that thread parked, so nothing
// arrives behind the test's back, and lets it run only in world::settle, until
// a condition holds (bounded; no timed assertion anywhere).
//
// Each test case builds its own world (engine + actors) and tears it down in
// every outcome: every sandbox destroyed, every actor ended, nothing left on the
// host (checked against a snapshot).
#include <doctest/doctest.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/send.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "actors/interfaces.hpp"
#include "actors/layer_cache.hpp"
#include "actors/node.hpp"
#include "actors/scheduler.hpp"
#include "actors/types.hpp"
#include "runtime/engine.hpp"
#include "runtime/store.hpp"
#include "test/actors/common.hpp"
#include "test/support/fixture.hpp"
#include "test/support/host.hpp"

using namespace dsec;
using namespace dsec::test;
using namespace std::chrono_literals;

namespace {

// ---- the scheduler: CAF's test_coordinator, safe against the reactor thread -----

// test_coordinator keeps its job queue in a plain deque and expects every
// enqueue on the thread that runs the jobs. The reactor thread's anon_send
// re-schedules an idle actor from that other thread: those jobs are set aside
// here, under a lock, and join the queue only when the test admits them.
class stepper : public caf::scheduler::test_coordinator {
public:
  explicit stepper(caf::actor_system& sys)
    : test_coordinator(sys), owner_(std::this_thread::get_id()) {}

  /// Moves the jobs other threads scheduled into the queue; returns how many.
  size_t admit() {
    std::lock_guard<std::mutex> g{mu_};
    for (auto* j : foreign_)
      jobs.push_back(j);
    auto n = foreign_.size();
    foreign_.clear();
    return n;
  }

  /// Waits up to `d` for another thread to schedule something.
  bool wait_foreign(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> g{mu_};
    return cv_.wait_for(g, d, [&] { return !foreign_.empty(); });
  }

protected:
  void enqueue(caf::resumable* job) override {
    if (std::this_thread::get_id() == owner_)
      return test_coordinator::enqueue(job);
    std::lock_guard<std::mutex> g{mu_};
    foreign_.push_back(job);
    cv_.notify_all();
  }

private:
  std::thread::id owner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<caf::resumable*> foreign_;
};

// dsec's types, the testing policy (our stepper, installed as the scheduler
// module; the policy is set too, for anyone who reads it), no logs, no middleman.
struct det_config : caf::actor_system_config {
  det_config() {
    register_types(*this);
    set("scheduler.policy", caf::atom("testing"));
    set("logger.console", caf::atom("none"));
    module_factories.push_back(
      [](caf::actor_system& sys) -> caf::actor_system::module* { return new stepper(sys); });
  }
};

// ---- the reactor thread, parked between the test's steps ------------------------

// Parks the reactor thread inside a posted function until opened. While parked
// it reads no completion and sends no message.
class reactor_gate {
public:
  reactor_gate() = default;
  reactor_gate(const reactor_gate&) = delete;
  reactor_gate& operator=(const reactor_gate&) = delete;
  ~reactor_gate() { open(); }

  void close(reactor& io) {
    std::unique_lock<std::mutex> g{mu_};
    if (closed_)
      return;
    closed_ = true;
    release_ = false;
    io.post([this] {
      std::unique_lock<std::mutex> l{mu_};
      parked_ = true;
      cv_.notify_all();
      cv_.wait(l, [&] { return release_; });
      parked_ = false;
      cv_.notify_all();
    });
    cv_.wait(g, [&] { return parked_; });
  }

  void open() {
    std::unique_lock<std::mutex> g{mu_};
    if (!closed_)
      return;
    closed_ = false;
    release_ = true;
    cv_.notify_all();
    cv_.wait(g, [&] { return !parked_; });
  }

private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false, release_ = false, parked_ = false;
};

// ---- what the test's own actors saw -----------------------------------------------

/// A request's answer: nothing yet, a value, or an error; and what was streamed.
template <class... Ts>
struct answer {
  bool done = false;
  std::optional<std::tuple<Ts...>> value;
  caf::error err;
  std::vector<output_chunk> chunks;

  [[nodiscard]] std::string streamed() const {
    std::string s;
    for (const auto& c : chunks)
      s += c.data;
    return s;
  }
};

/// What a listener (or a trainer) was told, in order.
struct heard {
  std::string tag;
  std::vector<std::string> ready;
  std::vector<error> failed;
  std::shared_ptr<std::vector<std::string>> order; ///< shared between listeners: "tag:ready"
};

std::string describe_caf(const caf::error& e) {
  return e ? describe(from_caf(e)) : std::string{"no error"};
}

/// The value of a one-type answer; the test fails if there is none.
template <class T>
T& value_of(answer<T>& a) {
  REQUIRE_MESSAGE(a.done, "no answer yet");
  REQUIRE_MESSAGE(a.value.has_value(), "an error instead of a value: " << describe_caf(a.err));
  return std::get<0>(*a.value);
}

/// The value of a keyed answer (an internal verb's reply: the key, then the value).
template <class T>
T& value_of(answer<internal_key, T>& a) {
  REQUIRE_MESSAGE(a.done, "no answer yet");
  REQUIRE_MESSAGE(a.value.has_value(), "an error instead of a value: " << describe_caf(a.err));
  return std::get<1>(*a.value);
}

/// Checks that `a` failed with `code`, its message naming `names`.
template <class... Ts>
void check_refused(const answer<Ts...>& a, errc code, std::string_view names) {
  REQUIRE_MESSAGE(a.done, "no answer yet");
  REQUIRE_MESSAGE(!a.value.has_value(), "a value instead of " << to_string(code));
  auto e = from_caf(a.err);
  CHECK_MESSAGE(e.code == code, "expected " << to_string(code) << ", got " << describe(e));
  CHECK_MESSAGE(e.message.find(names) != std::string::npos,
                "the message should name '" << std::string{names} << "': " << describe(e));
}

/// The pids of this process's children named dsec-init (the sandboxes' inits).
std::vector<pid_t> our_inits() {
  std::vector<pid_t> out;
  auto self = ::getpid();
  for (const auto& [pid, e] : process_table())
    if (e.ppid == self && e.comm == "dsec-init")
      out.push_back(pid);
  return out;
}

uint64_t layer_size(const std::string& ref) {
  auto st = store::open(actor_layers());
  REQUIRE(st);
  auto parsed = parse_layer_ref(ref);
  REQUIRE(parsed);
  auto info = st->find(*parsed);
  REQUIRE_MESSAGE(info, describe(info.error_value()));
  return info->size;
}

// ---- the world: engine, actors, and the test's hand on both -----------------------

struct world_options {
  uint32_t slots = 64;
  double oversubscribe = 1.0;
  uint32_t max_starting = 8;
  uint64_t cache_bytes = 0;
};

class world {
public:
  explicit world(world_options o = {}) {
    try {
      build(o);
    } catch (...) {
      teardown();
      throw;
    }
  }

  ~world() { teardown(); }

  world(const world&) = delete;
  world& operator=(const world&) = delete;

  caf::actor_system& sys() { return *sys_; }
  engine& eng() { return *eng_; }

private:
  void build(const world_options& o) {
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    sched_ = &dynamic_cast<stepper&>(sys_->scheduler());
    engine_options eo;
    eo.state_dir = actor_layers();
    eo.spawners = 1;
    eo.netns_prewarm = 2;
    auto e = engine::start(eo);
    REQUIRE_MESSAGE(e, "engine::start: " << describe(e.error_value()));
    eng_ = std::move(*e);
    auto sl = eng_->layers().system_layer();
    REQUIRE_MESSAGE(sl, describe(sl.error_value()));
    gate_.close(eng_->io());
    cache = spawn_layer_cache(*sys_, *eng_, o.cache_bytes, key);
    node_config nc;
    nc.name = "det";
    nc.slots = o.slots;
    nc.oversubscribe = o.oversubscribe;
    nc.max_starting = o.max_starting;
    nc.cache = cache;
    nc.eng = eng_.get();
    nc.trajectories = actor_layers() + "/trajectories";
    nc.key = key;
    node = spawn_node(*sys_, std::move(nc));
    scheduler_config sc;
    sc.node = node;
    sc.name = "det";
    sc.key = key;
    entry = spawn_scheduler(*sys_, std::move(sc));
    step();
    // The scheduler's own session, to end it at teardown whatever happens.
    auto def = now<session_actor>(entry, lookup_atom::value, std::string{"default"});
    known_.push_back(caf::actor_cast<caf::actor>(value_of(*def)));
  }

public:
  /// Handles every message queued now and every one they cause; nothing from
  /// the reactor thread, no timer. Returns how many jobs ran.
  size_t step() { return sched_->run(); }

  /// Advances the test clock by `d` (firing what falls due) and steps.
  void advance(caf::timespan d) {
    sched_->clock().advance_time(d);
    step();
  }

  /// Steps, letting the reactor thread deliver what the kernel reports, until
  /// `done` holds. Bounded (a generous cap against hanging, not a timing).
  bool settle_quietly(const std::function<bool()>& done, std::chrono::seconds cap = 60s) {
    auto deadline = std::chrono::steady_clock::now() + cap;
    for (int i = 0; i < 100'000; ++i) {
      step();
      if (done())
        return true;
      if (std::chrono::steady_clock::now() > deadline)
        return false;
      gate_.open();
      sched_->wait_foreign(20ms);
      gate_.close(eng_->io());
      sched_->admit();
    }
    return false;
  }

  void settle(const std::function<bool()>& done, const std::string& what) {
    REQUIRE_MESSAGE(settle_quietly(done), "never happened: " << what);
  }

  /// Sends a request from a fresh actor of the test's; the answer (and any
  /// output streamed to the requester) fills in as the world steps.
  template <class... Ts, class Dest, class... Xs>
  std::shared_ptr<answer<Ts...>> ask(const Dest& dest, Xs... xs) {
    auto a = std::make_shared<answer<Ts...>>();
    auto to = caf::actor_cast<caf::actor>(dest);
    auto asker = sys_->spawn([a, to, xs...](caf::event_based_actor* self) -> caf::behavior {
      self->request(to, caf::infinite, xs...)
        .then(
          [a, self](Ts&... ys) {
            a->value.emplace(std::move(ys)...);
            a->done = true;
            self->quit();
          },
          [a, self](caf::error& e) {
            a->err = std::move(e);
            a->done = true;
            self->quit();
          });
      return {[a](output_chunk& c) { a->chunks.push_back(std::move(c)); }};
    });
    known_.push_back(asker);
    return a;
  }

  /// ask(), then step: answers that need nothing from the kernel are there at
  /// once, deterministically (the test fails otherwise).
  template <class... Ts, class Dest, class... Xs>
  std::shared_ptr<answer<Ts...>> now(const Dest& dest, Xs... xs) {
    auto a = ask<Ts...>(dest, xs...);
    step();
    REQUIRE_MESSAGE(a->done, "no answer without the reactor");
    return a;
  }

  /// ask(), then settle until answered.
  template <class... Ts, class Dest, class... Xs>
  std::shared_ptr<answer<Ts...>> wait(const Dest& dest, Xs... xs) {
    auto a = ask<Ts...>(dest, xs...);
    settle([&] { return a->done; }, "an answer");
    return a;
  }

  /// An actor that records (ready, id) and (failed, error).
  caf::actor listener(const std::shared_ptr<heard>& h) {
    auto l = sys_->spawn([h](caf::event_based_actor*) -> caf::behavior {
      return {
        [h](ready_atom, const std::string& id) {
          h->ready.push_back(id);
          if (h->order)
            h->order->push_back(h->tag + ":ready");
        },
        [h](failed_atom, const caf::error& e) {
          h->failed.push_back(from_caf(e));
          if (h->order)
            h->order->push_back(h->tag + ":failed");
        },
      };
    });
    known_.push_back(l);
    return l;
  }

  /// Opens a session through the scheduler for `trainer` (null: nobody's).
  std::pair<session_actor, std::string> open(session_options o, caf::actor trainer = {}) {
    auto a = now<session_actor, std::string>(entry, open_atom::value, o, trainer);
    REQUIRE_MESSAGE(a->value, "open: " << describe_caf(a->err));
    auto [sess, id] = *a->value;
    known_.push_back(caf::actor_cast<caf::actor>(sess));
    return {sess, id};
  }

  /// Creates `n` sandboxes of `env` in `sess` and waits until all are ready.
  std::vector<std::string> make(const session_actor& sess, const environment& env, uint32_t n) {
    auto h = std::make_shared<heard>();
    auto c = ask<uint32_t>(sess, create_atom::value, env, n, listener(h));
    settle([&] { return c->done; }, "a batch of " + std::to_string(n));
    CHECK(value_of(*c) == n);
    REQUIRE_MESSAGE(h->failed.empty(),
                    "failed: " << (h->failed.empty() ? "" : describe(h->failed.front())));
    REQUIRE(h->ready.size() == n);
    return h->ready;
  }

  node_stats stats() { return value_of(*now<internal_key, node_stats>(node, stats_atom::value, key)); }

  std::vector<sandbox_info> node_list() {
    return value_of(*now<internal_key, std::vector<sandbox_info>>(node, list_atom::value, key));
  }

  /// The node's list as id -> state.
  std::map<std::string, std::string> states() {
    std::map<std::string, std::string> out;
    for (const auto& i : node_list())
      out[i.id] = i.state;
    return out;
  }

  sandbox_actor lookup(const std::string& id) {
    return value_of(*now<internal_key, sandbox_actor>(node, lookup_atom::value, key, id));
  }

  sandbox_info info(const sandbox_actor& sb) {
    return value_of(*now<sandbox_info>(sb, list_atom::value, key));
  }

  /// Ends the node actor (its scheduler's requests fail from now on); teardown
  /// then expects no answer from it.
  void kill_node() {
    caf::anon_send_exit(node, caf::exit_reason::kill);
    step();
    node_killed_ = true;
  }

  /// The member key of this world's actors (the test is one of dsec's own).
  internal_key key = internal_key::random();
  layer_cache_actor cache;
  node_actor node;
  scheduler_actor entry;

private:
  // Every sandbox destroyed, every actor ended, the engine stopped, the system
  // gone; in every outcome (no doctest assertion while an exception unwinds).
  void teardown() {
    if (!sys_)
      return;
    bool unwinding = std::uncaught_exceptions() > 0;
    auto complain = [&](const std::string& what) {
      if (unwinding)
        std::fprintf(stderr, "teardown: %s\n", what.c_str());
      else
        FAIL_CHECK("teardown: " << what);
    };
    if (eng_ && entry) {
      auto down = ask<uint32_t>(entry, shutdown_atom::value, process_key());
      if (!settle_quietly([&] { return down->done; }))
        complain("the node's shutdown never answered");
      else if (!down->value && !node_killed_)
        complain("the node's shutdown failed: " + describe_caf(down->err));
    }
    for (const auto& a : known_)
      caf::anon_send_exit(a, caf::exit_reason::kill);
    for (const caf::actor& a : {caf::actor_cast<caf::actor>(entry),
                                caf::actor_cast<caf::actor>(node),
                                caf::actor_cast<caf::actor>(cache)})
      if (a)
        caf::anon_send_exit(a, caf::exit_reason::kill);
    // What the kills set off (a sandbox whose session died) still reaps.
    bool ended = sched_ && eng_
                   ? settle_quietly([&] { return sys_->registry().running() == 0; }, 30s)
                   : sys_->registry().running() == 0;
    if (!ended) {
      complain(std::to_string(sys_->registry().running()) + " actors still running");
      sys_->await_actors_before_shutdown(false);
    }
    known_.clear();
    entry = nullptr;
    node = nullptr;
    cache = nullptr;
    gate_.open();
    eng_.reset();
    sys_.reset();
    auto left = our_inits();
    if (!left.empty())
      complain(std::to_string(left.size()) + " sandbox inits still running");
  }

  det_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  stepper* sched_ = nullptr;
  std::unique_ptr<engine> eng_;
  reactor_gate gate_;
  std::vector<caf::actor> known_; // the test's own actors and the sessions
  bool node_killed_ = false;
};

} // namespace

// ---- sandbox ----------------------------------------------------------------------

TEST_CASE("sandbox: creating, ready, running, ready, destroying, gone; each step when the test "
          "lets it happen") {
  auto before = settled_snapshot();
  {
    world w;
    auto [sess, sid] = w.open({.quota = 4, .default_ttl_ms = 3'600'000, .name = "det"});
    auto h = std::make_shared<heard>();
    auto created = w.ask<uint32_t>(sess, create_atom::value, env_of(), uint32_t{1}, w.listener(h));
    w.step();
    // Placed, spawned, layers acquired, init started: the rest is init's to
    // report, through the reactor, which is parked.
    CHECK_FALSE(created->done);
    CHECK(h->ready.empty());
    auto states = w.states();
    REQUIRE(states.size() == 1);
    auto id = states.begin()->first;
    CHECK(states.begin()->second == "creating");
    auto sb = w.lookup(id);
    auto i = w.info(sb);
    CHECK(i.state == "creating");
    CHECK(i.session == sid);
    CHECK(i.created_ms == 0);
    auto st = w.stats();
    CHECK(st.live == 1);
    CHECK(st.creating == 1);
    CHECK(st.created == 0);
    check_refused(*w.now<exec_result>(sb, exec_atom::value, w.key, cmd({"true"})),
                  errc::invalid_argument, "not ready");

    w.settle([&] { return created->done; }, "the sandbox is ready");
    CHECK(value_of(*created) == 1);
    CHECK(h->ready == std::vector<std::string>{id});
    CHECK(h->failed.empty());
    i = w.info(sb);
    CHECK(i.state == "ready");
    CHECK(i.running == 0);
    CHECK(i.created_ms > 0);
    st = w.stats();
    CHECK(st.creating == 0);
    CHECK(st.created == 1);

    // running while a command is in flight: its end is the reactor's to report
    auto ex = w.ask<exec_result>(sb, exec_atom::value, w.key,
                                 cmd({"sh", "-c", "echo out; echo err >&2; exit 3"}));
    w.step();
    CHECK_FALSE(ex->done);
    i = w.info(sb);
    CHECK(i.state == "running");
    CHECK(i.running == 1);
    w.settle([&] { return ex->done; }, "the command ends");
    auto& r = value_of(*ex);
    CHECK(r.out == "out\n");
    CHECK(r.err == "err\n");
    CHECK(r.exit_code == 3);
    CHECK(r.signal == 0);
    CHECK_FALSE(r.timed_out);
    i = w.info(sb);
    CHECK(i.state == "ready");
    CHECK(i.running == 0);

    // destroy: init is killed now; the reap waits for the reactor
    auto d = w.ask<bool>(sb, destroy_atom::value, w.key);
    w.step();
    CHECK_FALSE(d->done);
    CHECK(w.info(sb).state == "destroying");
    check_refused(*w.now<exec_result>(sb, exec_atom::value, w.key, cmd({"true"})), errc::not_found,
                  "being destroyed");
    w.settle([&] { return d->done; }, "the sandbox is destroyed");
    CHECK(value_of(*d));

    // Gone everywhere: the session (which says it ended), the scheduler (by
    // id), the node.
    check_refused(*w.now<exec_result>(sess, exec_atom::value, id, cmd({"true"})), errc::closed,
                  id);
    check_refused(*w.now<exec_result>(w.entry, exec_atom::value, id, cmd({"true"})),
                  errc::not_found, id);
    check_refused(*w.now<bool>(sess, destroy_atom::value, id), errc::closed, id);
    check_refused(*w.now<internal_key, sandbox_actor>(w.node, lookup_atom::value, w.key, id),
                  errc::not_found, id);
    // Its actor has ended: a request to the stale handle is CAF's failure.
    check_refused(*w.now<exec_result>(sb, exec_atom::value, w.key, cmd({"true"})), errc::disconnected,
                  "");
    CHECK(value_of(*w.now<std::vector<sandbox_info>>(sess, list_atom::value)).empty());
    st = w.stats();
    CHECK(st.live == 0);
    CHECK(st.created == 1);
    CHECK(st.destroyed == 1);
    CHECK(st.failed == 0);
    CHECK(our_inits().empty());
    CHECK(h->ready.size() == 1); // told once
  }
  check_nothing_left(before);
}

TEST_CASE("sandbox: an exec's timeout fires on the test clock: the command is killed and "
          "reported timed_out") {
  auto before = settled_snapshot();
  {
    world w;
    auto [sess, sid] = w.open({});
    auto id = w.make(sess, env_of(), 1).front();
    auto sb = w.lookup(id);

    // Streamed, so that the test sees the command run before time moves.
    auto req = cmd({"sh", "-c", "echo before; exec sleep 1000"});
    req.timeout_ms = 30'000;
    req.stream = true;
    auto ex = w.ask<exec_result>(sb, exec_atom::value, w.key, req);
    w.settle([&] { return ex->streamed() == "before\n"; }, "the command runs");
    CHECK(w.info(sb).state == "running");

    w.advance(29'999ms); // not yet due
    CHECK_FALSE(ex->done);
    CHECK(w.info(sb).running == 1);
    w.advance(1ms); // due: killed now, its end reported through the reactor
    w.settle([&] { return ex->done; }, "the timed-out command ends");
    auto& r = value_of(*ex);
    CHECK(r.timed_out);
    CHECK(r.signal == SIGKILL);
    CHECK(r.out.empty()); // streamed, not collected
    CHECK(ex->streamed() == "before\n");
    auto i = w.info(sb);
    CHECK(i.state == "ready");
    CHECK(i.running == 0);

    // One that ends by itself is not marked, and its stale timer does nothing.
    auto quick = cmd({"echo", "quick"});
    quick.timeout_ms = 30'000;
    auto q = w.wait<exec_result>(sb, exec_atom::value, w.key, quick);
    CHECK(value_of(*q).out == "quick\n");
    CHECK_FALSE(value_of(*q).timed_out);
    w.advance(30'000ms);
    CHECK(w.info(sb).state == "ready");
    auto again = w.wait<exec_result>(sb, exec_atom::value, w.key, cmd({"echo", "still-here"}));
    CHECK(value_of(*again).out == "still-here\n");
    CHECK(w.stats().live == 1);
  }
  check_nothing_left(before);
}

TEST_CASE("sandbox: the TTL is a timer on the test clock; advancing past it destroys the "
          "sandbox") {
  auto before = settled_snapshot();
  {
    world w;
    auto [sess, sid] = w.open({.quota = 4, .default_ttl_ms = 3'600'000, .name = "ttl"});
    auto keep = w.make(sess, env_of(), 1).front(); // the session's default: an hour
    auto env = env_of();
    env.ttl_ms = 600'000; // ten minutes
    auto brief = w.make(sess, env, 1).front();
    CHECK(w.info(w.lookup(brief)).ttl_left_ms <= 600'000);

    w.advance(599'999ms);
    auto states = w.states();
    CHECK(states.size() == 2);
    CHECK(states[brief] == "ready");

    w.advance(1ms); // brief's TTL: killed now, reaped through the reactor
    CHECK(w.states()[brief] == "destroying");
    CHECK(w.states()[keep] == "ready");
    w.settle([&] { return w.stats().destroyed == 1; }, "the brief sandbox is destroyed");
    CHECK(w.states() == std::map<std::string, std::string>{{keep, "ready"}});
    check_refused(*w.now<exec_result>(sess, exec_atom::value, brief, cmd({"true"})),
                  errc::closed, "reached its TTL");
    auto alive = w.wait<exec_result>(sess, exec_atom::value, keep, cmd({"echo", "alive"}));
    CHECK(value_of(*alive).out == "alive\n");

    // The rest of the hour: the other one goes too, the session stays.
    w.advance(3'600'000ms - 600'000ms - 1ms);
    CHECK(w.states().size() == 1);
    w.advance(1ms);
    w.settle([&] { return w.stats().destroyed == 2; }, "the hour-long sandbox is destroyed");
    CHECK(w.node_list().empty());
    CHECK(value_of(*w.now<std::vector<sandbox_info>>(sess, list_atom::value)).empty());
    auto found = w.now<session_actor>(w.entry, lookup_atom::value, sid);
    CHECK(found->value.has_value());
  }
  check_nothing_left(before);
}

TEST_CASE("sandbox: its init dying ends it and fails the command in flight") {
  auto before = settled_snapshot();
  {
    world w;
    auto [sess, sid] = w.open({});
    auto id = w.make(sess, env_of(), 1).front();
    auto sb = w.lookup(id);
    auto req = cmd({"sh", "-c", "echo up; exec sleep 1000"});
    req.stream = true;
    auto ex = w.ask<exec_result>(sb, exec_atom::value, w.key, req);
    w.settle([&] { return ex->streamed() == "up\n"; }, "the command runs");
    auto inits = our_inits();
    REQUIRE(inits.size() == 1);
    REQUIRE(::kill(inits.front(), SIGKILL) == 0);

    w.settle([&] { return ex->done; }, "the command in flight is answered");
    check_refused(*ex, errc::sandbox_failed, id);
    w.settle([&] { return w.stats().live == 0; }, "the node forgets the sandbox");
    auto st = w.stats();
    CHECK(st.destroyed == 1);
    CHECK(st.failed == 0);
    check_refused(*w.now<exec_result>(sess, exec_atom::value, id, cmd({"true"})), errc::closed,
                  "ended on its own");
    // The session still serves.
    auto next = w.make(sess, env_of(), 1).front();
    auto r = w.wait<exec_result>(sess, exec_atom::value, next, cmd({"hostname"}));
    CHECK(value_of(*r).out == next + "\n");
  }
  check_nothing_left(before);
}

// ---- session ----------------------------------------------------------------------

TEST_CASE("session: its quota counts live and coming sandboxes and refuses a batch beyond it") {
  world w;
  auto [sess, sid] = w.open({.quota = 3, .default_ttl_ms = 3'600'000, .name = "small"});
  auto h = std::make_shared<heard>();
  auto l = w.listener(h);
  check_refused(*w.now<uint32_t>(sess, create_atom::value, env_of(), uint32_t{4}, l),
                errc::invalid_argument, "never fit its quota of 3");
  CHECK(w.stats().live == 0); // nothing of it was placed
  CHECK(h->ready.empty());
  CHECK(h->failed.empty()); // a refused batch is refused as a whole

  auto two = w.ask<uint32_t>(sess, create_atom::value, env_of(), uint32_t{2}, l);
  w.step();
  CHECK_FALSE(two->done); // coming, not live
  check_refused(*w.now<uint32_t>(sess, create_atom::value, env_of(), uint32_t{2}, l),
                errc::overloaded, "2 sandboxes live or coming");
  auto one = w.ask<uint32_t>(sess, create_atom::value, env_of(), uint32_t{1}, l);
  w.settle([&] { return two->done && one->done; }, "both batches are ready");
  CHECK(value_of(*two) == 2);
  CHECK(value_of(*one) == 1);
  CHECK(h->ready.size() == 3);
  check_refused(*w.now<uint32_t>(sess, create_atom::value, env_of(), uint32_t{1}, l),
                errc::overloaded, sid);

  auto d = w.wait<bool>(sess, destroy_atom::value, h->ready.front());
  CHECK(value_of(*d));
  auto more = w.wait<uint32_t>(sess, create_atom::value, env_of(), uint32_t{1}, l);
  CHECK(value_of(*more) == 1);
  CHECK(h->ready.size() == 4);
  CHECK(h->failed.empty());
  CHECK(w.stats().live == 3);
}

TEST_CASE("session: a batch partly refused by the node reports each sandbox exactly once and "
          "replies the created count") {
  world w({.slots = 3});
  auto [sess, sid] = w.open({});
  auto h = std::make_shared<heard>();
  h->order = std::make_shared<std::vector<std::string>>();
  h->tag = "a";
  auto c = w.ask<uint32_t>(sess, create_atom::value, env_of(), uint32_t{5}, w.listener(h));
  w.step();
  // The node refused two at once; three are being created.
  CHECK_FALSE(c->done);
  CHECK(h->ready.empty());
  REQUIRE(h->failed.size() == 2);
  for (const auto& e : h->failed) {
    CHECK_MESSAGE(e.code == errc::overloaded, describe(e));
    CHECK_MESSAGE(e.message.find("full") != std::string::npos, describe(e));
  }
  auto st = w.stats();
  CHECK(st.live == 3);
  CHECK(st.creating == 3);
  CHECK(st.failed == 2);

  w.settle([&] { return c->done; }, "the batch is done");
  CHECK(value_of(*c) == 3);
  CHECK(h->ready.size() == 3);
  CHECK(h->failed.size() == 2);
  CHECK(std::set<std::string>(h->ready.begin(), h->ready.end()).size() == 3);
  std::set<std::string> live;
  for (const auto& [id, state] : w.states()) {
    live.insert(id);
    CHECK(state == "ready");
  }
  CHECK(live == std::set<std::string>(h->ready.begin(), h->ready.end()));
  CHECK(*h->order == std::vector<std::string>{"a:failed", "a:failed", "a:ready", "a:ready",
                                              "a:ready"});

  // A full node refuses a whole batch sandbox by sandbox: each failed once, 0 created.
  auto h2 = std::make_shared<heard>();
  auto c2 = w.now<uint32_t>(sess, create_atom::value, env_of(), uint32_t{2}, w.listener(h2));
  CHECK(value_of(*c2) == 0);
  CHECK(h2->ready.empty());
  CHECK(h2->failed.size() == 2);
  // So does a layer that does not exist (each sandbox fails in the cache).
  auto bad = env_of({}, {"nosuch@1"});
  auto d = w.wait<bool>(sess, destroy_atom::value, h->ready.front());
  CHECK(value_of(*d));
  auto h3 = std::make_shared<heard>();
  auto c3 = w.now<uint32_t>(sess, create_atom::value, bad, uint32_t{1}, w.listener(h3));
  CHECK(value_of(*c3) == 0);
  REQUIRE(h3->failed.size() == 1);
  CHECK_MESSAGE(h3->failed.front().code == errc::not_found, describe(h3->failed.front()));
  CHECK(h3->failed.front().message.find("nosuch@1") != std::string::npos);

  // Nothing more is told to anyone, whatever else happens.
  auto closed = w.wait<uint32_t>(sess, close_atom::value);
  CHECK(value_of(*closed) == 2);
  w.settle([&] { return w.stats().live == 0; }, "all destroyed");
  CHECK(h->ready.size() == 3);
  CHECK(h->failed.size() == 2);
  CHECK(h2->failed.size() == 2);
  CHECK(h3->failed.size() == 1);
  st = w.stats();
  CHECK(st.created == 3);
  CHECK(st.destroyed == 3);
  CHECK(st.failed == 2 + 2 + 1);
}

TEST_CASE("session: close destroys all of its sandboxes and only its own, then the session ends") {
  world w;
  auto [s1, id1] = w.open({});
  auto [s2, id2] = w.open({});
  auto mine = w.make(s1, env_of(), 3);
  auto other = w.make(s2, env_of(), 1).front();
  CHECK(w.stats().live == 4);

  auto closed = w.ask<uint32_t>(s1, close_atom::value);
  w.step();
  CHECK_FALSE(closed->done); // killed, not yet reaped
  auto states = w.states();
  for (const auto& id : mine)
    CHECK(states[id] == "destroying");
  CHECK(states[other] == "ready");
  w.settle([&] { return closed->done; }, "the session is closed");
  CHECK(value_of(*closed) == 3);
  CHECK(w.states() == std::map<std::string, std::string>{{other, "ready"}});
  // Once close() has answered, the scheduler no longer knows the session and
  // the session's actor is gone.
  check_refused(*w.now<session_actor>(w.entry, lookup_atom::value, id1), errc::not_found, id1);
  check_refused(*w.now<uint32_t>(s1, create_atom::value, env_of(), uint32_t{1}, caf::actor{}),
                errc::disconnected, "");
  for (const auto& id : mine)
    check_refused(*w.now<exec_result>(w.entry, exec_atom::value, id, cmd({"true"})),
                  errc::not_found, id);
  auto r = w.wait<exec_result>(s2, exec_atom::value, other, cmd({"echo", "other"}));
  CHECK(value_of(*r).out == "other\n");
  auto st = w.stats();
  CHECK(st.destroyed == 3);
  auto sst = value_of(*w.now<node_stats>(w.entry, stats_atom::value));
  CHECK(sst.sessions == 2); // default and s2
}

TEST_CASE("session: its trainer going down closes it; a session nobody owns stays") {
  world w;
  auto trainer = w.listener(std::make_shared<heard>());
  auto [owned, owned_id] = w.open({}, trainer);
  auto [loose, loose_id] = w.open({});
  auto doomed = w.make(owned, env_of(), 2);
  auto kept = w.make(loose, env_of(), 1).front();

  caf::anon_send_exit(trainer, caf::exit_reason::kill);
  w.step(); // the session learns it, destroys its sandboxes: killed, reaps pending
  auto states = w.states();
  for (const auto& id : doomed)
    CHECK(states[id] == "destroying");
  CHECK(states[kept] == "ready");
  w.settle(
    [&] {
      auto f = w.ask<session_actor>(w.entry, lookup_atom::value, owned_id);
      w.step();
      return f->done && !f->value;
    },
    "the owned session ends");
  CHECK(w.states() == std::map<std::string, std::string>{{kept, "ready"}});
  CHECK(w.stats().destroyed == 2);
  auto r = w.wait<exec_result>(loose, exec_atom::value, kept, cmd({"echo", "kept"}));
  CHECK(value_of(*r).out == "kept\n");
  CHECK(w.now<session_actor>(w.entry, lookup_atom::value, loose_id)->value.has_value());
}

// ---- node -------------------------------------------------------------------------

TEST_CASE("node: admits slots x oversubscribe, fails the rest as overloaded, and counts") {
  world w({.slots = 2, .oversubscribe = 1.5});
  auto st = w.stats();
  CHECK(st.node == "det");
  CHECK(st.slots == 3);
  CHECK(st.live == 0);

  auto [sess, sid] = w.open({});
  auto h = std::make_shared<heard>();
  auto c = w.ask<uint32_t>(sess, create_atom::value, env_of(), uint32_t{4}, w.listener(h));
  w.step();
  st = w.stats();
  CHECK(st.live == 3);
  CHECK(st.creating == 3);
  CHECK(st.created == 0);
  CHECK(st.failed == 1);
  w.settle([&] { return c->done; }, "the batch is done");
  CHECK(value_of(*c) == 3);
  st = w.stats();
  CHECK(st.live == 3);
  CHECK(st.creating == 0);
  CHECK(st.created == 3);
  CHECK(st.failed == 1);
  CHECK(st.destroyed == 0);
  CHECK(st.layers_mounted == 1); // the base, once for all three
  CHECK(st.layer_bytes == layer_size(tar_base));

  // A destroyed one frees its slot, once.
  CHECK(value_of(*w.wait<bool>(sess, destroy_atom::value, h->ready.front())));
  st = w.stats();
  CHECK(st.live == 2);
  CHECK(st.destroyed == 1);
  auto c2 = w.ask<uint32_t>(sess, create_atom::value, env_of(), uint32_t{2}, w.listener(h));
  w.settle([&] { return c2->done; }, "the second batch is done");
  CHECK(value_of(*c2) == 1);
  st = w.stats();
  CHECK(st.live == 3);
  CHECK(st.created == 4);
  CHECK(st.failed == 2);
  CHECK(h->ready.size() == 4);
  CHECK(h->failed.size() == 2);
}

TEST_CASE("node: at most max_starting are created at once; the queue is served in order") {
  world w({.max_starting = 1});
  auto [sess, sid] = w.open({});
  auto order = std::make_shared<std::vector<std::string>>();
  auto ha = std::make_shared<heard>();
  ha->tag = "A";
  ha->order = order;
  auto hb = std::make_shared<heard>();
  hb->tag = "B";
  hb->order = order;
  auto a = w.ask<uint32_t>(sess, create_atom::value, env_of(), uint32_t{2}, w.listener(ha));
  auto b = w.ask<uint32_t>(sess, create_atom::value, env_of(), uint32_t{2}, w.listener(hb));
  w.step();
  auto count = [](const std::map<std::string, std::string>& m, const std::string& state) {
    return std::count_if(m.begin(), m.end(), [&](const auto& kv) { return kv.second == state; });
  };
  auto states = w.states();
  CHECK(states.size() == 4);
  CHECK(count(states, "creating") == 1);
  CHECK(count(states, "queued") == 3);
  CHECK(w.stats().creating == 4);

  for (size_t k = 1; k <= 4; ++k) {
    w.settle([&] { return order->size() >= k; }, "sandbox " + std::to_string(k) + " is ready");
    CHECK(order->size() == k); // one at a time
    states = w.states();
    CHECK(count(states, "ready") == static_cast<long>(k));
    CHECK(count(states, "creating") == (k < 4 ? 1 : 0));
    CHECK(count(states, "queued") == static_cast<long>(k < 4 ? 3 - k : 0));
  }
  CHECK(*order == std::vector<std::string>{"A:ready", "A:ready", "B:ready", "B:ready"});
  w.step();
  REQUIRE(a->done);
  REQUIRE(b->done);
  CHECK(value_of(*a) == 2);
  CHECK(value_of(*b) == 2);
  auto st = w.stats();
  CHECK(st.creating == 0);
  CHECK(st.created == 4);
}

// ---- layer_cache ------------------------------------------------------------------

TEST_CASE("layer_cache: a layer is leased while in use (refcounted), released after its last "
          "user") {
  auto& fx = suite::get();
  actor_layers();
  fx.build_layer("tool", "detrm@1", fx.make_tree("detrm", {{"opt/detrm/marker", "rm me\n"}}));
  auto st = store::open(fx.state());
  REQUIRE(st);
  auto ref = parse_layer_ref("detrm@1");
  REQUIRE(ref);
  world w;
  auto stats = [&] {
    auto a = w.now<uint32_t, uint64_t, uint64_t, uint64_t>(w.cache, stats_atom::value, process_key());
    REQUIRE(a->value);
    return *a->value;
  };
  auto env = env_of({}, {"detrm@1"});

  auto l1 = value_of(*w.now<internal_key, layer_set>(w.cache, acquire_atom::value, process_key(), env));
  CHECK(l1.lease != 0);
  CHECK(l1.fds.size() == 3); // the system layer, the tool, the base (topmost first)
  auto s = stats();
  CHECK(std::get<0>(s) == 2); // the system layer is not the cache's to count
  CHECK(std::get<1>(s) == layer_size(tar_base) + layer_size("detrm@1"));
  CHECK(std::get<2>(s) == 0);
  auto l2 = value_of(*w.now<internal_key, layer_set>(w.cache, acquire_atom::value, process_key(), env));
  CHECK(l2.lease != l1.lease);
  CHECK(l2.fds == l1.fds); // the same mounts
  CHECK(std::get<0>(stats()) == 2);
  check_error(st->remove(*ref), errc::in_use, "detrm@1");

  caf::anon_send(w.cache, release_atom::value, process_key(), l1.lease);
  w.step();
  check_error(st->remove(*ref), errc::in_use, "detrm@1"); // l2 still uses it
  caf::anon_send(w.cache, release_atom::value, process_key(), l1.lease); // twice: nothing more
  caf::anon_send(w.cache, release_atom::value, process_key(), uint64_t{999'999}); // unknown: nothing
  w.step();
  check_error(st->remove(*ref), errc::in_use, "detrm@1");
  caf::anon_send(w.cache, release_atom::value, process_key(), l2.lease);
  w.step();
  auto removed = st->remove(*ref);
  CHECK_MESSAGE(removed, describe(removed.error_value()));
  // Unused mounts stay cached (no budget): asking again checks the ref.
  CHECK(std::get<0>(stats()) == 2);
  check_refused(*w.now<internal_key, layer_set>(w.cache, acquire_atom::value, process_key(), env), errc::not_found, "detrm@1");

  // A wrong kind is refused and leaves no lease behind.
  fx.build_layer("tool", "detwk@1", fx.make_tree("detwk", {{"opt/detwk/marker", "wk\n"}}));
  auto bad = env_of();
  bad.base = "detwk@1";
  check_refused(*w.now<internal_key, layer_set>(w.cache, acquire_atom::value, process_key(), bad), errc::wrong_kind, "detwk@1");
  auto wk = parse_layer_ref("detwk@1");
  REQUIRE(wk);
  auto freed = st->remove(*wk);
  CHECK_MESSAGE(freed, describe(freed.error_value()));

  // A sandbox leases its layers until it is destroyed.
  fx.build_layer("tool", "detsb@1", fx.make_tree("detsb", {{"opt/detsb/marker", "sb\n"}}));
  auto sbref = parse_layer_ref("detsb@1");
  REQUIRE(sbref);
  auto [sess, sid] = w.open({});
  auto id = w.make(sess, env_of({}, {"detsb@1"}), 1).front();
  auto cat = w.wait<exec_result>(sess, exec_atom::value, id, cmd({"cat", "/opt/detsb/marker"}));
  CHECK(value_of(*cat).out == "sb\n");
  check_error(st->remove(*sbref), errc::in_use, "detsb@1");
  CHECK(value_of(*w.wait<bool>(sess, destroy_atom::value, id)));
  auto gone = st->remove(*sbref);
  CHECK_MESSAGE(gone, describe(gone.error_value()));
}

TEST_CASE("layer_cache: over its byte budget it evicts unused mounts, least recently used first") {
  auto& fx = suite::get();
  actor_layers();
  // Tools of distinct sizes, so that the mounted bytes say which are mounted.
  auto tree = [&](const std::string& name, size_t bytes) {
    std::string data(bytes, '\0');
    std::mt19937 rng(static_cast<unsigned>(bytes));
    for (auto& ch : data)
      ch = static_cast<char>(rng());
    fx.build_layer("tool", name + "@1", fx.make_tree(name, {{"opt/" + name + "/blob", data}}));
    return layer_size(name + "@1");
  };
  uint64_t base = layer_size(tar_base);
  uint64_t p = tree("lrup", 4 << 10), q = tree("lruq", 48 << 10), r = tree("lrur", 320 << 10),
           s = tree("lrus", 160 << 10);
  // What the scenario below relies on.
  REQUIRE(s > p + q);
  REQUIRE(s <= p + r);
  uint64_t budget = base + p + q + r;
  world w({.cache_bytes = budget});
  struct cache_stats {
    uint32_t mounted;
    uint64_t bytes, budget, evicted;
  };
  auto stats = [&] {
    auto a = w.now<uint32_t, uint64_t, uint64_t, uint64_t>(w.cache, stats_atom::value, process_key());
    REQUIRE(a->value);
    auto [n, b, bu, e] = *a->value;
    return cache_stats{n, b, bu, e};
  };
  auto acquire = [&](const std::string& tool) {
    return value_of(*w.now<internal_key, layer_set>(w.cache, acquire_atom::value, process_key(), env_of({}, {tool})));
  };
  auto release = [&](const layer_set& ls) {
    caf::anon_send(w.cache, release_atom::value, process_key(), ls.lease);
    w.step();
  };

  auto lp = acquire("lrup@1"), lq = acquire("lruq@1"), lr = acquire("lrur@1");
  auto c = stats();
  CHECK(c.mounted == 4);
  CHECK(c.bytes == budget); // exactly full: nothing to evict
  CHECK(c.budget == budget);
  CHECK(c.evicted == 0);
  release(lp);
  release(lq);
  release(lr);
  CHECK(stats().evicted == 0);
  release(acquire("lruq@1")); // q used again: least recent now p, then r, then q

  auto ls = acquire("lrus@1"); // over budget by s: p goes, then r (s > p), then it fits
  c = stats();
  CHECK(c.evicted == 2);
  CHECK(c.mounted == 3);
  CHECK(c.bytes == base + q + s);

  // What is in use is never evicted, even over the budget.
  auto lr2 = acquire("lrur@1"); // r again: q (unused) goes, the rest is in use
  c = stats();
  CHECK(c.evicted == 3);
  CHECK(c.mounted == 3);
  CHECK(c.bytes == base + s + r);
  CHECK(c.bytes > budget);
  release(ls); // s unused now: it goes
  c = stats();
  CHECK(c.evicted == 4);
  CHECK(c.mounted == 2);
  CHECK(c.bytes == base + r);
  release(lr2); // within the budget: the unused base and r stay cached
  c = stats();
  CHECK(c.evicted == 4);
  CHECK(c.mounted == 2);
  // Mounted again when asked again.
  auto again = acquire("lrup@1");
  CHECK(again.fds.size() == 3);
  CHECK(stats().bytes == base + r + p);
  release(again);
}


TEST_CASE("session: closed while its batch is still being created, every sandbox still ends and "
          "each answer comes once") {
  world w({.max_starting = 1});
  auto [sess, sid] = w.open({});
  auto h = std::make_shared<heard>();
  auto c = w.ask<uint32_t>(sess, create_atom::value, env_of(), uint32_t{3}, w.listener(h));
  w.step();
  auto states = w.states();
  REQUIRE(states.size() == 3); // one creating, two queued on the node
  auto closed = w.ask<uint32_t>(sess, close_atom::value);
  w.step();
  CHECK_FALSE(closed->done); // the session waits for the ones on their way
  w.settle([&] { return closed->done && c->done; }, "the batch and the close are answered");
  // close counts every sandbox it took down, the late ones too; the batch
  // made none that anyone can use, and its listener hears a failure for each.
  REQUIRE(closed->value.has_value());
  CHECK(std::get<0>(*closed->value) == 3);
  REQUIRE(c->value.has_value());
  CHECK(std::get<0>(*c->value) == 0);
  CHECK(h->ready.empty());
  CHECK(h->failed.size() == 3); // each told once
  w.settle([&] { return w.stats().live == 0; }, "every sandbox is destroyed");
  auto st = w.stats();
  CHECK(st.creating == 0);
  CHECK(st.destroyed + st.failed == 3);
  check_refused(*w.now<session_actor>(w.entry, lookup_atom::value, sid), errc::not_found, sid);
  CHECK(our_inits().empty());
}

// ---- once bugs: a sandbox destroyed while being created, a failed placement ----------

TEST_CASE("a sandbox destroyed while it is being created is reported to its session as failed, "
          "so the batch and the session end") {
  world w;
  auto [sess, sid] = w.open({});
  auto h = std::make_shared<heard>();
  auto c = w.ask<uint32_t>(sess, create_atom::value, env_of(), uint32_t{1}, w.listener(h));
  w.step();
  REQUIRE(w.states().size() == 1); // creating
  // The node shuts down (dsecd stopping) during the batch; `dsec rm ID` does the same.
  auto down = w.wait<uint32_t>(w.node, shutdown_atom::value, process_key());
  CHECK(value_of(*down) == 1);
  w.settle_quietly([&] { return c->done; }, 5s);
  CHECK(c->done);                  // the batch should answer (0 created) ...
  CHECK(h->failed.size() == 1);    // ... and its listener hear the failure
  auto closed = w.ask<uint32_t>(sess, close_atom::value);
  w.settle_quietly([&] { return closed->done; }, 5s);
  CHECK(closed->done);             // the session should be able to end
}

TEST_CASE("when placing a batch fails, its listener hears one failure for each of its "
          "sandboxes") {
  world w;
  auto [sess, sid] = w.open({});
  w.kill_node();
  auto h = std::make_shared<heard>();
  auto c = w.now<uint32_t>(sess, create_atom::value, env_of(), uint32_t{3}, w.listener(h));
  CHECK(value_of(*c) == 0);
  CHECK(h->failed.size() == 3); // one (failed, error) per sandbox, as the interface says
}

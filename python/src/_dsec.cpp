// _dsec: the C++ half of the Python trainer SDK (python/dsec), over dsec::client.
//
// The Python package (dsec/__init__.py) is the public API; this module is its
// engine. One `core` per connection owns the CAF actor system, the dsec::client
// and every object that holds CAF handles (sessions, event streams), so that
// closing the connection can tear them down in the right order whatever Python
// still references.
//
// Threads and the GIL:
// - Blocking calls release the GIL while they wait, in slices of 100 ms between
//   which they check for signals (Ctrl-C raises KeyboardInterrupt; the call
//   itself then finishes in the background).
// - Every call, blocking or not, is made with the client's asynchronous API: a
//   small event-based actor per call, no thread. Asynchronous calls take a
//   Python callable `done(value, exc)` that runs on one of CAF's threads with
//   the GIL held; dsec/__init__.py passes one that hands the outcome to an
//   asyncio loop with call_soon_threadsafe.
// - close() (also run at interpreter exit by the package, and by the core's
//   destructor) refuses new calls, drops event streams and sessions, destroys
//   the client (calls in flight then complete with `disconnected`), waits for
//   every completion to have run, and only then destroys the actor system. So
//   no callback reaches Python after close() returned.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "actors/client.hpp"
#include "runtime/chronus.hpp"
#include "runtime/endpoint.hpp"
#include "runtime/error.hpp"
#include "runtime/units.hpp"

namespace py = pybind11;
using namespace std::chrono_literals;

namespace dsec::python {
namespace {

// ---- the interpreter ------------------------------------------------------------------

// True while Python code may run: not before initialisation, not while the
// interpreter is being torn down (a thread that takes the GIL then is killed).
bool python_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() != 0 && Py_IsFinalizing() == 0;
#else
  return Py_IsInitialized() != 0 && _Py_IsFinalizing() == 0;
#endif
}

// Set on CAF's threads while they run one of our completions: a core must not
// be destroyed there (it would wait for the very thread destroying it).
thread_local bool t_in_completion = false;

// A Python object owned by C++ code that may drop it on any thread.
struct py_ref {
  py::object obj;
  explicit py_ref(py::object o) : obj(std::move(o)) {}
  ~py_ref() { drop(); }
  py_ref(const py_ref&) = delete;
  py_ref& operator=(const py_ref&) = delete;
  void drop() {
    if (!obj)
      return;
    if (!python_alive()) {
      obj.release(); // leaked on purpose: nobody may touch Python any more
      return;
    }
    py::gil_scoped_acquire gil;
    obj = py::object{};
  }
};

// ---- errors -----------------------------------------------------------------------------

// dsec.errors.from_native, installed by dsec/__init__.py: builds the exception
// for a dsec::error. Leaked on purpose: it must outlive every thread.
py::object* g_error_factory = nullptr;

py::object make_py_error(const error& e) {
  if (g_error_factory && *g_error_factory)
    return (*g_error_factory)(static_cast<int>(e.code), to_string(e.code), e.message, e.step,
                              e.path, e.sys_errno);
  return py::reinterpret_steal<py::object>(
    PyObject_CallFunction(PyExc_RuntimeError, "s", (std::string{to_string(e.code)} + ": "
                                                    + e.message).c_str()));
}

// Thrown by blocking calls; translated into the dsec.Error subclass.
struct native_error {
  error err;
};

[[noreturn]] void raise(error e) {
  throw native_error{std::move(e)};
}

template <class T>
T value_or_raise(expected<T> r) {
  if (!r)
    raise(std::move(r).error_value());
  return std::move(*r);
}

// ---- calls in flight --------------------------------------------------------------------

// Counts the calls whose completion has not run yet.
struct gate {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t inflight = 0;

  void enter() {
    std::lock_guard<std::mutex> g{mu};
    ++inflight;
  }
  void leave() {
    {
      std::lock_guard<std::mutex> g{mu};
      --inflight;
    }
    cv.notify_all();
  }
  void wait_idle() {
    std::unique_lock<std::mutex> lk{mu};
    cv.wait(lk, [&] { return inflight == 0; });
  }
};

// One call in flight; leaves the gate when it is destroyed or released.
class op_token {
public:
  explicit op_token(std::shared_ptr<gate> g) : g_(std::move(g)) { g_->enter(); }
  ~op_token() { release(); }
  op_token(const op_token&) = delete;
  op_token& operator=(const op_token&) = delete;
  void release() {
    if (auto g = std::exchange(g_, nullptr))
      g->leave();
  }

private:
  std::shared_ptr<gate> g_;
};

// Waits for `ready()` with the GIL released, in slices, checking for signals
// in between (a KeyboardInterrupt leaves the call to finish on its own).
template <class Ready>
void wait_interruptibly(Ready&& ready) {
  for (;;) {
    bool done;
    {
      py::gil_scoped_release nogil;
      done = ready(100ms);
    }
    if (done)
      return;
    if (PyErr_CheckSignals() != 0)
      throw py::error_already_set();
  }
}

// A completion for a blocking call: it fills the waiter (no Python involved).
template <class T>
completion<T> to_waiter(const waiter<T>& w, std::shared_ptr<op_token> tok) {
  return [done = w.done(), tok](expected<T> r) {
    done(std::move(r));
    tok->release();
  };
}

// Waits for a blocking call's outcome (see wait_interruptibly).
template <class T>
expected<T> await_outcome(waiter<T>& w) {
  wait_interruptibly([&](std::chrono::milliseconds d) { return w.wait_for(d); });
  return w.get();
}

// A completion for an asynchronous call: on a CAF thread, with the GIL, it
// calls done(convert(value), None) or done(None, exception).
template <class T, class Convert>
completion<T> to_python(py::object done, std::shared_ptr<op_token> tok, Convert convert) {
  auto ref = std::make_shared<py_ref>(std::move(done));
  return [ref, tok, convert](expected<T> r) mutable {
    if (python_alive()) {
      t_in_completion = true;
      {
        py::gil_scoped_acquire gil;
        try {
          if (!r)
            ref->obj(py::none(), make_py_error(r.error_value()));
          else if constexpr (std::is_void_v<T>)
            ref->obj(py::none(), py::none());
          else
            ref->obj(convert(std::move(*r)), py::none());
        } catch (py::error_already_set& e) {
          e.discard_as_unraisable("dsec: the completion of an asynchronous call");
        }
        ref->obj = py::object{};
      }
      t_in_completion = false;
    }
    tok->release();
  };
}

struct identity {
  template <class X>
  py::object operator()(X&& x) const {
    return py::cast(std::forward<X>(x));
  }
};
struct to_bytes {
  py::object operator()(std::string&& s) const { return py::bytes(s); }
};

// ---- the connection ---------------------------------------------------------------------

struct core_state {
  std::unique_ptr<caf::actor_system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<client> cl;
  std::shared_ptr<gate> g = std::make_shared<gate>();

  std::shared_mutex start_mu; // shared: a call being started; exclusive: close
  bool closed = false;
  std::mutex close_mu;        // one close at a time

  std::mutex reg_mu;          // the registries below
  std::map<uint64_t, std::shared_ptr<session>> sessions;
  std::map<uint64_t, std::shared_ptr<event_stream>> streams;
  std::map<uint64_t, std::shared_ptr<process>> processes;
  uint64_t next_key = 1;

  std::string where;

  // Everything, in order; idempotent. Call without the GIL.
  void close() {
    std::lock_guard<std::mutex> once{close_mu};
    std::map<uint64_t, std::shared_ptr<session>> ss;
    std::map<uint64_t, std::shared_ptr<event_stream>> es;
    std::map<uint64_t, std::shared_ptr<process>> ps;
    {
      std::unique_lock<std::shared_mutex> lk{start_mu};
      if (closed)
        return;
      closed = true;
    }
    {
      std::lock_guard<std::mutex> g{reg_mu};
      ss.swap(sessions);
      es.swap(streams);
      ps.swap(processes);
    }
    es.clear(); // their helpers quit
    ps.clear(); // (their commands' ends come with the client's)
    ss.clear();
    cl.reset(); // owned sessions end on the daemon; calls in flight fail
    g->wait_idle();
    sys.reset(); // waits for the helpers' last messages, joins CAF's threads
    cfg.reset();
  }
};

// A started call: holds the shared lock so that close() waits for the start.
struct started {
  std::shared_lock<std::shared_mutex> lk;
  std::shared_ptr<op_token> tok;
};

class core {
public:
  // The daemon at the first of `addresses` that answers; a reconnect tries
  // each in turn (client::connect). `where` names them all.
  core(const std::vector<std::pair<std::string, uint16_t>>& addresses, size_t threads,
       const std::string& tls_dir)
    : st_(std::make_unique<core_state>()) {
    for (const auto& [host, port] : addresses)
      st_->where += (st_->where.empty() ? "" : ",") + format_endpoint(host, port);
    st_->cfg = std::make_unique<caf::actor_system_config>();
    if (auto ok = client::configure(*st_->cfg, tls_options{tls_dir}); !ok) {
      auto e = std::move(ok).error_value();
      e.message = "tls=" + tls_dir + ": " + e.message;
      raise(std::move(e));
    }
    st_->cfg->set("scheduler.policy", caf::atom("sharing"));
    st_->cfg->set("scheduler.max-threads", threads);
    st_->cfg->set("logger.console", caf::atom("none"));
    st_->sys = std::make_unique<caf::actor_system>(*st_->cfg);
    auto c = client::connect(*st_->sys, addresses);
    if (!c) {
      st_->sys.reset();
      raise(std::move(c).error_value());
    }
    st_->cl = std::move(*c);
  }

  ~core() {
    if (!st_)
      return;
    if (t_in_completion) {
      // The last reference went on a CAF thread: close elsewhere.
      std::thread([st = st_.release()] {
        st->close();
        delete st;
      }).detach();
      return;
    }
    close();
  }
  core(const core&) = delete;
  core& operator=(const core&) = delete;

  void close() {
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      st_->close();
    } else {
      st_->close();
    }
  }

  [[nodiscard]] bool closed() {
    std::shared_lock<std::shared_mutex> lk{st_->start_mu};
    return st_->closed;
  }

  // Starts a call, or raises `disconnected` if the client is closed.
  started start() {
    started s{std::shared_lock<std::shared_mutex>{st_->start_mu}, nullptr};
    if (st_->closed)
      raise(make_error(errc::disconnected, "the dsec client for " + st_->where
                                             + " is closed"));
    s.tok = std::make_shared<op_token>(st_->g);
    return s;
  }

  client& cl() { return *st_->cl; }

  uint64_t add_session(std::unique_ptr<session> s) {
    std::lock_guard<std::mutex> g{st_->reg_mu};
    auto key = st_->next_key++;
    st_->sessions.emplace(key, std::shared_ptr<session>{std::move(s)});
    return key;
  }
  // The session with `key`; call while a call is started (closing waits).
  std::shared_ptr<session> session_of(uint64_t key) {
    std::lock_guard<std::mutex> g{st_->reg_mu};
    auto it = st_->sessions.find(key);
    if (it == st_->sessions.end())
      raise(make_error(errc::disconnected, "this session handle was released"));
    return it->second;
  }
  void drop_session(uint64_t key) {
    std::shared_ptr<session> s;
    std::lock_guard<std::mutex> g{st_->reg_mu};
    auto it = st_->sessions.find(key);
    if (it != st_->sessions.end()) {
      s = std::move(it->second);
      st_->sessions.erase(it);
    }
  }
  uint64_t add_stream(std::unique_ptr<event_stream> s) {
    std::lock_guard<std::mutex> g{st_->reg_mu};
    auto key = st_->next_key++;
    st_->streams.emplace(key, std::shared_ptr<event_stream>{std::move(s)});
    return key;
  }
  std::shared_ptr<event_stream> stream_of(uint64_t key) {
    std::lock_guard<std::mutex> g{st_->reg_mu};
    auto it = st_->streams.find(key);
    if (it == st_->streams.end())
      raise(make_error(errc::disconnected, "this event stream was closed"));
    return it->second;
  }
  // Drops a stream (its helper quits); without the GIL, as its callbacks may
  // hold Python objects.
  void drop_stream(uint64_t key) {
    std::shared_ptr<event_stream> s;
    {
      std::lock_guard<std::mutex> g{st_->reg_mu};
      auto it = st_->streams.find(key);
      if (it == st_->streams.end())
        return;
      s = std::move(it->second);
      st_->streams.erase(it);
    }
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      s.reset();
    }
  }

  uint64_t add_process(std::unique_ptr<process> p) {
    std::lock_guard<std::mutex> g{st_->reg_mu};
    auto key = st_->next_key++;
    st_->processes.emplace(key, std::shared_ptr<process>{std::move(p)});
    return key;
  }
  std::shared_ptr<process> process_of(uint64_t key) {
    std::lock_guard<std::mutex> g{st_->reg_mu};
    auto it = st_->processes.find(key);
    if (it == st_->processes.end())
      raise(make_error(errc::disconnected, "this process handle was released"));
    return it->second;
  }
  void drop_process(uint64_t key) {
    std::shared_ptr<process> p;
    std::lock_guard<std::mutex> g{st_->reg_mu};
    if (auto it = st_->processes.find(key); it != st_->processes.end()) {
      p = std::move(it->second);
      st_->processes.erase(it);
    }
  }

  [[nodiscard]] const std::string& where() const { return st_->where; }

private:
  std::unique_ptr<core_state> st_;
};

using core_ptr = std::shared_ptr<core>;

// ---- Python-facing handles ---------------------------------------------------------------

class py_session {
public:
  py_session(core_ptr c, uint64_t key, std::string id)
    : core_(std::move(c)), key_(key), id_(std::move(id)) {}
  ~py_session() {
    if (!core_->closed())
      core_->drop_session(key_);
  }
  py_session(const py_session&) = delete;
  py_session& operator=(const py_session&) = delete;

  [[nodiscard]] const std::string& id() const { return id_; }
  core& co() { return *core_; }
  [[nodiscard]] const core_ptr& shared() const { return core_; }
  // The session, for a started call.
  std::shared_ptr<session> get() { return core_->session_of(key_); }

private:
  core_ptr core_;
  uint64_t key_;
  std::string id_;
};

// A streamed command's output, pulled by Python (ExecStream).
class py_exec_stream {
public:
  struct queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<uint8_t, std::string>> chunks;
    std::optional<expected<exec_result>> end;
  };

  explicit py_exec_stream(std::shared_ptr<queue> q) : q_(std::move(q)) {}

  // The next chunk as (stream name, bytes); StopIteration at the end (the
  // result is then in `result`); the call's error, once, if it failed.
  py::object next() {
    if (finished_)
      throw py::stop_iteration();
    wait_interruptibly([&](std::chrono::milliseconds d) {
      std::unique_lock<std::mutex> lk{q_->mu};
      return q_->cv.wait_for(lk, d, [&] { return !q_->chunks.empty() || q_->end; });
    });
    std::unique_lock<std::mutex> lk{q_->mu};
    if (!q_->chunks.empty()) {
      auto c = std::move(q_->chunks.front());
      q_->chunks.pop_front();
      lk.unlock();
      return py::make_tuple(c.first == 2 ? "stderr" : "stdout", py::bytes(c.second));
    }
    finished_ = true;
    auto end = std::move(*q_->end);
    lk.unlock();
    if (!end)
      raise(std::move(end).error_value());
    result_ = py::cast(std::move(*end));
    throw py::stop_iteration();
  }

  [[nodiscard]] py::object result() const { return result_ ? result_ : py::none(); }

private:
  std::shared_ptr<queue> q_;
  bool finished_ = false;
  py::object result_;
};

// A pulled Chronus event stream (session::watch()).
class py_event_stream {
public:
  py_event_stream(core_ptr c, uint64_t key, uint64_t backlog)
    : core_(std::move(c)), key_(key), backlog_(backlog) {}
  ~py_event_stream() { close(); }

  // The next event, waiting at most `timeout_s` seconds (None: as long as it
  // takes): None if none came in time; Disconnected once the session is gone.
  py::object next(std::optional<double> timeout_s) {
    auto deadline = std::chrono::steady_clock::now();
    if (timeout_s)
      deadline += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(std::max(0.0, *timeout_s)));
    for (;;) {
      auto slice = 100ms;
      if (timeout_s) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
        if (left < slice)
          slice = std::max(left, 0ms);
      }
      expected<std::optional<chronus_event>> ev{std::optional<chronus_event>{}};
      {
        auto s = core_->start();
        auto es = core_->stream_of(key_);
        s.lk.unlock(); // a pull may wait: do not hold close() up
        py::gil_scoped_release nogil;
        ev = es->next(slice);
        es.reset();
      }
      if (!ev)
        raise(std::move(ev).error_value());
      if (*ev)
        return py::cast(std::move(**ev));
      if (timeout_s && std::chrono::steady_clock::now() >= deadline)
        return py::none();
      if (PyErr_CheckSignals() != 0)
        throw py::error_already_set();
    }
  }

  void close() {
    if (!closed_ && !core_->closed())
      core_->drop_stream(key_);
    closed_ = true;
  }

  [[nodiscard]] uint64_t backlog() const { return backlog_; }

private:
  core_ptr core_;
  uint64_t key_;
  uint64_t backlog_;
  bool closed_ = false;
};

// A pushed Chronus event stream (session::watch(on_event, on_end)).
class py_watch {
public:
  py_watch(core_ptr c, uint64_t key) : core_(std::move(c)), key_(key) {}
  ~py_watch() { stop(); }
  void stop() {
    if (!stopped_ && !core_->closed())
      core_->drop_stream(key_);
    stopped_ = true;
  }

private:
  core_ptr core_;
  uint64_t key_;
  bool stopped_ = false;
};

// ---- arguments --------------------------------------------------------------------------

uint32_t count_arg(int64_t count) {
  if (count < 0 || count > 1'000'000)
    raise(make_error(errc::invalid_argument,
                     "count: expected a whole number from 0 to 1000000, got "
                       + std::to_string(count)));
  return static_cast<uint32_t>(count);
}

session_options session_opts(uint32_t quota, uint64_t ttl_ms, std::string name,
                             bool trajectory) {
  session_options o;
  o.quota = quota;
  o.default_ttl_ms = ttl_ms;
  o.name = std::move(name);
  o.trajectory = trajectory;
  return o;
}

chronus_feedback feedback_of(uint64_t request_id, double reward, std::string text,
                             std::string data, bool done) {
  chronus_feedback fb;
  fb.request_id = request_id;
  fb.reward = reward;
  fb.text = std::move(text);
  fb.data = std::move(data);
  fb.done = done;
  if (auto ok = check_feedback(fb); !ok)
    raise(std::move(ok).error_value());
  return fb;
}

// What a create hands to Python: ([(id, key)], [exception]).
py::object created_tuple(std::vector<created_sandbox> made,
                         std::pair<std::mutex, std::vector<error>>& failures) {
  py::list boxes;
  for (auto& c : made)
    boxes.append(py::make_tuple(c.id, c.key));
  py::list errs;
  std::lock_guard<std::mutex> g{failures.first};
  for (const auto& e : failures.second)
    errs.append(make_py_error(e));
  return py::make_tuple(boxes, errs);
}

// ---- the module ---------------------------------------------------------------------------

void bind_values(py::module_& m) {
  py::class_<environment>(m, "Environment")
    .def(py::init<>())
    .def_readwrite("base", &environment::base)
    .def_readwrite("workdir", &environment::workdir)
    .def_readwrite("tools", &environment::tools)
    .def_readwrite("memory", &environment::memory)
    .def_readwrite("pids", &environment::pids)
    .def_readwrite("cpus", &environment::cpus)
    .def_readwrite("disk", &environment::disk)
    .def_readwrite("net", &environment::net)
    .def_readwrite("ttl_ms", &environment::ttl_ms)
    .def_readwrite("chronus", &environment::chronus)
    .def_readwrite("backend", &environment::backend)
    // egress networking (docs/network.md)
    .def_readwrite("egress", &environment::egress)
    .def_readwrite("allow", &environment::allow)
    .def_readwrite("deny", &environment::deny)
    .def_readwrite("expose", &environment::expose)
    // host mounts (docs/security.md): "HOST:SANDBOX[:ro|:rw]", read-only by default
    .def_property(
      "mounts",
      [](const environment& e) {
        std::vector<std::string> out;
        for (const auto& m : e.mounts)
          out.push_back(m.to_string());
        return out;
      },
      [](environment& e, const std::vector<std::string>& specs) {
        std::vector<host_mount> ms;
        for (const auto& text : specs) {
          auto m = parse_host_mount(text, true);
          if (!m)
            throw py::value_error("mounts: " + m.error_value().message);
          ms.push_back(std::move(*m));
        }
        e.mounts = std::move(ms);
      })
    .def_readwrite("snapshot", &environment::snapshot)
    .def("__repr__", [](const environment& e) {
      std::string tools;
      for (const auto& t : e.tools)
        tools += (tools.empty() ? "" : ",") + t;
      return "<dsec environment base=" + e.base + (e.workdir.empty() ? "" : " workdir=" + e.workdir)
             + (tools.empty() ? "" : " tools=" + tools) + (e.chronus ? " chronus" : "") + ">";
    });

  py::class_<exec_request>(m, "ExecRequest")
    .def(py::init<>())
    .def_readwrite("argv", &exec_request::argv)
    .def_readwrite("env", &exec_request::env)
    .def_readwrite("cwd", &exec_request::cwd)
    .def_readwrite("uid", &exec_request::uid)
    .def_readwrite("gid", &exec_request::gid)
    .def_readwrite("user", &exec_request::user)
    .def_readwrite("timeout_ms", &exec_request::timeout_ms)
    .def_property(
      "input", [](const exec_request& r) { return py::bytes(r.input); },
      [](exec_request& r, const py::bytes& b) { r.input = std::string(b); })
    .def_readwrite("max_output", &exec_request::max_output)
    .def_readwrite("trusted", &exec_request::trusted)
    .def_readwrite("idempotent", &exec_request::idempotent)
    .def_readwrite("pristine", &exec_request::pristine)
    .def_readwrite("handle", &exec_request::handle)
    .def_readwrite("open_stdin", &exec_request::open_stdin)
    .def_readwrite("tty", &exec_request::tty)
    .def_readwrite("rows", &exec_request::rows)
    .def_readwrite("cols", &exec_request::cols);

  py::class_<exec_result>(m, "ExecResult", "How a command ended, and its output.")
    .def_readonly("exit_code", &exec_result::exit_code)
    .def_readonly("signal", &exec_result::signal, "the signal that killed it, or 0")
    .def_readonly("timed_out", &exec_result::timed_out)
    .def_readonly("truncated", &exec_result::truncated,
                  "output beyond max_output was dropped")
    .def_readonly("oom_killed", &exec_result::oom_killed)
    .def_property_readonly("stdout", [](const exec_result& r) { return py::bytes(r.out); })
    .def_property_readonly("stderr", [](const exec_result& r) { return py::bytes(r.err); })
    .def_property_readonly("duration",
                           [](const exec_result& r) { return r.duration_us / 1e6; },
                           "seconds")
    .def_readonly("duration_us", &exec_result::duration_us)
    .def_property_readonly(
      "ok",
      [](const exec_result& r) { return r.exit_code == 0 && r.signal == 0 && !r.timed_out; },
      "exit code 0, no signal, no timeout")
    .def("__repr__", [](const exec_result& r) {
      return "<dsec ExecResult exit_code=" + std::to_string(r.exit_code)
             + (r.signal ? " signal=" + std::to_string(r.signal) : "")
             + (r.timed_out ? " timed_out" : "") + (r.truncated ? " truncated" : "")
             + (r.oom_killed ? " oom_killed" : "") + " stdout=" + std::to_string(r.out.size())
             + "B stderr=" + std::to_string(r.err.size()) + "B>";
    });

  py::class_<session_summary>(m, "SessionInfo",
                              "A session as `Client.sessions()` shows it: a live one, or a "
                              "trajectory log that can be resumed.")
    .def_readonly("id", &session_summary::id)
    .def_readonly("name", &session_summary::name)
    .def_readonly("state", &session_summary::state, "'live' or 'resumable'")
    .def_readonly("owned", &session_summary::owned, "live, and ends with its trainer")
    .def_readonly("trajectory", &session_summary::trajectory, "keeps a trajectory log")
    .def_readonly("quota", &session_summary::quota, "live: most sandboxes at once")
    .def_readonly("log_ms", &session_summary::log_ms,
                  "its log's last write (unix ms), 0 without one")
    .def("__repr__", [](const session_summary& x) {
      return "<dsec SessionInfo " + x.id + (x.name.empty() ? "" : " name=" + x.name)
             + " state=" + x.state + ">";
    });
  py::class_<exposed_port>(m, "ExposedPort",
                           "A port of a sandbox its node forwards: TCP to `address` "
                           "(host:host_port) reaches `port` on the sandbox's loopback.")
    .def_readonly("port", &exposed_port::port, "inside the sandbox")
    .def_readonly("host", &exposed_port::host, "the node's address (dsecd --expose-address)")
    .def_readonly("host_port", &exposed_port::host_port)
    .def_property_readonly("address", &exposed_port::address, "\"HOST:PORT\"")
    .def("__repr__", [](const exposed_port& p) {
      return "<dsec ExposedPort " + std::to_string(p.port) + " at " + p.address() + ">";
    });
  py::class_<sandbox_info>(m, "SandboxInfo", "A sandbox as `list()` shows it.")
    .def_readonly("id", &sandbox_info::id)
    .def_readonly("session", &sandbox_info::session)
    .def_readonly("state", &sandbox_info::state)
    .def_readonly("env", &sandbox_info::env)
    .def_readonly("created_ms", &sandbox_info::created_ms)
    .def_readonly("ttl_left_ms", &sandbox_info::ttl_left_ms)
    .def_readonly("running", &sandbox_info::running)
    .def_readonly("node", &sandbox_info::node)
    .def_readonly("key", &sandbox_info::key, "its key (create's key=), in its session's list")
    .def_readonly("tags", &sandbox_info::tags, "its create's tags, in its session's list")
    .def_readonly("exposed", &sandbox_info::exposed, "its exposed ports (ExposedPort)")
    .def("__repr__", [](const sandbox_info& i) {
      return "<dsec SandboxInfo " + i.id + (i.key.empty() ? "" : " key=" + i.key)
             + " session=" + i.session + " state=" + i.state + ">";
    });

  py::class_<sandbox_list>(m, "SandboxList",
                           "What `list_all()` found: `sandboxes` (SandboxInfo), and `missing`, "
                           "the names of the nodes that did not answer within 3 s.")
    .def_readonly("sandboxes", &sandbox_list::sandboxes)
    .def_readonly("missing", &sandbox_list::missing)
    .def("__repr__", [](const sandbox_list& l) {
      return "<dsec SandboxList " + std::to_string(l.sandboxes.size()) + " sandboxes, "
             + std::to_string(l.missing.size()) + " nodes missing>";
    });

  py::class_<backend_offer>(m, "BackendOffer",
                            "A backend a node offers (`name`, e.g. \"container\") and its "
                            "capacity: `slots` it admits at most, `live` sandboxes now.")
    .def_readonly("name", &backend_offer::name)
    .def_readonly("slots", &backend_offer::slots)
    .def_readonly("live", &backend_offer::live)
    .def("__repr__", [](const backend_offer& b) {
      return "<dsec BackendOffer " + b.name + " slots=" + std::to_string(b.slots)
             + " live=" + std::to_string(b.live) + ">";
    });

  py::class_<egress_traffic>(m, "EgressTraffic",
                             "One egress sandbox's traffic through its node since it was "
                             "attached: `sandbox` (its id), `sent_bytes`, `received_bytes`, "
                             "`connections` its policy let it open, and `denied` packets "
                             "(connection attempts and their retries).")
    .def_readonly("sandbox", &egress_traffic::sandbox)
    .def_readonly("sent_bytes", &egress_traffic::sent_bytes)
    .def_readonly("received_bytes", &egress_traffic::received_bytes)
    .def_readonly("connections", &egress_traffic::connections)
    .def_readonly("denied", &egress_traffic::denied)
    .def("__repr__", [](const egress_traffic& t) {
      return "<dsec EgressTraffic " + t.sandbox + " sent=" + std::to_string(t.sent_bytes)
             + " received=" + std::to_string(t.received_bytes)
             + " connections=" + std::to_string(t.connections)
             + " denied=" + std::to_string(t.denied) + ">";
    });

  py::class_<resource_usage>(m, "ResourceUsage",
                             "What a sandbox uses now (`dsec stats ID`); a limit is 0 when "
                             "none is set.")
    .def_readonly("memory_bytes", &resource_usage::memory_bytes,
                  "charged to its memory cgroup (its page cache and writable layer's pages "
                  "too), else its processes' resident memory")
    .def_readonly("memory_limit", &resource_usage::memory_limit)
    .def_readonly("cpu_ms", &resource_usage::cpu_ms,
                  "CPU time of its live processes and of every one that ended")
    .def_readonly("tasks", &resource_usage::tasks, "processes and threads alive")
    .def_readonly("tasks_limit", &resource_usage::tasks_limit)
    .def_readonly("processes", &resource_usage::processes)
    .def_readonly("disk_bytes", &resource_usage::disk_bytes, "used in its writable layer")
    .def_readonly("disk_limit", &resource_usage::disk_limit)
    .def_readonly("inodes", &resource_usage::inodes, "files in its writable layer")
    .def_readonly("inodes_limit", &resource_usage::inodes_limit)
    .def_readonly("memory_from_cgroup", &resource_usage::memory_from_cgroup)
    .def("__repr__", [](const resource_usage& u) {
      return "<dsec ResourceUsage memory=" + std::to_string(u.memory_bytes)
             + " cpu_ms=" + std::to_string(u.cpu_ms) + " tasks=" + std::to_string(u.tasks)
             + " disk=" + std::to_string(u.disk_bytes) + ">";
    });
  py::class_<sandbox_process>(m, "SandboxProcess",
                              "One process of a sandbox as `dsec top ID` shows it: pid, ppid "
                              "and uid as the sandbox sees them (its init is pid 1).")
    .def_readonly("pid", &sandbox_process::pid)
    .def_readonly("ppid", &sandbox_process::ppid, "0 for init")
    .def_readonly("uid", &sandbox_process::uid, "in the sandbox's user namespace")
    .def_readonly("state", &sandbox_process::state, "R, S, D, Z, T, ...")
    .def_readonly("threads", &sandbox_process::threads)
    .def_readonly("rss_bytes", &sandbox_process::rss_bytes)
    .def_readonly("cpu_ms", &sandbox_process::cpu_ms)
    .def_readonly("age_ms", &sandbox_process::age_ms)
    .def_readonly("command", &sandbox_process::command,
                  "its argv joined by spaces (4 KiB at most), or [comm]")
    .def("__repr__", [](const sandbox_process& p) {
      return "<dsec SandboxProcess " + std::to_string(p.pid) + " " + p.state + " "
             + p.command.substr(0, 60) + ">";
    });
  py::class_<sandbox_usage>(m, "SandboxUsage",
                            "A sandbox's usage as its node read it: `usage` (ResourceUsage), "
                            "`uptime_ms` since it became ready, `traffic` (EgressTraffic) when "
                            "`egress`, and `processes` (SandboxProcess) when asked for.")
    .def_readonly("id", &sandbox_usage::id)
    .def_readonly("node", &sandbox_usage::node)
    .def_readonly("uptime_ms", &sandbox_usage::uptime_ms)
    .def_readonly("usage", &sandbox_usage::usage)
    .def_readonly("egress", &sandbox_usage::egress)
    .def_readonly("traffic", &sandbox_usage::traffic)
    .def_readonly("processes", &sandbox_usage::processes)
    .def("__repr__", [](const sandbox_usage& u) {
      return "<dsec SandboxUsage " + u.id + " memory=" + std::to_string(u.usage.memory_bytes)
             + " cpu_ms=" + std::to_string(u.usage.cpu_ms) + ">";
    });

  auto stats = py::class_<node_stats>(m, "NodeStats", "The node's counters (`node stats`).");
#define DSEC_STAT(f) stats.def_readonly(#f, &node_stats::f)
  DSEC_STAT(node); DSEC_STAT(slots); DSEC_STAT(live); DSEC_STAT(creating);
  DSEC_STAT(created); DSEC_STAT(failed); DSEC_STAT(destroyed); DSEC_STAT(sessions);
  DSEC_STAT(layers_mounted); DSEC_STAT(layer_bytes); DSEC_STAT(cache_budget);
  DSEC_STAT(evicted); DSEC_STAT(gc); DSEC_STAT(chronus_sandboxes); DSEC_STAT(chronus_events);
  DSEC_STAT(chronus_answered); DSEC_STAT(chronus_too_large); DSEC_STAT(chronus_malformed);
  DSEC_STAT(chronus_unauthenticated); DSEC_STAT(chronus_invalid);
  DSEC_STAT(chronus_flooding); DSEC_STAT(chronus_refused_connections);
  DSEC_STAT(refused_clients);
  DSEC_STAT(refused_internal);
  DSEC_STAT(default_memory); DSEC_STAT(default_pids); DSEC_STAT(default_disk);
  DSEC_STAT(cgroups_reused); DSEC_STAT(cgroups_made); DSEC_STAT(backends);
  DSEC_STAT(memory_capacity); DSEC_STAT(memory_admitted); DSEC_STAT(cordoned);
  DSEC_STAT(egress_sandboxes); DSEC_STAT(egress_allowed); DSEC_STAT(egress_denied);
  DSEC_STAT(egress_by_sandbox);
  DSEC_STAT(exposed_ports); DSEC_STAT(exposed_connections); DSEC_STAT(exposed_refused);
  DSEC_STAT(exposed_idle_closed);
#undef DSEC_STAT
  stats.def("__repr__", [](const node_stats& s) {
    return "<dsec NodeStats node=" + s.node + " live=" + std::to_string(s.live)
           + " slots=" + std::to_string(s.slots) + " sessions=" + std::to_string(s.sessions)
           + ">";
  });

  py::class_<chronus_event>(m, "RawEvent", "A Chronus event as decoded (runtime/chronus.hpp).")
    .def_readonly("sandbox_id", &chronus_event::sandbox_id)
    .def_readonly("seq", &chronus_event::seq)
    .def_readonly("monotonic_ns", &chronus_event::monotonic_ns)
    .def_property_readonly("kind", [](const chronus_event& e) { return to_string(e.kind); })
    .def_readonly("text", &chronus_event::text)
    .def_property_readonly("metrics",
                           [](const chronus_event& e) {
                             py::dict d;
                             for (const auto& mt : e.metrics)
                               d[py::str(mt.key)] = mt.value;
                             return d;
                           })
    .def_property_readonly("payload", [](const chronus_event& e) { return py::bytes(e.payload); })
    .def_readonly("replayed", &chronus_event::replayed)
    .def_property_readonly("answer", [](const chronus_event& e) -> py::object {
      if (!e.answer)
        return py::none();
      return py::make_tuple(e.answer->reward, e.answer->text, py::bytes(e.answer->data),
                            e.answer->done);
    });
}

void bind_client(py::module_& m) {
  py::class_<core, core_ptr>(m, "Client")
    .def(py::init([](std::vector<std::pair<std::string, uint16_t>> addresses, size_t threads,
                     const std::string& tls) {
           if (threads < 1 || threads > 256)
             raise(make_error(errc::invalid_argument,
                              "threads: expected 1 to 256, got " + std::to_string(threads)));
           if (addresses.empty())
             raise(make_error(errc::invalid_argument, "address: no address given"));
           py::gil_scoped_release nogil;
           return std::make_shared<core>(addresses, threads, tls);
         }),
         py::arg("addresses"), py::arg("threads") = 2, py::arg("tls") = "")
    .def_property_readonly("closed", &core::closed)
    .def_property_readonly("address", &core::where)
    .def("close", &core::close)
    .def("open_session",
         [](const core_ptr& c, uint32_t quota, uint64_t ttl_ms, std::string name, bool trajectory) {
           waiter<std::unique_ptr<session>> out;
           {
             auto s = c->start();
             c->cl().open_session_async(session_opts(quota, ttl_ms, std::move(name), trajectory),
                                        to_waiter(out, s.tok));
           }
           auto sess = value_or_raise(await_outcome(out));
           auto id = sess->id();
           return std::make_unique<py_session>(c, c->add_session(std::move(sess)), id);
         })
    .def("open_session_async",
         [](const core_ptr& c, uint32_t quota, uint64_t ttl_ms, std::string name, bool trajectory,
            py::object done) {
           auto s = c->start();
           // The value is (key, id): the caller adopts the key on its own thread.
           std::weak_ptr<core> weak = c;
           c->cl().open_session_async(
             session_opts(quota, ttl_ms, std::move(name), trajectory),
             to_python<std::unique_ptr<session>>(
               std::move(done), s.tok, [weak](std::unique_ptr<session>&& sess) -> py::object {
                 auto id = sess->id();
                 auto co = weak.lock();
                 if (!co)
                   return py::none();
                 // The core is alive (the caller holds it), so this is no last reference.
                 auto key = co->add_session(std::move(sess));
                 co.reset();
                 return py::make_tuple(key, id);
               }));
         })
    .def("resume_session",
         [](const core_ptr& c, const std::string& id) {
           waiter<std::unique_ptr<session>> out;
           {
             auto s = c->start();
             c->cl().resume_session_async(id, to_waiter(out, s.tok));
           }
           auto sess = value_or_raise(await_outcome(out));
           auto sid = sess->id();
           return std::make_unique<py_session>(c, c->add_session(std::move(sess)), sid);
         })
    .def("resume_session_async",
         [](const core_ptr& c, const std::string& id, py::object done) {
           auto s = c->start();
           std::weak_ptr<core> weak = c;
           c->cl().resume_session_async(
             id, to_python<std::unique_ptr<session>>(
                   std::move(done), s.tok, [weak](std::unique_ptr<session>&& sess) -> py::object {
                     auto sid = sess->id();
                     auto co = weak.lock();
                     if (!co)
                       return py::none();
                     auto key = co->add_session(std::move(sess));
                     co.reset();
                     return py::make_tuple(key, sid);
                   }));
         })
    .def("find_session",
         [](const core_ptr& c, const std::string& id) {
           expected<std::unique_ptr<session>> found = make_error(errc::disconnected, "not asked");
           {
             auto s = c->start();
             py::gil_scoped_release nogil;
             found = c->cl().find_session(id);
           }
           auto sess = value_or_raise(std::move(found));
           auto sid = sess->id();
           return std::make_unique<py_session>(c, c->add_session(std::move(sess)), sid);
         })
    .def("adopt_session",
         [](const core_ptr& c, uint64_t key, std::string id) {
           return std::make_unique<py_session>(c, key, std::move(id));
         })
    .def("list",
         [](const core_ptr& c) {
           waiter<std::vector<sandbox_info>> out;
           {
             auto s = c->start();
             c->cl().list_async(to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    .def("list_all",
         [](const core_ptr& c) {
           waiter<sandbox_list> out;
           {
             auto s = c->start();
             c->cl().list_all_async(to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    .def("list_async",
         [](const core_ptr& c, py::object done) {
           auto s = c->start();
           c->cl().list_async(
             to_python<std::vector<sandbox_info>>(std::move(done), s.tok, identity{}));
         })
    .def("stats",
         [](const core_ptr& c) {
           waiter<node_stats> out;
           {
             auto s = c->start();
             c->cl().stats_async(to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    .def("sessions",
         [](const core_ptr& c) {
           expected<std::vector<session_summary>> r = make_error(errc::disconnected, "not asked");
           {
             auto s = c->start();
             py::gil_scoped_release nogil;
             r = c->cl().sessions();
           }
           return value_or_raise(std::move(r));
         })
    .def("pool",
         [](const core_ptr& c, const environment& env, uint32_t size) {
           expected<uint32_t> r = make_error(errc::disconnected, "not asked");
           {
             py::gil_scoped_release nogil;
             r = c->cl().pool(env, size);
           }
           return value_or_raise(std::move(r));
         })
    .def("stats_async", [](const core_ptr& c, py::object done) {
      auto s = c->start();
      c->cl().stats_async(to_python<node_stats>(std::move(done), s.tok, identity{}));
    })
    .def("cordon",
         [](const core_ptr& c, const std::string& node, bool on) {
           waiter<uint32_t> out;
           {
             auto s = c->start();
             c->cl().cordon_async(node, on, to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    .def("drain", [](const core_ptr& c, const std::string& node, uint64_t timeout_ms) {
      waiter<uint32_t> out;
      {
        auto s = c->start();
        c->cl().drain_async(node, std::chrono::milliseconds(timeout_ms), to_waiter(out, s.tok));
      }
      return value_or_raise(await_outcome(out));
    });
}

// A command started with a handle (Session.start; dsec.Process wraps it).
class py_process {
public:
  py_process(core_ptr c, uint64_t key) : core_(std::move(c)), key_(key) {}
  ~py_process() {
    if (!core_->closed())
      core_->drop_process(key_);
  }
  py_process(const py_process&) = delete;
  py_process& operator=(const py_process&) = delete;

  core& co() { return *core_; }
  std::shared_ptr<process> get() { return core_->process_of(key_); }

  // Its id once it runs (the GIL released meanwhile).
  uint64_t id() {
    std::shared_ptr<process> p;
    {
      auto s = co().start();
      p = get();
    }
    expected<uint64_t> r = make_error(errc::disconnected, "");
    {
      py::gil_scoped_release nogil;
      r = p->id();
    }
    return value_or_raise(std::move(r));
  }
  // The asynchronous verbs: `done(value, exc)` as the other *_async calls.
  // (write_async and friends may wait for the id: without the GIL.)
  void write_async(const py::bytes& data, py::object done) {
    auto s = co().start();
    auto p = get();
    auto fin = to_python<uint64_t>(std::move(done), s.tok, identity{});
    std::string bytes{data};
    py::gil_scoped_release nogil;
    p->write_async(std::move(bytes), std::move(fin));
  }
  void close_stdin_async(py::object done) {
    auto s = co().start();
    auto p = get();
    auto fin = to_python<void>(std::move(done), s.tok, identity{});
    py::gil_scoped_release nogil;
    p->close_stdin_async(std::move(fin));
  }
  void signal_async(int sig, py::object done) {
    auto s = co().start();
    auto p = get();
    auto fin = to_python<void>(std::move(done), s.tok, identity{});
    py::gil_scoped_release nogil;
    p->signal_async(sig, std::move(fin));
  }
  void resize_async(uint16_t rows, uint16_t cols, py::object done) {
    auto s = co().start();
    auto p = get();
    auto fin = to_python<void>(std::move(done), s.tok, identity{});
    py::gil_scoped_release nogil;
    p->resize_async(rows, cols, std::move(fin));
  }
  // The blocking verbs (interruptible waits, as every blocking call).
  void resize(uint16_t rows, uint16_t cols) {
    waiter<void> w;
    {
      auto s = co().start();
      auto p = get();
      py::gil_scoped_release nogil;
      p->resize_async(rows, cols, to_waiter(w, s.tok));
    }
    if (auto r = await_outcome(w); !r)
      raise(std::move(r).error_value());
  }
  void write(const py::bytes& data) {
    std::string bytes{data};
    constexpr size_t piece = 128u << 10; // each waits for room in the daemon
    for (size_t off = 0; off < bytes.size(); off += piece) {
      waiter<uint64_t> w;
      {
        auto s = co().start();
        auto p = get();
        py::gil_scoped_release nogil;
        p->write_async(bytes.substr(off, piece), to_waiter(w, s.tok));
      }
      value_or_raise(await_outcome(w));
    }
  }
  void close_stdin() {
    waiter<void> w;
    {
      auto s = co().start();
      auto p = get();
      py::gil_scoped_release nogil;
      p->close_stdin_async(to_waiter(w, s.tok));
    }
    if (auto r = await_outcome(w); !r)
      raise(std::move(r).error_value());
  }
  void signal(int sig) {
    waiter<void> w;
    {
      auto s = co().start();
      auto p = get();
      py::gil_scoped_release nogil;
      p->signal_async(sig, to_waiter(w, s.tok));
    }
    if (auto r = await_outcome(w); !r)
      raise(std::move(r).error_value());
  }
  exec_result wait() {
    std::shared_ptr<process> p;
    {
      auto s = co().start();
      p = get();
    }
    wait_interruptibly([&](std::chrono::milliseconds d) { return p->wait_for(d); });
    return value_or_raise(p->wait());
  }
  bool done() {
    auto p = get();
    return p->wait_for(0ms);
  }
  void cancel() {
    auto p = get();
    py::gil_scoped_release nogil;
    p->cancel();
  }

private:
  core_ptr core_;
  uint64_t key_;
};

void bind_session(py::module_& m) {
  py::class_<py_session>(m, "Session")
    .def_property_readonly("id", &py_session::id)
    .def("create",
         [](py_session& ps, const environment& env, int64_t count, std::string key,
            std::map<std::string, std::string> tags) {
           auto n = count_arg(count);
           waiter<std::vector<created_sandbox>> out;
           auto failures = std::make_shared<std::pair<std::mutex, std::vector<error>>>();
           {
             auto s = ps.co().start();
             ps.get()->create_async(env, n, create_labels{std::move(key), std::move(tags)},
                                    to_waiter(out, s.tok), {},
                                    [failures](const error& e) {
                                      std::lock_guard<std::mutex> g{failures->first};
                                      failures->second.push_back(e);
                                    });
           }
           auto made = value_or_raise(await_outcome(out));
           return created_tuple(std::move(made), *failures);
         })
    .def("create_async",
         [](py_session& ps, const environment& env, int64_t count, std::string key,
            std::map<std::string, std::string> tags, py::object done) {
           auto n = count_arg(count);
           auto failures = std::make_shared<std::pair<std::mutex, std::vector<error>>>();
           auto s = ps.co().start();
           ps.get()->create_async(
             env, n, create_labels{std::move(key), std::move(tags)},
             to_python<std::vector<created_sandbox>>(
               std::move(done), s.tok,
               [failures](std::vector<created_sandbox>&& made) -> py::object {
                 return created_tuple(std::move(made), *failures);
               }),
             {},
             [failures](const error& e) {
               std::lock_guard<std::mutex> g{failures->first};
               failures->second.push_back(e);
             });
         })
    .def("find",
         [](py_session& ps, const std::string& key) {
           waiter<sandbox_info> out;
           {
             auto s = ps.co().start();
             ps.get()->find_async(key, to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    .def("find_async",
         [](py_session& ps, const std::string& key, py::object done) {
           auto s = ps.co().start();
           ps.get()->find_async(key, to_python<sandbox_info>(std::move(done), s.tok, identity{}));
         })
    .def("exec",
         [](py_session& ps, const std::string& id, const exec_request& req) {
           waiter<exec_result> out;
           {
             auto s = ps.co().start();
             ps.get()->exec_async(id, req, to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    .def("exec_async",
         [](py_session& ps, const std::string& id, const exec_request& req, py::object done) {
           auto s = ps.co().start();
           ps.get()->exec_async(id, req, to_python<exec_result>(std::move(done), s.tok, identity{}));
         })
    .def("start",
         [](py_session& ps, const std::string& id, const exec_request& req, py::object on_output,
            py::object done) {
           // A process handle: on_output(stream name, bytes) with the GIL, in
           // order, before done(result, exc); either may be None.
           std::unique_ptr<process> p;
           {
             auto s = ps.co().start();
             output_fn out;
             std::shared_ptr<py_ref> out_ref;
             if (!on_output.is_none()) {
               out_ref = std::make_shared<py_ref>(std::move(on_output));
               out = [out_ref](uint8_t stream, std::string_view data) {
                 if (!python_alive())
                   return;
                 t_in_completion = true;
                 {
                   py::gil_scoped_acquire gil;
                   try {
                     if (out_ref->obj)
                       out_ref->obj(stream == 2 ? "stderr" : "stdout",
                                    py::bytes(data.data(), data.size()));
                   } catch (py::error_already_set& e) {
                     e.discard_as_unraisable("dsec: a process's output callback");
                   }
                 }
                 t_in_completion = false;
               };
             }
             completion<exec_result> fin;
             if (!done.is_none())
               fin = to_python<exec_result>(std::move(done), s.tok, identity{});
             else
               fin = [tok = s.tok](expected<exec_result>) { tok->release(); };
             completion<exec_result> end = [fin, out_ref](expected<exec_result> r) mutable {
               if (out_ref && python_alive()) {
                 t_in_completion = true;
                 out_ref->drop();
                 t_in_completion = false;
               }
               fin(std::move(r));
             };
             py::gil_scoped_release nogil;
             p = ps.get()->start(id, req, std::move(out), std::move(end));
           }
           auto key = ps.co().add_process(std::move(p));
           return std::make_unique<py_process>(ps.shared(), key);
         },
         py::arg("id"), py::arg("req"), py::arg("on_output") = py::none(),
         py::arg("done") = py::none())
    .def("exec_stream",
         [](py_session& ps, const std::string& id, const exec_request& req) {
           auto q = std::make_shared<py_exec_stream::queue>();
           auto s = ps.co().start();
           auto tok = s.tok;
           ps.get()->exec_async(
             id, req,
             [q, tok](expected<exec_result> r) {
               {
                 std::lock_guard<std::mutex> g{q->mu};
                 q->end.emplace(std::move(r));
               }
               q->cv.notify_all();
               tok->release();
             },
             [q](uint8_t stream, std::string_view data) {
               {
                 std::lock_guard<std::mutex> g{q->mu};
                 q->chunks.emplace_back(stream, std::string{data});
               }
               q->cv.notify_all();
             });
           return std::make_unique<py_exec_stream>(q);
         })
    .def("exec_stream_async",
         [](py_session& ps, const std::string& id, const exec_request& req, py::object on_output,
            py::object done) {
           auto s = ps.co().start();
           // on_output(stream name, bytes), with the GIL, in order, before done.
           auto out_ref = std::make_shared<py_ref>(std::move(on_output));
           auto fin = to_python<exec_result>(std::move(done), s.tok, identity{});
           ps.get()->exec_async(
             id, req,
             [fin, out_ref](expected<exec_result> r) mutable {
               if (python_alive()) {
                 t_in_completion = true;
                 out_ref->drop();
                 t_in_completion = false;
               }
               fin(std::move(r));
             },
             [out_ref](uint8_t stream, std::string_view data) {
               if (!python_alive())
                 return;
               t_in_completion = true;
               {
                 py::gil_scoped_acquire gil;
                 try {
                   if (out_ref->obj)
                     out_ref->obj(stream == 2 ? "stderr" : "stdout",
                                  py::bytes(data.data(), data.size()));
                 } catch (py::error_already_set& e) {
                   e.discard_as_unraisable("dsec: an exec stream's output callback");
                 }
               }
               t_in_completion = false;
             });
         })
    .def("put",
         [](py_session& ps, const std::string& id, const std::string& dir, const py::bytes& tar) {
           waiter<uint64_t> out;
           std::string t{tar};
           {
             auto s = ps.co().start();
             ps.get()->put_async(id, dir, std::move(t), to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    // Streamed transfers (actors/transfer.hpp): the loop runs here without
    // the GIL; read(n) / write(bytes) are called with it, one piece at a
    // time, so no whole transfer is ever in one buffer. An exception from
    // them (or a signal) cancels the transfer and is raised here.
    .def("put_from",
         [](py_session& ps, const std::string& id, const std::string& dir, py::object read) {
           std::shared_ptr<py::error_already_set> raised;
           auto src = [&](char* buf, size_t size) -> expected<size_t> {
             py::gil_scoped_acquire gil;
             try {
               if (PyErr_CheckSignals() != 0)
                 throw py::error_already_set();
               py::object got = read(size);
               if (!PyBytes_Check(got.ptr()))
                 throw py::type_error("put_from: read(n) must return bytes");
               char* data = nullptr;
               Py_ssize_t n = 0;
               PyBytes_AsStringAndSize(got.ptr(), &data, &n);
               if (static_cast<size_t>(n) > size)
                 throw py::value_error("put_from: read(n) returned more than n bytes");
               std::memcpy(buf, data, static_cast<size_t>(n));
               return static_cast<size_t>(n);
             } catch (py::error_already_set& e) {
               raised = std::make_shared<py::error_already_set>(std::move(e));
             } catch (std::exception& e) {
               PyErr_SetString(PyExc_RuntimeError, e.what());
               raised = std::make_shared<py::error_already_set>();
             }
             return make_error(errc::closed, "put: the source raised");
           };
           expected<uint64_t> r = uint64_t{0};
           {
             auto s = ps.co().start();
             auto sess = ps.get();
             py::gil_scoped_release nogil;
             r = sess->put_from(id, dir, src);
           }
           if (raised)
             throw *raised;
           return value_or_raise(std::move(r));
         })
    .def("get_into",
         [](py_session& ps, const std::string& id, const std::string& path, py::object write) {
           std::shared_ptr<py::error_already_set> raised;
           auto sink = [&](std::string_view d) -> expected<void> {
             py::gil_scoped_acquire gil;
             try {
               if (PyErr_CheckSignals() != 0)
                 throw py::error_already_set();
               write(py::bytes(d.data(), d.size()));
               return {};
             } catch (py::error_already_set& e) {
               raised = std::make_shared<py::error_already_set>(std::move(e));
             } catch (std::exception& e) {
               PyErr_SetString(PyExc_RuntimeError, e.what());
               raised = std::make_shared<py::error_already_set>();
             }
             return make_error(errc::closed, "get: the sink raised");
           };
           expected<uint64_t> r = uint64_t{0};
           {
             auto s = ps.co().start();
             auto sess = ps.get();
             py::gil_scoped_release nogil;
             r = sess->get_into(id, path, sink);
           }
           if (raised)
             throw *raised;
           return value_or_raise(std::move(r));
         })
    .def("put_async",
         [](py_session& ps, const std::string& id, const std::string& dir, const py::bytes& tar,
            py::object done) {
           std::string t{tar};
           auto s = ps.co().start();
           ps.get()->put_async(id, dir, std::move(t),
                               to_python<uint64_t>(std::move(done), s.tok, identity{}));
         })
    .def("get",
         [](py_session& ps, const std::string& id, const std::string& path) {
           waiter<std::string> out;
           {
             auto s = ps.co().start();
             ps.get()->get_async(id, path, to_waiter(out, s.tok));
           }
           return py::bytes(value_or_raise(await_outcome(out)));
         })
    .def("get_async",
         [](py_session& ps, const std::string& id, const std::string& path, py::object done) {
           auto s = ps.co().start();
           ps.get()->get_async(id, path, to_python<std::string>(std::move(done), s.tok, to_bytes{}));
         })
    .def("destroy",
         [](py_session& ps, const std::string& id) {
           waiter<void> out;
           {
             auto s = ps.co().start();
             ps.get()->destroy_async(id, to_waiter(out, s.tok));
           }
           auto r = await_outcome(out);
           if (!r)
             raise(std::move(r).error_value());
         })
    .def("destroy_async",
         [](py_session& ps, const std::string& id, py::object done) {
           auto s = ps.co().start();
           ps.get()->destroy_async(id, to_python<void>(std::move(done), s.tok, identity{}));
         })
    .def("call",
         [](py_session& ps, const environment& env, const exec_request& req) {
           waiter<exec_result> out;
           {
             auto s = ps.co().start();
             ps.get()->call_async(env, req, to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    .def("pool",
         [](py_session& ps, const environment& env, uint32_t size) {
           expected<uint32_t> r = make_error(errc::disconnected, "not asked");
           {
             py::gil_scoped_release nogil;
             r = ps.get()->pool(env, size);
           }
           return value_or_raise(std::move(r));
         })
    // ---- snapshots (issue 16) ----
    .def("pause",
         [](py_session& ps, const std::string& id, bool on) {
           waiter<bool> out;
           {
             auto s = ps.co().start();
             ps.get()->pause_async(id, on, to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    .def("pause_all",
         [](py_session& ps, bool on) {
           waiter<uint32_t> out;
           {
             auto s = ps.co().start();
             ps.get()->pause_all_async(on, to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    .def("snapshot",
         [](py_session& ps, const std::string& id, const std::string& ref) {
           waiter<std::string> out;
           {
             auto s = ps.co().start();
             ps.get()->snapshot_async(id, ref, to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    .def("fork",
         [](py_session& ps, const std::string& id, uint32_t count) {
           waiter<std::vector<std::string>> out;
           {
             auto s = ps.co().start();
             ps.get()->fork_async(id, count, to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    .def("set_ttl",
         [](py_session& ps, const std::string& id, uint64_t ms) {
           waiter<uint64_t> out;
           {
             auto s = ps.co().start();
             ps.get()->set_ttl_async(id, std::chrono::milliseconds(ms), to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    // egress networking (docs/network.md): replaces the sandbox's policy
    .def("set_network",
         [](py_session& ps, const std::string& id, const std::vector<std::string>& allow,
            const std::vector<std::string>& deny) {
           waiter<void> out;
           {
             auto s = ps.co().start();
             ps.get()->set_network_async(id, allow, deny, to_waiter(out, s.tok));
           }
           auto r = await_outcome(out);
           if (!r)
             raise(std::move(r).error_value());
         })
    .def("set_network_async",
         [](py_session& ps, const std::string& id, const std::vector<std::string>& allow,
            const std::vector<std::string>& deny, py::object done) {
           auto s = ps.co().start();
           ps.get()->set_network_async(id, allow, deny,
                                       to_python<void>(std::move(done), s.tok, identity{}));
         })
    .def("expose",
         [](py_session& ps, const std::string& id, uint16_t port) {
           waiter<exposed_port> out;
           {
             auto s = ps.co().start();
             ps.get()->expose_async(id, port, to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    .def("expose_async",
         [](py_session& ps, const std::string& id, uint16_t port, py::object done) {
           auto s = ps.co().start();
           ps.get()->expose_async(id, port,
                                  to_python<exposed_port>(std::move(done), s.tok, identity{}));
         })
    // what a sandbox uses now (docs/observability.md "One sandbox: stats and top")
    .def("usage",
         [](py_session& ps, const std::string& id, bool processes) {
           waiter<sandbox_usage> out;
           {
             auto s = ps.co().start();
             ps.get()->usage_async(id, processes, to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    .def("usage_async",
         [](py_session& ps, const std::string& id, bool processes, py::object done) {
           auto s = ps.co().start();
           ps.get()->usage_async(id, processes,
                                 to_python<sandbox_usage>(std::move(done), s.tok, identity{}));
         })
    .def("set_ttl_async",
         [](py_session& ps, const std::string& id, uint64_t ms, py::object done) {
           auto s = ps.co().start();
           ps.get()->set_ttl_async(id, std::chrono::milliseconds(ms),
                                   to_python<uint64_t>(std::move(done), s.tok, identity{}));
         })
    .def("list",
         [](py_session& ps) {
           waiter<std::vector<sandbox_info>> out;
           {
             auto s = ps.co().start();
             ps.get()->list_async(to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    .def("list_async",
         [](py_session& ps, py::object done) {
           auto s = ps.co().start();
           ps.get()->list_async(
             to_python<std::vector<sandbox_info>>(std::move(done), s.tok, identity{}));
         })
    .def("close",
         [](py_session& ps) {
           waiter<uint32_t> out;
           {
             auto s = ps.co().start();
             ps.get()->close_async(to_waiter(out, s.tok));
           }
           return value_or_raise(await_outcome(out));
         })
    .def("close_async",
         [](py_session& ps, py::object done) {
           auto s = ps.co().start();
           ps.get()->close_async(to_python<uint32_t>(std::move(done), s.tok, identity{}));
         })
    .def("answer",
         [](py_session& ps, const std::string& id, uint64_t request_id, double reward,
            std::string text, const py::bytes& data, bool done) {
           auto fb = feedback_of(request_id, reward, std::move(text), std::string(data), done);
           waiter<void> out;
           {
             auto s = ps.co().start();
             ps.get()->answer_async(id, fb, to_waiter(out, s.tok));
           }
           auto r = await_outcome(out);
           if (!r)
             raise(std::move(r).error_value());
         })
    .def("answer_async",
         [](py_session& ps, const std::string& id, uint64_t request_id, double reward,
            std::string text, const py::bytes& data, bool done, py::object on_done) {
           // Checked here, so that completion is always on a CAF thread.
           auto fb = feedback_of(request_id, reward, std::move(text), std::string(data), done);
           auto s = ps.co().start();
           ps.get()->answer_async(id, fb, to_python<void>(std::move(on_done), s.tok, identity{}));
         })
    .def("watch",
         [](py_session& ps) {
           core_ptr c;
           uint64_t key = 0, backlog = 0;
           {
             auto s = ps.co().start();
             auto sess = ps.get();
             py::gil_scoped_release nogil;
             auto w = value_or_raise(sess->watch());
             backlog = w->backlog();
             key = ps.co().add_stream(std::move(w));
           }
           return std::make_unique<py_event_stream>(ps.shared(), key, backlog);
         })
    .def("watch_async", [](py_session& ps, py::object on_event, py::object on_end) {
      // on_event(RawEvent) and on_end(exception) run on a CAF thread with the GIL.
      auto ev_ref = std::make_shared<py_ref>(std::move(on_event));
      auto end_ref = std::make_shared<py_ref>(std::move(on_end));
      uint64_t key = 0;
      {
        auto s = ps.co().start();
        auto sess = ps.get();
        py::gil_scoped_release nogil;
        auto w = value_or_raise(sess->watch(
          [ev_ref](const chronus_event& ev) {
            if (!python_alive())
              return;
            t_in_completion = true;
            {
              py::gil_scoped_acquire gil;
              try {
                if (ev_ref->obj)
                  ev_ref->obj(py::cast(ev));
              } catch (py::error_already_set& e) {
                e.discard_as_unraisable("dsec: an event callback");
              }
            }
            t_in_completion = false;
          },
          [end_ref](const error& err) {
            if (!python_alive())
              return;
            t_in_completion = true;
            {
              py::gil_scoped_acquire gil;
              try {
                if (end_ref->obj)
                  end_ref->obj(make_py_error(err));
              } catch (py::error_already_set& e) {
                e.discard_as_unraisable("dsec: an event stream's end callback");
              }
              end_ref->obj = py::object{};
            }
            t_in_completion = false;
          }));
        key = ps.co().add_stream(std::move(w));
      }
      return std::make_unique<py_watch>(ps.shared(), key);
    });
}

void bind_streams(py::module_& m) {
  py::class_<py_exec_stream>(m, "ExecStream",
                             "A streamed command: iterate for (stream, bytes); then .result.")
    .def("__iter__", [](py::object self) { return self; })
    .def("__next__", &py_exec_stream::next)
    .def_property_readonly("result", &py_exec_stream::result,
                           "the ExecResult once the iteration ended, else None");

  py::class_<py_event_stream>(m, "EventStream")
    .def("next", &py_event_stream::next, py::arg("timeout") = py::none())
    .def("close", &py_event_stream::close)
    .def_property_readonly("backlog", &py_event_stream::backlog);

  py::class_<py_watch>(m, "Watch").def("stop", &py_watch::stop);

  py::class_<py_process>(m, "Process", "A command started with a handle (Session.start).")
    .def("id", &py_process::id, "its id in the sandbox, once it runs")
    .def("write", &py_process::write)
    .def("write_async", &py_process::write_async)
    .def("close_stdin", &py_process::close_stdin)
    .def("close_stdin_async", &py_process::close_stdin_async)
    .def("signal", &py_process::signal)
    .def("signal_async", &py_process::signal_async)
    .def("resize", &py_process::resize)
    .def("resize_async", &py_process::resize_async)
    .def("wait", &py_process::wait)
    .def("done", &py_process::done)
    .def("cancel", &py_process::cancel);
}

} // namespace
} // namespace dsec::python

PYBIND11_MODULE(_dsec, m) {
  using namespace dsec;
  using namespace dsec::python;
  m.doc() = "The native half of the dsec trainer SDK; use the dsec package instead.";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p)
        std::rethrow_exception(p);
    } catch (const native_error& e) {
      auto exc = make_py_error(e.err);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });

  m.def(
    "_set_error_factory",
    [](py::object f) {
      if (!g_error_factory)
        g_error_factory = new py::object(); // leaked on purpose (see its comment)
      *g_error_factory = std::move(f);
    },
    "factory(code:int, code_name:str, message, step, path, errno) -> exception instance");

  m.def(
    "parse_size",
    [](const std::string& s, const std::string& what) {
      return value_or_raise(dsec::parse_size(s, what));
    },
    py::arg("text"), py::arg("what"), "bytes from '512m', '2g', '1048576' (dsec's own parser)");

  m.def(
    "parse_endpoint",
    [](const std::string& s, const std::string& what) {
      auto ep = dsec::parse_endpoint(s, what);
      if (!ep)
        throw py::value_error(ep.error_value().message);
      return py::make_tuple(ep->host, ep->port);
    },
    py::arg("text"), py::arg("what"),
    "(host, port) from 'HOST:PORT' or '[IPV6]:PORT' (dsec's own parser); ValueError naming "
    "the value and what is wrong");

  m.def("errc_names", [] {
    py::dict d;
    for (int c = 0; c < 256; ++c) {
      auto name = std::string{to_string(static_cast<errc>(c))};
      if (name != "unknown" && !name.empty())
        d[py::int_(c)] = name;
    }
    return d;
  });

  bind_values(m);
  bind_client(m);
  bind_session(m);
  bind_streams(m);
}

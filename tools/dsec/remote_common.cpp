#include "tools/dsec/remote_common.hpp"

#include "actors/client.hpp"
#include "actors/sandbox_id.hpp"

#include "runtime/json.hpp"
#include "runtime/pty.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <set>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "runtime/container.hpp"
#include "runtime/units.hpp"
#include "tools/dsec/remote.hpp"

namespace dsec::cli::remote {

// ---- the connection -------------------------------------------------------------

context::context(endpoint where, tls_options tls)
  : endpoint_(std::move(where)), where_(endpoint_.to_string()), tls_(std::move(tls)) {}

context::~context() {
  client_.reset(); // before the actor system it lives in
  sys_.reset();
}

expected<client*> context::connect() {
  if (client_)
    return client_.get();
  if (!sys_) {
    cfg_ = std::make_unique<caf::actor_system_config>();
    if (auto ok = client::configure(*cfg_, tls_); !ok) {
      auto e = std::move(ok).error_value();
      e.message = "--tls " + tls_.dir + ": " + e.message;
      cfg_.reset();
      return e;
    }
    cfg_->set("scheduler.policy", caf::atom("sharing"));
    cfg_->set("scheduler.max-threads", size_t{2});
    cfg_->set("logger.console", caf::atom("none"));
    sys_ = std::make_unique<caf::actor_system>(*cfg_);
  }
  auto c = client::connect(*sys_, endpoint_.host, endpoint_.port);
  if (!c)
    return std::move(c).error_value();
  client_ = std::move(*c);
  return client_.get();
}

// ---- helpers ----------------------------------------------------------------------

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    auto n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

int exec_failure_status(const error& e) {
  // The daemon's message is the runtime's: "step 'execve' failed: cannot
  // execute 'x' in the sandbox: ..." (the step itself does not cross the wire).
  const std::string& m = e.message;
  if (m.rfind("step 'execve' failed", 0) == 0)
    return e.code == errc::not_found ? 127 : 126;
  if (m.rfind("step 'chdir' failed", 0) == 0 || m.rfind("step 'setuid' failed", 0) == 0)
    return 126;
  return 0;
}

std::optional<int> check_daemon_sandbox_options(std::string_view verb, const sandbox_options& sb) {
  if (auto rc = check_sandbox_options(verb, sb))
    return rc;
  if (sb.no_memory || sb.no_pids)
    return usage_error(verb, std::string{sb.no_memory ? "--memory" : "--pids"}
                               + " none is for a local `dsec run`: a daemon's sandboxes get its "
                                 "--default-memory and --default-pids unless they ask for a "
                                 "size");
  return std::nullopt;
}

int take_session_id(args& a, std::string_view verb, std::string& id) {
  if (a.at_option())
    return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
  if (!id.empty())
    return usage_error(verb, "one session id at a time, got '" + std::string{a.peek()}
                               + "' too");
  id = a.next();
  return -1;
}

bool parse_exec_flag(args& a, exec_flags& f) {
  for (auto [flag, value] : {std::pair{"--trusted", &f.trusted}, {"--pristine", &f.pristine},
                             {"--idempotent", &f.idempotent}, {"--detach", &f.detach}})
    if (a.flag(flag)) {
      *value = true;
      return true;
    }
  if (a.flag("-i") || a.flag("--stdin")) {
    f.input = true;
    return true;
  }
  if (a.flag("-t") || a.flag("--tty")) {
    f.tty = true;
    return true;
  }
  if (a.flag("-it") || a.flag("-ti")) {
    f.input = f.tty = true;
    return true;
  }
  return false;
}

bool parse_u64(const std::string& v, uint64_t& out) {
  if (v.empty() || v.size() > 20)
    return false;
  char* end = nullptr;
  errno = 0;
  auto n = std::strtoull(v.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v.front() == '-')
    return false;
  out = n;
  return true;
}


std::string age(uint64_t ms) {
  uint64_t s = ms / 1000;
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%llus", static_cast<unsigned long long>(s));
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%llum%02llus", static_cast<unsigned long long>(s / 60),
                  static_cast<unsigned long long>(s % 60));
  else if (s < 86400)
    std::snprintf(buf, sizeof buf, "%lluh%02llum", static_cast<unsigned long long>(s / 3600),
                  static_cast<unsigned long long>(s % 3600 / 60));
  else
    std::snprintf(buf, sizeof buf, "%llud%02lluh", static_cast<unsigned long long>(s / 86400),
                  static_cast<unsigned long long>(s % 86400 / 3600));
  return buf;
}

std::string layers_of(const environment& env) {
  std::string s = env.base;
  if (!env.workdir.empty() || !env.tools.empty())
    s += "/" + (env.workdir.empty() ? std::string{"-"} : env.workdir);
  for (size_t i = 0; i < env.tools.size(); ++i)
    s += (i == 0 ? "/" : ",") + env.tools[i];
  return s;
}

// ---- exec and run --------------------------------------------------------------------

int status_of(const exec_result& r, const std::optional<std::chrono::milliseconds>& timeout) {
  if (r.timed_out) {
    std::fprintf(stderr, "dsec: timed out after %s; the command was killed\n",
                 timeout ? format_duration(*timeout).c_str() : "its timeout");
    return 124;
  }
  exit_status st{r.exit_code, r.signal};
  if (st.signal != 0)
    std::fprintf(stderr, "dsec: the command was %s%s\n", st.to_string().c_str(),
                 r.oom_killed ? " (out of memory: the --memory limit was reached)" : "");
  return st.shell_code();
}

int exec_error(const error& e, int code) {
  fail(e);
  int s = exec_failure_status(e);
  return s != 0 ? s : code;
}

exec_request make_request(const command_spec& cs, std::vector<std::string> argv) {
  exec_request req;
  req.argv = std::move(argv);
  req.env = cs.env;
  if (cs.cwd_given) // else the image's WorkingDir, or /
    req.cwd = cs.cwd;
  req.user = cs.user; // the sandbox looks it up in its image
  if (cs.timeout)
    req.timeout_ms = static_cast<uint64_t>(cs.timeout->count());
  return req;
}

const int broken_pipe_status = 128 + SIGPIPE;

bool print_pieces(const std::vector<log_piece>& pieces, std::pair<size_t, size_t> from) {
  for (size_t i = from.first; i < pieces.size(); ++i) {
    const auto& p = pieces[i];
    size_t off = i == from.first ? from.second : 0;
    FILE* to = p.stream == 2 ? stderr : stdout;
    if (off < p.data.size() && std::fwrite(p.data.data() + off, 1, p.data.size() - off, to) == 0)
      return false;
  }
  return std::fflush(stdout) == 0 && std::fflush(stderr) == 0;
}

void tell_dropped(const char* verb, uint64_t bytes, bool first) {
  if (bytes == 0)
    return;
  if (first)
    std::fprintf(stderr, "dsec: %s: the first %llu bytes are gone (the sandbox keeps the "
                         "latest 1 MiB of its detached commands' output)\n",
                 verb, static_cast<unsigned long long>(bytes));
  else
    std::fprintf(stderr, "dsec: %s: %llu bytes were dropped before dsec read them (the log "
                         "keeps the latest 1 MiB)\n",
                 verb, static_cast<unsigned long long>(bytes));
}

void print_output(uint8_t stream, std::string_view data) {
  if (!write_all(stream == 2 ? 2 : 1, data) && errno == EPIPE)
    ::_exit(broken_pipe_status);
}

void note_unsent_stdin(const exec_flags& f) {
  if (f.input || f.detach)
    return;
  struct stat st{};
  if (::fstat(0, &st) != 0)
    return;
  int waiting = 0; // bytes already in the pipe or socket, unread
  if (((S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) && ::ioctl(0, FIONREAD, &waiting) == 0
       && waiting > 0)
      || (S_ISREG(st.st_mode) && st.st_size > 0))
    std::fputs("dsec: note: our stdin is not sent to the command without -i (its stdin is "
               "empty)\n",
               stderr);
}

std::string sandbox_json(const sandbox_info& i) {
  std::string o = "{\"id\": ";
  json_string(o, i.id);
  o += ", \"session\": ";
  json_string(o, i.session);
  o += ", \"state\": ";
  json_string(o, i.state);
  o += ", \"node\": ";
  json_string(o, i.node);
  o += ", \"created_ms\": " + std::to_string(i.created_ms)
       + ", \"ttl_left_ms\": " + std::to_string(i.ttl_left_ms)
       + ", \"running\": " + std::to_string(i.running) + ", \"key\": ";
  if (i.key.empty())
    o += "null";
  else
    json_string(o, i.key);
  o += ", \"tags\": {";
  bool first = true;
  for (const auto& [k, v] : i.tags) {
    if (!first)
      o += ", ";
    first = false;
    json_string(o, k);
    o += ": ";
    json_string(o, v);
  }
  o += "}, \"exposed\": [";
  for (size_t k = 0; k < i.exposed.size(); ++k) {
    o += std::string{k ? ", " : ""} + "{\"port\": " + std::to_string(i.exposed[k].port)
         + ", \"address\": ";
    json_string(o, i.exposed[k].address());
    o += "}";
  }
  o += "], \"environment\": " + i.env.to_json() + "}";
  return o;
}

void fill_labels(client& c, std::vector<sandbox_info>& v) {
  std::map<std::string, std::pair<std::string, std::map<std::string, std::string>>> by_id;
  std::set<std::string> sessions;
  for (const auto& i : v)
    if (!i.session.empty())
      sessions.insert(i.session);
  for (const auto& sid : sessions) {
    auto s = c.find_session(sid);
    if (!s)
      continue;
    auto listed = (*s)->list();
    if (!listed)
      continue;
    for (auto& i : *listed) // "#N": dsec's own key of a create without one, no name
      by_id[i.id] = {i.key.rfind('#', 0) == 0 ? std::string{} : std::move(i.key),
                     std::move(i.tags)};
  }
  for (auto& i : v)
    if (auto it = by_id.find(i.id); it != by_id.end() && i.key.empty()) {
      i.key = it->second.first;
      i.tags = it->second.second;
    }
}

expected<std::string> resolve_sandbox(client& c, const std::string& name) {
  if (is_sandbox_id(name))
    return name;
  DSEC_TRY(all, c.list_all());
  fill_labels(c, all.sandboxes);
  std::vector<const sandbox_info*> named;
  for (const auto& i : all.sandboxes)
    if (i.key == name)
      named.push_back(&i);
  if (named.size() == 1)
    return named.front()->id;
  if (named.empty()) {
    std::string msg = "no sandbox " + name + " (no sandbox has that name, and a sandbox id is "
                      "12 hex digits; `ps` shows ids and names)";
    for (size_t k = 0; k < all.missing.size(); ++k)
      msg += (k ? ", " : "; these nodes did not answer: ") + all.missing[k];
    return make_error(errc::not_found, msg);
  }
  std::string ids;
  for (const auto* i : named)
    ids += (ids.empty() ? "" : ", ") + i->id + " (session " + i->session + ")";
  return make_error(errc::invalid_argument, "the name '" + name + "' is taken in " +
                                              std::to_string(named.size()) +
                                              " sessions: " + ids + "; use the id");
}

int take_one_sandbox(args& a, std::string_view verb, const char* usage, std::string_view name,
                     const one_sandbox_args& o, std::string& id) {
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(usage, stdout);
      return 0;
    }
    bool taken = false;
    for (const auto& [flag, into] : o.flags)
      if (!taken && a.flag(flag))
        taken = *into = true;
    for (const auto& [option, into] : o.options) {
      if (taken)
        break;
      auto got = a.option(option, *into);
      if (!got)
        return usage_error(verb, got.error_value().message);
      taken = *got;
    }
    if (taken)
      continue;
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    if (!id.empty())
      return usage_error(verb, "one sandbox at a time (dsec " + std::string{name} + " ID)");
    id = std::string{a.next()};
  }
  if (id.empty())
    return usage_error(verb, "no sandbox id given (dsec --connect HOST:PORT " + std::string{name} +
                               " ID)");
  return -1;
}

client* open_sandbox(context& ctx, std::string_view verb, std::string& id,
                     const std::string& exec_text, uint64_t& exec, int& rc) {
  exec = 0;
  if (!exec_text.empty() && (!parse_uint(exec_text, UINT64_MAX, exec) || exec == 0)) {
    rc = usage_error(verb, "--exec: expected a command's exec id (a number from `dsec inspect"
                           " ID`), got '" + exec_text + "'");
    return nullptr;
  }
  rc = 1;
  auto c = ctx.connect();
  if (!c) {
    fail(c.error_value());
    return nullptr;
  }
  auto named = resolve_sandbox(**c, id);
  if (!named) {
    fail(named.error_value());
    return nullptr;
  }
  id = *named;
  return *c;
}

int fail_for(const std::string& id, error e) {
  if (e.message.find(id) == std::string::npos)
    e.message = "sandbox " + id + ": " + e.message;
  return fail(e);
}

expected<logs_reply> detached_commands(client& c, const std::string& id, uint64_t exec) {
  logs_request q;
  q.output = false;
  q.exec = exec;
  return c.logs(id, q);
}

client* open_detached(context& ctx, std::string_view verb, std::string& id,
                      const std::string& exec_text, uint64_t& exec, logs_reply& commands,
                      int& rc) {
  auto* c = open_sandbox(ctx, verb, id, exec_text, exec, rc);
  if (!c)
    return nullptr;
  auto r = detached_commands(*c, id, exec);
  if (!r) {
    rc = fail_for(id, r.error_value());
    return nullptr;
  }
  commands = std::move(*r);
  return c;
}

int for_each_sandbox(client& c, const std::vector<std::string>& ids,
                     const std::function<expected<void>(const std::string& id)>& act) {
  int rc = 0;
  for (const auto& given : ids) {
    auto id = resolve_sandbox(c, given);
    auto done = id ? act(*id) : expected<void>{id.error_value()};
    if (!done)
      rc = fail(done.error_value());
  }
  return rc;
}

int take_sandbox_ids(args& a, std::string_view verb, const char* usage,
                     std::string_view synopsis, std::vector<std::string>& ids) {
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(usage, stdout);
      return 0;
    }
    if (a.peek() == "--") {
      a.rest(ids);
      break;
    }
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    ids.emplace_back(a.next());
  }
  if (ids.empty())
    return usage_error(verb, "no sandbox id given (" + std::string{synopsis} + ")");
  return -1;
}

} // namespace dsec::cli::remote

namespace dsec::cli::remote {

expected<exec_result> feed_stdin_and_wait(const std::shared_ptr<process>& p, bool& feeding) {
  auto running = std::make_shared<std::atomic<bool>>(true);
  auto failure = std::make_shared<std::optional<error>>();
  // (The thread owns a share of the handle: it may outlive this call.)
  std::thread feeder([p, running, failure] {
    std::string buf(128u << 10, '\0');
    for (;;) {
      auto n = ::read(0, buf.data(), buf.size());
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0) {
        failure->emplace(make_error(errc::system_error,
                                    std::string{"reading our stdin: "} + std::strerror(errno)));
        (void) p->close_stdin();
        break;
      }
      if (n == 0) {
        (void) p->close_stdin(); // closed already (it ended): nothing to say
        break;
      }
      // Waits while the daemon holds its bound of the command's stdin.
      if (!p->write(std::string_view{buf.data(), static_cast<size_t>(n)}))
        break; // it closed its stdin or ended: the rest is not for it
    }
    running->store(false);
  });
  auto r = p->wait();
  feeding = running->load();
  if (feeding)
    feeder.detach();
  else
    feeder.join();
  if (!feeding && *failure && r)
    std::fprintf(stderr, "dsec: %s\n", (*failure)->message.c_str());
  return r;
}

void prepare_terminal(const exec_flags& f) {
  if (!f.tty)
    return;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGWINCH);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

expected<exec_result>
run_on_terminal(const std::function<std::shared_ptr<process>(exec_request&)>& start,
                exec_request req, bool input, bool& feeding) {
  auto local_size = [] {
    for (int fd : {0, 1, 2})
      if (auto w = pty::size_of(fd))
        return w;
    return std::optional<pty::window>{};
  };
  auto w = local_size().value_or(pty::window{});
  req.tty = true;
  req.rows = w.rows;
  req.cols = w.cols;
  req.open_stdin = input;
  // Our keys go as they are (^C is a byte for the sandbox's terminal, which
  // makes it SIGINT there), and what it echoes is all we show.
  if (input && ::isatty(0))
    (void) pty::make_raw(0);
  std::shared_ptr<process> p = start(req);
  // Our window's changes go to its terminal (the thread holds no share of
  // the handle: it may outlive it).
  std::weak_ptr<process> weak = p;
  std::thread([weak, local_size] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGWINCH);
    for (;;) {
      int sig = 0;
      if (::sigwait(&set, &sig) != 0)
        continue;
      auto proc = weak.lock();
      if (!proc)
        return;
      if (auto now = local_size())
        proc->resize_async(now->rows, now->cols, [](expected<void>) {});
    }
  }).detach();
  expected<exec_result> r = make_error(errc::sandbox_failed, "not run");
  if (input)
    r = feed_stdin_and_wait(p, feeding);
  else
    r = p->wait();
  pty::restore();
  return r;
}

} // namespace dsec::cli::remote

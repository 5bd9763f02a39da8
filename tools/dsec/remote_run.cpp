// dsec --connect HOST:PORT run: a command in a fresh sandbox of the daemon, its
// output streamed to ours; the sandbox goes when the command ends (or when dsec
// is interrupted), unless --detach leaves it running.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/sandbox_id.hpp"
#include "runtime/units.hpp"
#include "runtime/pty.hpp"
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"
#include "tools/dsec/run_options.hpp"

namespace dsec::cli::remote {

namespace {

const char* run_usage = R"(usage: dsec --connect HOST:PORT run [OPTIONS] [-- CMD [ARGS...]]

Creates a sandbox in the daemon from layers of the daemon's store and runs CMD
in it (without CMD: an OCI image's Entrypoint and Cmd). Without --detach, CMD's stdout and stderr are streamed to ours as they
come, dsec exits with its status, and the sandbox is destroyed: it lives in a
session of its own, which the daemon closes when CMD ends, when dsec is
interrupted (SIGINT, SIGTERM, SIGHUP) or when dsec dies. With --detach, dsec
starts CMD, prints the sandbox's id and exits; the sandbox lives until
`rm ID`, its TTL, or the end of its session.

Sandbox and session:
  --detach                 leave CMD running in the background and print the
                           sandbox id; its output goes to the sandbox's log
                           (`dsec logs ID [-f]`; `wait ID`, `kill ID`)
  --session ID             the session to create the sandbox in (from `session
                           open`); default: with --detach the daemon's "default"
                           session, else a session of its own. Without --detach
                           the sandbox is still destroyed when CMD ends.
  --ttl DUR                the sandbox's lifetime (e.g. 10m, 2h, 1h30m); default: its
                           session's (1h unless `session open --ttl` said)
  --key KEY                the create's key (e.g. an episode id): in a resumed
                           session it gets the sandbox the log made for KEY
                           (docs/trajectory.md); at most one live per session
  --name NAME              the same as --key: the sandbox's name, which `exec`,
                           `cp`, `rm`, `inspect`, `pause` and `resume` take
                           wherever an id goes (unique in its session; not 12
                           hex digits) and `ps` shows
  --tag NAME=VALUE         a tag for the sandbox (repeatable), shown by the
                           session's list and `ps --filter label=NAME=VALUE`;
                           --label is the same
  --backend NAME           container (default) or microvm: a QEMU microVM
                           booting the same layers (docs/microvm.md), on a
                           node that offers it (dsecd --microvm-slots)
  --chronus                give the sandbox Chronus: the `chronus` client, for
                           trusted commands (`exec --trusted`) to report stages
                           and ask for feedback; see `session watch` and
                           `feedback`
  --trusted                run CMD as a trusted command (needs --chronus; see
                           `exec --help`)
  --pristine               with --trusted: CMD runs in the pristine root, the
                           agent's files read-only at /.dsec/agent

Layers (in the daemon's store):
  --base NAME@VERSION      the base image (required, unless --snapshot)
  --workdir NAME@VERSION   a working-directory layer
  --tool NAME@VERSION      a tool layer; repeat for several (the last on top)
  --snapshot NAME@VERSION  start from a diff layer (`dsec snapshot`): the
                           environment it records (its base, workdir, tools,
                           and the diffs below it), the diff on top; --tool
                           adds tools above it; no --base or --workdir

Environment of the command:
  -i, --stdin              stream our stdin to CMD as it reads it, then its end
                           (back-pressure: dsec reads on only as the daemon takes
                           it; the daemon holds at most 256 KiB beyond CMD's
                           pipe); with --detach it is read to its end first and
                           sent whole. Without -i CMD's stdin is empty (dsec
                           says so when ours holds data)
  -t, --tty                CMD on a terminal of the sandbox (a pty), sized as
                           ours and resized with it; with -i (-it) our stdin goes
                           as it is, ours in raw mode while CMD runs (as `exec -t`
                           does: see `dsec exec --help`). Not with --detach
  -e, --env KEY[=VALUE]    add or replace a variable (repeatable); a bare
                           KEY takes our own value (none: left out); the defaults
                           are PATH, HOME=/root, LANG=C.UTF-8 and the daemon's TERM,
                           under an OCI image's Env
  --env-file FILE          variables from FILE, a KEY[=VALUE] a line (# and
                           blank lines skipped)
  -w, --cwd DIR            working directory inside the sandbox (default: an OCI
                           image's WorkingDir, else /)
  -u, --user USER[:GROUP]  run as this user of the sandbox (default: an OCI
                           image's User, else 0, the sandbox's root, which has no
                           privileges on the host): names or numbers, looked up
                           in the base's /etc/passwd and /etc/group (uid, gid,
                           supplementary groups, HOME, USER; see `exec --help`)

Isolation and limits:
  --net                    a private network namespace with a working loopback;
                           without it the sandbox has no network, not even loopback
                           (a synonym of --network loopback)
  --network MODE           none (the default), loopback, or egress: a veth to the
                           node, an address from its --sandbox-net, a default
                           route, and out through its --uplink by the policy:
  --allow RULE             egress allowed to RULE (repeatable): CIDR[:PORT[-PORT]]
                           (TCP and UDP), DOMAIN or *.DOMAIN (resolved through
                           the node's DNS proxy, its answers admitted for their
                           TTL), or a service the node names (dsecd
                           --services). Everything else is denied; private,
                           link-local (169.254.169.254) and the node's denied
                           ranges even under a wider rule, unless a rule names a
                           network inside them; the node itself always
                           (docs/network.md)
  --deny RULE              denied even where an --allow rule says otherwise
                           (`dsec net ID` changes both on a live sandbox)
  --expose PORT            forward a fresh port of the node (its
                           --expose-address, 127.0.0.1 unless set) to TCP PORT on
                           the sandbox's loopback (repeatable; needs --net or
                           --network loopback|egress). Printed to stderr as
                           `dsec: ID: port PORT at HOST:HOSTPORT`; `dsec ps` shows
                           it; `dsec expose ID PORT` adds one later
  -v, --volume HOST:SANDBOX[:OPTS]
                           bind-mount the node's directory or file HOST at
                           SANDBOX (made if missing; repeatable, 16 at most):
                           read-only unless :rw. The node must allow it (dsecd
                           --allow-host-mount DIR[:rw], else refused); its files
                           keep their host owners; nosuid, nodev. OPTS, comma-
                           separated: ro or rw; rbind (the mounts beneath HOST
                           too); noidmap (for a filesystem that cannot be
                           idmapped: owners the sandbox does not map show as
                           nobody)
  --memory SIZE            memory limit (e.g. 512m, 2g); OOM kills inside. It
                           also bounds the writable layer (a tmpfs: its pages are
                           charged to the sandbox). Default: the node's
                           --default-memory (`node stats` shows it)
  --pids N                 most processes and threads at once (default: the
                           node's --default-pids)
  --cpus N                 CPU bandwidth, in CPUs (e.g. 0.5, 2; default: none)
  --disk SIZE              size of the writable layer (default: the node's
                           --default-disk); it holds at most one file or
                           directory per 4 KiB of SIZE (at least 1024)
  --timeout DUR            kill CMD after DUR (e.g. 30s, 500ms, 2m, 1h30m); then dsec
                           exits with 124 (with --detach: CMD is killed, the
                           sandbox stays)
  --idempotent             CMD is safe to run again; a detached CMD in a session
                           with a trajectory log must be (`session open
                           --trajectory`, docs/trajectory.md)

Other:
  -h, --help               this text

Exit status: CMD's exit_code, as the API reports it: its own status, 128+N if a
signal N killed it; 124 on timeout (its exit_code is 137 then);
126 if CMD cannot be executed (or --cwd, --user do not work), 127 if it is not
found; 125 if dsec or the daemon failed (the message says why); 2 on a usage
error. With --detach: 0 once CMD runs, else the same codes.
)";

// While a foreground `run` lasts, SIGINT, SIGTERM and SIGHUP destroy its
// sandbox (closing its session, when it is its own) before dsec exits 128+N.
class interrupt_guard {
public:
  interrupt_guard() : st_(std::make_shared<state>()) {
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGINT, SIGTERM, SIGHUP})
      sigaddset(&set, s);
    // Blocked before the actor system starts: its threads inherit the mask.
    ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread([st = st_, set] {
      int sig = 0;
      while (::sigwait(&set, &sig) != 0) {
      }
      std::string why = std::string{"SIG"} + ::sigabbrev_np(sig);
      finish(*st, why.c_str(), 128 + sig);
    }).detach();
  }
  ~interrupt_guard() { disarm(); }

  void watch(session* s, bool owned) {
    std::lock_guard<std::mutex> g{st_->mu};
    st_->sess = s;
    st_->owned = owned;
  }
  void sandbox(const std::string& id) {
    std::lock_guard<std::mutex> g{st_->mu};
    st_->id = id;
  }
  /// Destroys the sandbox (unless disarmed; saying why, if `why`) and exits
  /// with `status`.
  [[noreturn]] void abandon(const char* why, int status) { finish(*st_, why, status); }

  /// From now on a signal just ends dsec (the cleanup is ours).
  void disarm() {
    std::lock_guard<std::mutex> g{st_->mu};
    st_->done = true;
  }

private:
  struct state {
    std::mutex mu;
    session* sess = nullptr;
    bool owned = false;
    std::string id;
    bool done = false;
  };

  [[noreturn]] static void finish(state& st, const char* why, int status) {
    std::lock_guard<std::mutex> g{st.mu}; // held until _exit: the main thread waits
    pty::restore(); // a terminal of ours in raw mode (-it) is itself again
    if (!st.done && st.sess) {
      if (why)
        std::fprintf(stderr, "dsec: %s: destroying the sandbox\n", why);
      if (st.owned)
        (void) st.sess->close();
      else if (!st.id.empty())
        (void) st.sess->destroy(st.id);
    }
    std::fflush(stdout);
    ::_exit(status);
  }

  std::shared_ptr<state> st_; // shared with the signal thread, which outlives us
};

// The ports a sandbox exposes from its creation (--expose), where the node
// forwards them from, on stderr (stdout stays the id or the command's own).
void print_exposed(session& s, const std::string& id, const environment& env) {
  if (env.expose.empty())
    return;
  auto all = s.list();
  if (!all)
    return (void) fail(all.error_value());
  for (const auto& info : *all)
    if (info.id == id)
      for (const auto& p : info.exposed)
        std::fprintf(stderr, "dsec: %s: port %u at %s\n", id.c_str(),
                     static_cast<unsigned>(p.port), p.address().c_str());
}

} // namespace

int run_main(context& ctx, args& a) {
  auto verb = ctx.verb("run");
  constexpr int dsec_failed = 125;
  sandbox_options sb;
  command_spec cs;
  exec_flags f;
  bool chronus = false;
  std::string backend{backend_container};
  std::string session_id;
  std::optional<std::chrono::milliseconds> ttl;
  create_labels labels;
  std::vector<std::string> argv;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(run_usage, stdout);
      return 0;
    }
    if (a.peek() == "--") {
      a.rest(argv);
      break;
    }
    auto p = parse_sandbox_option(a, verb, sb);
    if (p == parsed::no)
      p = parse_command_option(a, verb, cs);
    if (p == parsed::bad)
      return 2;
    if (p == parsed::yes)
      continue;
    if (parse_exec_flag(a, f))
      continue;
    if (a.flag("--chronus")) {
      chronus = true;
      continue;
    }
    std::string v;
    auto got = a.option("--backend", v);
    if (!got)
      return usage_error(verb, got.error_value().message);
    if (*got) {
      if (v.empty())
        return usage_error(verb, "--backend needs a name (container or microvm)");
      backend = v;
      continue;
    }
    got = a.option("--session", v);
    if (!got)
      return usage_error(verb, got.error_value().message);
    if (*got) {
      if (v.empty())
        return usage_error(verb, "--session needs a session id");
      session_id = v;
      continue;
    }
    for (const char* opt : {"--key", "--name"}) {
      got = a.option(opt, v);
      if (!got || *got)
        break;
    }
    if (!got)
      return usage_error(verb, got.error_value().message);
    if (*got) {
      if (v.empty())
        return usage_error(verb, "--key/--name needs a name");
      if (is_sandbox_id(v))
        return usage_error(verb, "--name '" + v + "' has the form of a sandbox id (12 hex "
                                 "digits): choose another");
      labels.key = v;
      continue;
    }
    for (const char* opt : {"--tag", "--label"}) {
      got = a.option(opt, v);
      if (!got || *got)
        break;
    }
    if (!got)
      return usage_error(verb, got.error_value().message);
    if (*got) {
      auto eq = v.find('=');
      if (eq == std::string::npos || eq == 0)
        return usage_error(verb, "--tag/--label: expected NAME=VALUE, got '" + v + "'");
      labels.tags[v.substr(0, eq)] = v.substr(eq + 1);
      continue;
    }
    got = a.option("--ttl", v);
    if (!got)
      return usage_error(verb, got.error_value().message);
    if (*got) {
      auto d = parse_duration(v, "--ttl");
      if (!d)
        return usage_error(verb, d.error_value().message);
      if (d->count() <= 0)
        return usage_error(verb, "--ttl: must be positive");
      ttl = *d;
      continue;
    }
    for (const char* local : {"--hostname", "--timings"})
      if (a.peek() == local || a.peek().starts_with(std::string{local} + "="))
        return usage_error(verb, std::string{local}
                                   + " is only available to a local run (without --connect)");
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    return usage_error(verb, "unexpected argument '" + std::string{a.peek()}
                               + "' (put the command after --)");
  }
  if (f.trusted && !chronus)
    return usage_error(verb, "--trusted needs --chronus (a trusted command needs a sandbox "
                             "with Chronus)");
  if (f.pristine && !f.trusted)
    return usage_error(verb, "--pristine needs --trusted");
  if (auto rc = check_daemon_sandbox_options(verb, sb))
    return *rc;
  environment env = sb.env;
  env.chronus = chronus;
  env.backend = backend;
  {
    bool known = false;
    for (auto b : known_backends())
      known = known || b == backend;
    if (!known || backend == backend_function)
      return usage_error(verb, "--backend: expected container or microvm, got '" + backend
                                 + "' (the function backend is `call`)");
  }
  if (ttl)
    env.ttl_ms = static_cast<uint64_t>(ttl->count());
  auto req = make_request(cs, std::move(argv));
  f.apply(req);
  if (f.input && f.detach) { // nobody stays to feed it: whole, up front
    auto in = read_all(0, "stdin", "reading");
    if (!in)
      return fail(in.error_value(), dsec_failed);
    req.input = std::move(*in);
  }

  note_unsent_stdin(f);
  if (f.tty && f.detach)
    return usage_error(verb, "-t needs dsec to stay: not with --detach");
  prepare_terminal(f); // before the actor system's threads
  // SIGINT, SIGTERM, SIGHUP: the sandbox goes (it is not half made and left).
  interrupt_guard guard;
  // One sandbox, with the key and tags if given (a resumed session gives a
  // key the sandbox its log has).
  auto create_one = [&](session& s) -> expected<std::vector<std::string>> {
    if (labels.key.empty() && labels.tags.empty())
      return s.create(env, 1, [&](const std::string& ready) { guard.sandbox(ready); });
    DSEC_TRY(made, s.create(env, 1, labels,
                            [&](const created_sandbox& c) { guard.sandbox(c.id); }));
    std::vector<std::string> ids;
    for (auto& m : made)
      ids.push_back(std::move(m.id));
    return ids;
  };
  if (f.detach) {
    auto c = ctx.connect();
    if (!c)
      return fail(c.error_value(), dsec_failed);
    auto s = (*c)->find_session(session_id.empty() ? "default" : session_id);
    if (!s)
      return fail(s.error_value(), dsec_failed);
    guard.watch(s->get(), false);
    auto ids = create_one(**s);
    if (!ids)
      return fail(ids.error_value(), dsec_failed);
    if (ids->empty())
      return fail(make_error(errc::sandbox_failed, "the daemon created no sandbox"),
                  dsec_failed);
    const auto& id = ids->front();
    print_exposed(**s, id, env);
    req.detach = true;
    auto r = (*s)->exec(id, req);
    guard.disarm();
    if (!r) {
      (void) (*s)->destroy(id);
      return exec_error(r.error_value(), dsec_failed);
    }
    std::printf("%s\n", id.c_str());
    return 0;
  }

  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value(), dsec_failed);
  bool owned = session_id.empty();
  std::unique_ptr<session> s;
  if (owned) {
    session_options opts;
    opts.quota = 1;
    if (ttl)
      opts.default_ttl_ms = static_cast<uint64_t>(ttl->count());
    opts.name = "dsec run";
    auto got = (*c)->open_session(opts, true);
    if (!got)
      return fail(got.error_value(), dsec_failed);
    s = std::move(*got);
  } else {
    auto got = (*c)->find_session(session_id);
    if (!got)
      return fail(got.error_value(), dsec_failed);
    s = std::move(*got);
  }
  guard.watch(s.get(), owned);
  // Closing the session (ours) or destroying the sandbox (in someone else's).
  auto cleanup = [&](const std::string& id) {
    guard.disarm();
    if (owned) {
      if (auto n = s->close(); !n)
        fail(n.error_value());
    } else if (!id.empty()) {
      if (auto d = s->destroy(id); !d)
        fail(d.error_value());
    }
  };
  std::string id;
  auto ids = create_one(*s);
  if (!ids || ids->empty()) {
    fail(ids ? make_error(errc::sandbox_failed, "the daemon created no sandbox")
             : ids.error_value());
    cleanup({});
    return dsec_failed;
  }
  id = ids->front();
  print_exposed(*s, id, env);
  auto on_output = [&guard](uint8_t stream, std::string_view data) {
    if (!write_all(stream == 2 ? 2 : 1, data) && errno == EPIPE)
      guard.abandon(nullptr, broken_pipe_status); // quietly, as SIGPIPE would
  };
  expected<exec_result> r = make_error(errc::sandbox_failed, "not run");
  bool feeding = false;
  if (f.tty) {
    r = run_on_terminal(
      [&](exec_request& q) -> std::shared_ptr<process> { return s->start(id, q, on_output); },
      req, f.input, feeding);
  } else if (f.input) {
    // Streamed as CMD reads it (remote_exec.cpp's -i).
    req.open_stdin = true;
    std::shared_ptr<process> p = s->start(id, req, on_output);
    r = feed_stdin_and_wait(p, feeding);
  } else {
    r = s->exec(id, req, on_output);
  }
  // If a signal is being handled, this waits for it (and dsec ends there),
  // rather than report the sandbox it destroys.
  guard.disarm();
  int rc = r ? status_of(*r, cs.timeout) : exec_error(r.error_value(), dsec_failed);
  cleanup(id);
  if (feeding) { // our reader still waits on our stdin, holding the handle
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(rc);
  }
  return rc;
}

} // namespace dsec::cli::remote

// dsec --connect HOST:PORT exec: a command in one of the daemon's sandboxes, its
// output streamed to ours as it comes.
#include <pthread.h>
#include <unistd.h>
#include <signal.h>
#include <string.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "runtime/pty.hpp"
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"
#include "tools/dsec/run_options.hpp"

namespace dsec::cli::remote {

namespace {

const char* exec_usage = R"(usage: dsec --connect HOST:PORT exec [OPTIONS] ID -- CMD [ARGS...]

Runs CMD in the daemon's sandbox ID, streams its stdout and stderr to ours as
they come, and exits with its status.

Options:
  -i, --stdin            stream our stdin to CMD as it reads it (with
                         back-pressure: dsec reads on only as the daemon takes
                         it, and the daemon holds at most 256 KiB of it beyond
                         CMD's pipe), then its end; if CMD closes its stdin or
                         ends first, the rest is not read. With --detach our
                         stdin is read to its end first and sent whole.
                         Without -i CMD's stdin is empty (dsec says so when
                         ours holds data)
  -t, --tty              run CMD on a terminal of the sandbox (a pty: CMD is a
                         session leader with it as controlling terminal, at its
                         stdin, stdout and stderr; one output stream), sized as
                         ours (24x80 when we have none) and resized with our
                         window; TERM=xterm-256color unless -e sets it. With -i
                         (-it) our stdin goes as it is: a terminal of ours is in
                         raw mode while CMD runs (restored on every way out), so
                         ^C, ^Z, ^D are keys for CMD's terminal, not for dsec;
                         the end of our stdin types ^D there. Without -i CMD's
                         terminal gets ^D at once. Not with --detach or --trusted
  -e, --env KEY[=VALUE]  add or replace a variable (repeatable); a bare
                         KEY takes our own value (none: left out); the defaults are
                         PATH, HOME=/root, LANG=C.UTF-8 and the daemon's TERM,
                         under an OCI image's Env
  --env-file FILE        variables from FILE, a KEY[=VALUE] a line (# and
                         blank lines skipped)
  -w, --cwd DIR          working directory inside the sandbox (default: an OCI
                         image's WorkingDir, else /)
  -u, --user USER[:GROUP] run as this user of the sandbox (default: an OCI
                         image's User, else 0, the sandbox's root): names or
                         numbers (UID[:GID]) the sandbox looks up in its
                         base's /etc/passwd and /etc/group (not in what the
                         agent wrote): uid, gid, supplementary groups, HOME
                         and USER (unless --env sets them); an unknown name
                         gives 126, a number with no entry is that uid alone
  --timeout DUR          kill CMD (and its process group) after DUR, e.g. 30s,
                         500ms, 2m; then the exit status is 124
  --trusted              run CMD as a trusted command (a grader): it reaches
                         Chronus over a channel of its own at fd 3
                         ($CHRONUS_FD), its PATH starts with /.dsec/bin (dsec's
                         `chronus`, which the agent cannot replace), and the
                         sandbox's other commands cannot trace, signal or read
                         it. The sandbox must have been made with `run --chronus`
  --pristine             with --trusted: CMD's root is the sandbox's layers
                         without anything the agent wrote (a private /tmp), and
                         the agent's files are read-only at /.dsec/agent; so
                         CMD runs the image's own interpreters (docs/chronus.md)
  --detach               leave CMD running in the background; dsec prints its
                         exec id and exits 0 once it runs. Its output goes to
                         the sandbox's log of detached commands (`dsec logs
                         ID`, `wait`, `kill`; their --exec takes the id). In
                         a session whose log answers it, nothing is printed
  --idempotent           CMD is safe to run again: in a session with a
                         trajectory log no pack is taken after it, and a
                         resume that rebuilds the sandbox runs it again
  -h, --help             this text

Exit status: CMD's exit_code, as the API reports it: its own status, 128+N if a
signal N killed it; 124 if --timeout fired (as timeout(1): its exit_code is
137 then); 126 if CMD cannot be executed (or --cwd, --user do not work), 127 if it
is not found; 1 if the daemon reported an error (an unknown sandbox, ...) or
cannot be reached; 2 on a usage error. Interrupting dsec (SIGINT, SIGTERM,
SIGHUP) stops CMD, as with `run`: dsec says so and exits 128+N, and the daemon
kills CMD and its process group; the sandbox stays. (With --detach, CMD is not
stopped: it runs on until it ends or the sandbox is removed.)
)";

// SIGINT, SIGTERM and SIGHUP while CMD runs: say so and exit 128+N. The
// daemon kills CMD (and its process group) when the stream it sends CMD's
// output to goes away, as `run` does with its whole sandbox; the sandbox stays.
// Blocked before the actor system starts, so that its threads inherit the mask
// and the signal reaches this thread only.
void stop_on_interrupt() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGHUP})
    sigaddset(&set, s);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int sig = 0;
    while (::sigwait(&set, &sig) != 0) {
    }
    pty::restore(); // a terminal of ours in raw mode (-it) is itself again
    std::fprintf(stderr, "dsec: SIG%s: stopping the command (the sandbox stays)\n",
                 ::sigabbrev_np(sig));
    std::fflush(stdout);
    ::_exit(128 + sig);
  }).detach();
}

} // namespace

int exec_main(context& ctx, args& a) {
  auto verb = ctx.verb("exec");
  command_spec cs;
  exec_flags f;
  std::string id;
  std::vector<std::string> argv;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(exec_usage, stdout);
      return 0;
    }
    if (a.peek() == "--") {
      if (id.empty())
        return usage_error(verb, "no sandbox id given before --");
      a.rest(argv);
      break;
    }
    if (parse_exec_flag(a, f))
      continue;
    auto p = parse_command_option(a, verb, cs);
    if (p == parsed::bad)
      return 2;
    if (p == parsed::yes)
      continue;
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    if (!id.empty())
      return usage_error(verb, "unexpected argument '" + std::string{a.peek()}
                                 + "' (put the command after --)");
    id = a.next();
  }
  if (id.empty())
    return usage_error(verb, "no sandbox id given (exec [OPTIONS] ID -- CMD [ARGS...])");
  if (argv.empty())
    return usage_error(verb, "no command given (exec [OPTIONS] ID -- CMD [ARGS...])");
  if (f.pristine && !f.trusted)
    return usage_error(verb, "--pristine needs --trusted");
  if (f.tty && f.detach)
    return usage_error(verb, "-t needs dsec to stay: not with --detach");
  auto req = make_request(cs, std::move(argv));
  f.apply(req);
  if (f.input && f.detach) {
    // Nobody stays to feed it: the input goes whole, up front.
    auto in = read_all(0, "stdin", "reading");
    if (!in)
      return fail(in.error_value());
    req.input = std::move(*in);
  }
  note_unsent_stdin(f);
  // Before any thread starts (the actor system's, the signal thread below):
  // they inherit the mask, so SIGWINCH reaches only the thread that waits for it.
  prepare_terminal(f);
  if (!f.detach) // before the actor system's threads start, which inherit the mask
    stop_on_interrupt();
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  if (auto named = resolve_sandbox(**c, id); named)
    id = *named;
  else
    return fail(named.error_value());
  if (f.detach) {
    // Through a handle, which hears the command's exec id once it runs: the
    // one `logs --exec`, `wait --exec` and `kill --exec` take.
    req.detach = true;
    auto p = (*c)->start(id, req);
    auto eid = p->id();
    if (!eid && eid.error_value().code == errc::unsupported) {
      // A backend without process handles (microVM, simulated) keeps no
      // log of detached commands either: started, no id to print.
      if (auto r = (*c)->exec(id, req); !r)
        return exec_error(r.error_value(), 1);
      return 0;
    }
    if (!eid)
      return exec_error(eid.error_value(), 1);
    if (auto r = p->wait(); !r)
      return exec_error(r.error_value(), 1);
    if (*eid != 0) // (0: a session's log answered it; it does not run now)
      std::printf("%llu\n", static_cast<unsigned long long>(*eid));
    return 0;
  }
  if (f.tty) {
    bool feeding = false;
    auto r = run_on_terminal(
      [&](exec_request& q) -> std::shared_ptr<process> { return (*c)->start(id, q, print_output); },
      req, f.input, feeding);
    int rc = r ? status_of(*r, cs.timeout) : exec_error(r.error_value(), 1);
    std::fflush(stdout);
    std::fflush(stderr);
    if (feeding) // our reader still waits on our stdin, holding the handle
      ::_exit(rc);
    return rc;
  }
  if (f.input) {
    // Streamed as CMD reads it, through a process handle (back-pressure:
    // neither we nor the daemon hold more than a bounded piece of it).
    req.open_stdin = true;
    std::shared_ptr<process> p = (*c)->start(id, req, print_output);
    bool feeding = false;
    auto r = feed_stdin_and_wait(p, feeding);
    int rc = r ? status_of(*r, cs.timeout) : exec_error(r.error_value(), 1);
    if (feeding) { // our reader still waits on our stdin, holding the handle
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(rc);
    }
    return rc;
  }
  auto r = (*c)->exec(id, req, print_output);
  if (!r)
    return exec_error(r.error_value(), 1);
  return status_of(*r, cs.timeout);
}

} // namespace dsec::cli::remote

// dsec --connect HOST:PORT attach ID: follows one detached command of a
// sandbox (its output from now on, its end, its exit status), passing our
// signals on to it (docs/actors.md, "Logs").
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

namespace dsec::cli::remote {

namespace {

const char* attach_usage = R"(usage: dsec --connect HOST:PORT attach ID [--exec N] [--logs] [--no-sig-proxy]

Attaches to a detached command of sandbox ID (or its name): the CMD `run
--detach` started, or command N. Prints its output from now on (stdout to
ours, stderr to our stderr) as it writes it, and when it has ended exits with
its status, as `exec` would: its code, 128+N if signal N killed it. If it had
ended already, that status at once. A background process of it that still
holds its output open is followed too, as `logs -f` does.

A detached command reads no stdin (it has /dev/null): attach forwards none,
and with no terminal of its own it has none to attach to (`exec -it` runs an
interactive command instead).

SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 that dsec receives are
sent on to the command's process group (so ^C interrupts it, as docker attach
does); dsec goes on until the command ends. With --no-sig-proxy, the first of
them detaches instead: dsec says so and exits 128+N, and the command runs on.

Options:
  --exec N          command N (its exec id: `dsec inspect ID` lists them)
  --logs            first print what the sandbox's log holds of its output
  --no-sig-proxy    signals detach dsec instead of reaching the command
  -h, --help        this text

Exit status: the command's, once it ended; 128+N when signal N detached dsec
(--no-sig-proxy); 1 when the sandbox has no such command or ended before it,
the daemon reported an error or cannot be reached; 2 on a usage error.
)";

// The signals attach takes, blocked before the actor system starts so that
// its threads inherit the mask and only our waiter sees them.
sigset_t proxied() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2})
    sigaddset(&set, s);
  return set;
}

} // namespace

int attach_main(context& ctx, args& a) {
  auto verb = ctx.verb("attach");
  std::string id, exec_text;
  bool logs = false, no_proxy = false;
  if (int rc = take_one_sandbox(a, verb, attach_usage, "attach", {{{"--exec", &exec_text}},
                                {{"--logs", &logs}, {"--no-sig-proxy", &no_proxy}}},
                                id);
      rc >= 0)
    return rc;
  auto set = proxied();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  uint64_t exec = 0;
  int rc = 0;
  logs_reply commands;
  auto* c = open_detached(ctx, verb, id, exec_text, exec, commands, rc);
  if (!c)
    return rc;
  if (commands.commands.empty())
    return fail(make_error(errc::not_found, "sandbox " + id + " has no detached command to "
                                            "attach to (`run --detach -- CMD`, `exec --detach`)"));
  const uint64_t target = exec ? exec : commands.commands.front().exec;
  static std::atomic<bool> leaving{false};
  struct mark_leaving {
    ~mark_leaving() { leaving = true; }
  } on_return;
  std::thread([c, id, target, set, no_proxy] {
    for (;;) {
      int sig = 0;
      if (::sigwait(&set, &sig) != 0)
        continue;
      if (leaving.load()) // we are ending, and the client with us
        ::_exit(128 + sig);
      if (no_proxy) {
        std::fflush(stdout);
        std::fprintf(stderr, "dsec: SIG%s: detached from command %llu of %s (it runs on)\n",
                     ::sigabbrev_np(sig), static_cast<unsigned long long>(target), id.c_str());
        ::_exit(128 + sig);
      }
      // (This thread lives on, in sigwait, while main destroys the actor
      // system: the client leaves it no pin on CAF's logger, thread_guard.hpp.)
      if (auto r = c->signal(id, target, sig); !r)
        std::fprintf(stderr, "dsec: attach: SIG%s not passed on: %s\n", ::sigabbrev_np(sig),
                     r.error_value().message.c_str());
    }
  }).detach();

  logs_request q;
  q.exec = target;
  q.output = logs;
  auto r = c->logs(id, q); // where the log is now (and, with --logs, what it holds)
  if (!r)
    return fail_for(id, r.error_value());
  if (logs && !print_pieces(r->pieces))
    return 1;
  q.output = true;
  for (;;) {
    q.since = r->next;
    bool live = false;
    for (const auto& x : r->commands)
      if (x.exec == target) {
        live = x.running || x.open;
        if (!live)
          return x.exit_code;
      }
    if (!r->live && !live)
      break;
    q.wait = true;
    r = c->logs(id, q);
    if (!r)
      return fail_for(id, r.error_value());
    tell_dropped("attach", r->dropped, false);
    if (!print_pieces(r->pieces))
      return 1;
  }
  return fail(make_error(errc::closed, "sandbox " + id + " ended while command " +
                                         std::to_string(target) + " ran"));
}

} // namespace dsec::cli::remote

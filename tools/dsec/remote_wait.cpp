// dsec --connect HOST:PORT wait ID: waits for a sandbox's detached command to
// end and prints its exit code (docs/actors.md, "Logs").
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

#include <cstdio>
#include <string>

namespace dsec::cli::remote {

namespace {

const char* wait_usage = R"(usage: dsec --connect HOST:PORT wait ID [--exec N]

Waits until a detached command of sandbox ID has ended, and prints its exit
code: the CMD `run --detach` started (the sandbox's first detached command),
or command N. At once if it has ended already. The code is the one `exec`
exits with: its own status, 128+N if signal N killed it (137 for its
--timeout, which `dsec inspect` shows as timed out). ID may be the sandbox's
name. The sandbox stays; interrupting dsec stops only dsec.

Options:
  --exec N       command N (its exec id: `dsec inspect ID` lists the detached
                 commands)
  -h, --help     this text

Exit status: 0 once the code is printed; 1 when the sandbox has no such
command, ended before the command did, the daemon reported an error or
cannot be reached; 2 on a usage error.
)";

} // namespace

int wait_main(context& ctx, args& a) {
  auto verb = ctx.verb("wait");
  std::string id, exec_text;
  if (int rc = take_one_sandbox(a, verb, wait_usage, "wait", {{{"--exec", &exec_text}}, {}}, id);
      rc >= 0)
    return rc;
  uint64_t exec = 0;
  int rc = 0;
  expected<logs_reply> r{logs_reply{}};
  auto* c = open_detached(ctx, verb, id, exec_text, exec, *r, rc);
  if (!c)
    return rc;
  if (r->commands.empty())
    return fail(make_error(errc::not_found, "sandbox " + id + " has no detached command to wait "
                                            "for (`run --detach -- CMD`, `exec --detach`)"));
  logs_request q;
  q.output = false;
  q.exec = r->commands.front().exec; // the first: run --detach's
  q.wait = true;
  for (;;) {
    for (const auto& x : r->commands)
      if (x.exec == q.exec && !x.running) {
        std::printf("%d\n", x.exit_code);
        return 0;
      }
    if (!r->live) // answered as the sandbox went
      return fail(make_error(errc::closed, "sandbox " + id + " ended while command " +
                                             std::to_string(q.exec) + " ran"));
    r = c->logs(id, q);
    if (!r)
      return fail_for(id, r.error_value());
  }
}

} // namespace dsec::cli::remote

// dsec --connect HOST:PORT call: the function backend, one command in a fresh
// sandbox (from a warm pool when one is ready), destroyed after it.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/container.hpp"
#include "runtime/units.hpp"
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"
#include "tools/dsec/run_options.hpp"

namespace dsec::cli::remote {

namespace {

const char* call_usage = R"(usage: dsec --connect HOST:PORT call [OPTIONS] -- CMD [ARGS...]

The function backend: runs CMD in a fresh sandbox of the daemon, taken from a
warm pool of that environment when one has a ready sandbox (else made for the
call), prints CMD's stdout and stderr once it ended, and exits with its
status. The sandbox is destroyed after the call, never reused; a call sees
nothing another call left. The call lives in a session of its own.

Layers (in the daemon's store):
  --base NAME@VERSION      the base image (required)
  --workdir NAME@VERSION   a working-directory layer
  --tool NAME@VERSION      a tool layer; repeat for several (the last on top)

Limits and command (as `run`; see `run --help`):
  --net, --network MODE, --allow RULE, --deny RULE, --memory SIZE, --pids N,
  --cpus N, --disk SIZE, -v HOST:SANDBOX[:OPTS] (the node must allow it)
  -i, --stdin, --env KEY=VALUE, --cwd DIR, --user USER[:GROUP], --timeout DUR
  -h, --help               this text

A pool's sandboxes match a call of the same environment (layers, limits,
network and its rules, -v mounts: every option but the TTL): set one with
`dsec --connect HOST:PORT pool set` or dsecd --pool.

Exit status: CMD's exit_code: its own status, 128+N if a signal N killed it;
124 on timeout; 126 if CMD cannot be executed, 127 if it is not found; 125 if
dsec or the daemon failed (the message says why); 2 on a usage error.
)";

} // namespace

int call_main(context& ctx, args& a) {
  auto verb = ctx.verb("call");
  constexpr int dsec_failed = 125;
  sandbox_options sb;
  command_spec cs;
  bool input = false;
  std::vector<std::string> argv;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(call_usage, stdout);
      return 0;
    }
    if (a.peek() == "--") {
      a.rest(argv);
      break;
    }
    if (a.flag("-i") || a.flag("--stdin")) {
      input = true;
      continue;
    }
    auto p = parse_sandbox_option(a, verb, sb);
    if (p == parsed::bad)
      return 2;
    if (p == parsed::yes)
      continue;
    p = parse_command_option(a, verb, cs);
    if (p == parsed::bad)
      return 2;
    if (p == parsed::yes)
      continue;
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    return usage_error(verb, "unexpected argument '" + std::string{a.peek()}
                               + "' (put the command after --)");
  }
  if (argv.empty())
    return usage_error(verb, "no command given (call [OPTIONS] -- CMD [ARGS...])");
  if (auto rc = check_daemon_sandbox_options(verb, sb))
    return *rc;
  auto env = sb.env;
  env.backend = "function";
  auto req = make_request(cs, std::move(argv));
  if (input) {
    auto in = read_all(0, "stdin", "reading");
    if (!in)
      return fail(in.error_value(), dsec_failed);
    req.input = std::move(*in);
  }
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value(), dsec_failed);
  auto s = (*c)->open_session({.quota = 1, .name = "call"});
  if (!s)
    return fail(s.error_value(), dsec_failed);
  auto r = (*s)->call(env, req);
  if (!r) {
    fail(r.error_value());
    int st = exec_failure_status(r.error_value());
    return st != 0 ? st : dsec_failed;
  }
  (void) write_all(1, r->out);
  (void) write_all(2, r->err);
  if (r->timed_out) {
    std::fprintf(stderr, "dsec: timed out; the command was killed\n");
    return 124;
  }
  exit_status st{r->exit_code, r->signal};
  if (st.signal != 0)
    std::fprintf(stderr, "dsec: the command was %s%s\n", st.to_string().c_str(),
                 r->oom_killed ? " (out of memory: the --memory limit was reached)" : "");
  return st.shell_code();
}


} // namespace dsec::cli::remote

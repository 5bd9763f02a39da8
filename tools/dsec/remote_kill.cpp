// dsec --connect HOST:PORT kill ID: a signal to a sandbox's detached commands
// (docs/actors.md, "Logs"); the sandbox stays.
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

#include <signal.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <string>

namespace dsec::cli::remote {

namespace {

const char* kill_usage = R"(usage: dsec --connect HOST:PORT kill ID [-s SIGNAL] [--exec N]

Sends SIGNAL to the process group of every detached command of sandbox ID that
is still running (the CMD of `run --detach`, every `exec --detach`), or of
command N only, and prints `ID: signalled N commands`. Commands run by a
waiting `exec` or `run` are not touched; the sandbox stays (`rm` ends it).
ID may be the sandbox's name.

Options:
  -s, --signal SIGNAL  a name (TERM, SIGTERM, term) or a number; default KILL
  --exec N             command N (its exec id: `dsec inspect ID` lists the
                       detached commands)
  -h, --help           this text

Exit status: 0; 1 when the sandbox or command is unknown, none of them runs,
the daemon reported an error or cannot be reached; 2 on a usage error.
)";

// A signal by name (with or without SIG, any case) or number; 0 if none.
int parse_signal(const std::string& s) {
  uint64_t n = 0;
  if (parse_uint(s, 64, n))
    return n >= 1 && n < static_cast<uint64_t>(NSIG) ? static_cast<int>(n) : 0;
  std::string name;
  for (char ch : s)
    name += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (name.rfind("SIG", 0) == 0)
    name.erase(0, 3);
  for (int sig = 1; sig < NSIG; ++sig)
    if (const char* abbrev = ::sigabbrev_np(sig); abbrev && name == abbrev)
      return sig;
  return 0;
}

} // namespace

int kill_main(context& ctx, args& a) {
  auto verb = ctx.verb("kill");
  std::string id, exec_text, sig_text;
  if (int rc = take_one_sandbox(a, verb, kill_usage, "kill",
                               {{{"-s", &sig_text}, {"--signal", &sig_text}, {"--exec", &exec_text}},
                                {}},
                               id);
      rc >= 0)
    return rc;
  int sig = SIGKILL;
  if (!sig_text.empty() && (sig = parse_signal(sig_text)) == 0)
    return usage_error(verb, "-s: no signal '" + sig_text + "' (a name as TERM or SIGTERM, or a "
                             "number from 1 to " + std::to_string(NSIG - 1) + ")");
  uint64_t exec = 0;
  int rc = 0;
  logs_reply r;
  auto* c = open_detached(ctx, verb, id, exec_text, exec, r, rc);
  if (!c)
    return rc;
  unsigned hit = 0;
  rc = 0;
  for (const auto& x : r.commands) {
    if (!x.running)
      continue;
    auto s = c->signal(id, x.exec, sig);
    if (s)
      ++hit;
    else if (s.error_value().code != errc::not_found) // it ended meanwhile: not an error
      rc = fail(s.error_value());
  }
  if (hit == 0 && rc == 0)
    return fail(make_error(errc::not_found,
                           exec != 0 ? "command " + std::to_string(exec) + " of sandbox " + id +
                                         " does not run any more"
                                     : "sandbox " + id + " runs no detached command"));
  std::printf("%s: signalled %u command%s with SIG%s\n", id.c_str(), hit, hit == 1 ? "" : "s",
              ::sigabbrev_np(sig));
  return rc;
}

} // namespace dsec::cli::remote

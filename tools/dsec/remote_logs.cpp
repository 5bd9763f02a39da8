// dsec --connect HOST:PORT logs ID: the output of a sandbox's detached
// commands, as its log keeps it (docs/actors.md, "Logs"), and -f to follow it.
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace dsec::cli::remote {

namespace {

const char* logs_usage = R"(usage: dsec --connect HOST:PORT logs ID [-f] [--tail N] [--exec N]

Prints the output of sandbox ID's detached commands (the CMD of `run --detach`,
and every `exec --detach`): their stdout to ours, their stderr to our stderr,
in the order the sandbox read them. ID may be the sandbox's name.

The sandbox keeps the latest 1 MiB of that output (both streams, all its
detached commands; each piece also costs 64 bytes of it) from the command's
start until the sandbox ends, whether or not anyone reads it. When older output
was dropped to keep that bound, dsec says how many bytes on stderr. A command
never waits for its log.

Options:
  -f, --follow   print what they write as they write it, until none of them
                 is live (running, or a background process of one still
                 holding its stdout or stderr open) or the sandbox ends.
                 Interrupting dsec stops only dsec, never the commands
  --tail N       only the last N lines of what the log holds (counted over
                 both streams); with -f, following goes on from there
  --exec N       only command N's output (its exec id: `dsec inspect ID`
                 lists the detached commands)
  -h, --help     this text

Exit status: 0; 1 when the daemon reported an error (an unknown sandbox or
command, ...) or cannot be reached; 2 on a usage error.
)";

// Where the last `n` lines of `pieces` begin: (piece, offset).
std::pair<size_t, size_t> tail_start(const std::vector<log_piece>& pieces, uint64_t n) {
  if (n == 0)
    return {pieces.size(), 0};
  uint64_t seen = 0;
  bool last_char = true;
  for (size_t i = pieces.size(); i-- > 0;) {
    const auto& d = pieces[i].data;
    for (size_t k = d.size(); k-- > 0;) {
      if (d[k] == '\n' && !last_char && ++seen == n)
        return {i, k + 1};
      last_char = false;
    }
  }
  return {0, 0};
}


} // namespace

int logs_main(context& ctx, args& a) {
  auto verb = ctx.verb("logs");
  std::string id, tail_text, exec_text;
  bool follow = false;
  if (int rc = take_one_sandbox(a, verb, logs_usage, "logs",
                               {{{"--tail", &tail_text}, {"--exec", &exec_text}},
                                {{"-f", &follow}, {"--follow", &follow}}},
                               id);
      rc >= 0)
    return rc;
  uint64_t tail = 0, exec = 0;
  if (!tail_text.empty() && !parse_uint(tail_text, UINT32_MAX, tail))
    return usage_error(verb, "--tail: expected a number of lines, got '" + tail_text + "'");
  int rc = 0;
  auto* c = open_sandbox(ctx, verb, id, exec_text, exec, rc);
  if (!c)
    return rc;
  logs_request q;
  q.exec = exec;
  auto r = c->logs(id, q);
  if (!r)
    return fail_for(id, r.error_value());
  tell_dropped("logs", r->dropped, true);
  if (!print_pieces(r->pieces, tail_text.empty() ? std::pair<size_t, size_t>{0, 0}
                                          : tail_start(r->pieces, tail)))
    return 0; // nobody reads us any more
  while (follow && r->live) {
    q.since = r->next;
    q.wait = true;
    r = c->logs(id, q);
    if (!r)
      return fail_for(id, r.error_value());
    tell_dropped("logs", r->dropped, false);
    if (!print_pieces(r->pieces))
      return 0;
  }
  return 0;
}

} // namespace dsec::cli::remote

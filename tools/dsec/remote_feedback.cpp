// dsec --connect HOST:PORT feedback: answers a Chronus feedback request of a
// sandbox (the `chronus feedback` waiting in it gets the answer).
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/chronus.hpp"
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

namespace dsec::cli::remote {

namespace {

const char* feedback_usage = R"(usage: dsec --connect HOST:PORT feedback SANDBOX REQ [--reward X] [--text T] [--data D] [--done]

Answers feedback request REQ of sandbox SANDBOX (REQ is the "id" of its
feedback event in `session watch`): the `chronus feedback` waiting there
prints this answer and returns.

Options:
  --reward X   a finite number (default 0)
  --text T     text (UTF-8, at most 16 KiB)
  --data D     bytes (at most 32 KiB)
  --done       tell the sandbox's program that the episode is over
  -h, --help   this text

Exit status: 0 when delivered; 1 when no such request waits (answered
already, its program gone), the sandbox is unknown or has no Chronus, or the
daemon cannot be reached; 2 on a usage error.
)";

} // namespace

int feedback_main(context& ctx, args& a) {
  auto verb = ctx.verb("feedback");
  std::string sandbox, req;
  chronus_feedback fb;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(feedback_usage, stdout);
      return 0;
    }
    if (a.flag("--done")) {
      fb.done = true;
      continue;
    }
    std::string v;
    auto got = a.option("--reward", v);
    if (!got)
      return usage_error(verb, got.error_value().message);
    if (*got) {
      char* end = nullptr;
      errno = 0;
      double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || errno != 0 || !std::isfinite(x))
        return usage_error(verb, "--reward: expected a finite number, got '" + v + "'");
      fb.reward = x;
      continue;
    }
    got = a.option("--text", v);
    if (!got)
      return usage_error(verb, got.error_value().message);
    if (*got) {
      fb.text = v;
      continue;
    }
    got = a.option("--data", v);
    if (!got)
      return usage_error(verb, got.error_value().message);
    if (*got) {
      fb.data = v;
      continue;
    }
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    if (sandbox.empty())
      sandbox = a.next();
    else if (req.empty())
      req = a.next();
    else
      return usage_error(verb, "unexpected argument '" + std::string{a.peek()} + "'");
  }
  if (sandbox.empty() || req.empty())
    return usage_error(verb, "expected SANDBOX and REQ (the request's id)");
  if (!parse_u64(req, fb.request_id) || fb.request_id == 0)
    return usage_error(verb, "REQ: expected a request id (a positive whole number), got '" +
                               req + "'");
  if (auto ok = check_feedback(fb); !ok)
    return usage_error(verb, ok.error_value().message);
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  auto named = resolve_sandbox(**c, sandbox); // a name is looked up (ps shows them)
  if (!named)
    return fail(named.error_value());
  sandbox = *named;
  auto r = (*c)->answer(sandbox, fb);
  if (!r)
    return fail(r.error_value());
  return 0;
}

} // namespace dsec::cli::remote

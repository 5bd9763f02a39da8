// dsec --connect HOST:PORT ps: the daemon's sandboxes (of every node, or of one
// session), oldest first, and the nodes that did not answer.
#include "tools/dsec/remote.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "tools/dsec/remote_common.hpp"

namespace dsec::cli::remote {

namespace {

const char* ps_usage = R"(usage: dsec --connect HOST:PORT ps [--session ID] [--filter F]... [--json]

Lists the daemon's sandboxes, oldest first:
  ID           the sandbox id (for exec, cp, rm)
  NAME         its name (`run --name`, a create's key; usable as its id), "-": none
  SESSION      the session it belongs to ("default": detached by `run --detach`)
  STATE        creating, ready, running (a command runs), destroying;
               "no answer" (--session): its node did not answer in time
  ENVIRONMENT  its layers: base/workdir/tool,tool... ("-": no workdir)
  AGE          since it became ready
  TTL LEFT     until it is destroyed by its TTL ("-": none)
  RUNNING      commands running in it now
  NODE         the node it lives on (a cluster's; docs/cluster.md)
  PORTS        its exposed ports, PORT->HOST:HOSTPORT ("-": none; `dsec
               expose`, `run --expose`)

Through a coordinator, each node gets 3 s to answer: a node that does not
(hung, or cut off and not yet lost) is named on stderr after the rows of the
others ("node HOST:PORT did not answer within 3 s: its sandboxes are not
listed"), and ps exits 1. With --session, its sandboxes there are rows of
state "no answer" and ps exits 1 too.

Options:
  --session ID   only the sandboxes of session ID (or of the session named ID)
  --filter F     only those that match F (repeatable: all must match):
                 name=N, label=K (has tag K), label=K=V, session=ID,
                 state=STATE, node=HOST:PORT
  --json         a JSON array instead of the table, a sandbox a line, each as
                 `dsec inspect` prints it (times in unix ms, sizes in bytes)
  -h, --help     this text

Exit status: 0 when every node answered; 1 when the daemon reported an error,
cannot be reached, or a node did not answer (the rows printed are those of
the nodes that did); 2 on a usage error.
)";

} // namespace

int ps_main(context& ctx, args& a) {
  auto verb = ctx.verb("ps");
  std::string session_id;
  bool json = false;
  std::vector<std::pair<std::string, std::string>> filters;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(ps_usage, stdout);
      return 0;
    }
    if (a.flag("--json")) {
      json = true;
      continue;
    }
    std::string fv;
    auto fgot = a.option("--filter", fv);
    if (!fgot)
      return usage_error(verb, fgot.error_value().message);
    if (*fgot) {
      auto eq = fv.find('=');
      auto what = fv.substr(0, eq);
      if (eq == std::string::npos || (what != "name" && what != "label" && what != "session" &&
                                      what != "state" && what != "node"))
        return usage_error(verb, "--filter: expected name=, label=, session=, state= or node=, "
                                 "got '" + fv + "'");
      filters.emplace_back(what, fv.substr(eq + 1));
      continue;
    }
    auto got = a.option("--session", session_id);
    if (!got)
      return usage_error(verb, got.error_value().message);
    if (*got) {
      if (session_id.empty())
        return usage_error(verb, "--session needs a session id");
      continue;
    }
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    return usage_error(verb, "unexpected argument '" + std::string{a.peek()} + "'");
  }
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  expected<std::vector<sandbox_info>> infos = std::vector<sandbox_info>{};
  // The nodes that did not answer in time (a hung node of a cluster): the
  // others' rows are printed, then a line for each of them.
  std::vector<std::string> silent;
  size_t silent_boxes = 0;
  if (session_id.empty()) {
    auto all = (*c)->list_all();
    if (!all)
      return fail(all.error_value());
    infos = std::move(all->sandboxes);
    silent = std::move(all->missing);
  } else {
    auto s = (*c)->find_session(session_id);
    if (!s)
      return fail(s.error_value());
    infos = (*s)->list();
    if (infos) {
      std::set<std::string> nodes;
      for (const auto& i : *infos)
        if (i.state == "no answer") {
          ++silent_boxes;
          nodes.insert(i.node.empty() ? std::string{"(unknown)"} : i.node);
        }
      silent.assign(nodes.begin(), nodes.end());
    }
  }
  if (!infos)
    return fail(infos.error_value());
  if (session_id.empty())
    fill_labels(**c, *infos);
  auto matches = [&](const sandbox_info& i) {
    for (const auto& [what, v] : filters) {
      if (what == "name" && i.key != v)
        return false;
      if (what == "session" && i.session != v)
        return false;
      if (what == "state" && i.state != v)
        return false;
      if (what == "node" && i.node != v)
        return false;
      if (what == "label") {
        auto eq = v.find('=');
        auto t = i.tags.find(v.substr(0, eq));
        if (t == i.tags.end() || (eq != std::string::npos && t->second != v.substr(eq + 1)))
          return false;
      }
    }
    return true;
  };
  std::erase_if(*infos, [&](const sandbox_info& i) { return !matches(i); });
  auto tell_silent = [&] {
    if (silent_boxes > 0)
      std::fprintf(stderr,
                   "dsec: ps: %zu sandbox%s did not answer within 3 s (their node%s: ", silent_boxes,
                   silent_boxes == 1 ? "" : "es", silent.size() == 1 ? "" : "s");
    for (size_t k = 0; silent_boxes > 0 && k < silent.size(); ++k)
      std::fprintf(stderr, "%s%s", k ? ", " : "", silent[k].c_str());
    if (silent_boxes > 0)
      std::fputs("; hung, or cut off and not yet lost)\n", stderr);
    else
      for (const auto& n : silent)
        std::fprintf(stderr,
                     "dsec: ps: node %s did not answer within 3 s (hung, or cut off and not yet "
                     "lost): its sandboxes are not listed\n",
                     n.c_str());
    return silent.empty() && silent_boxes == 0 ? 0 : 1;
  };
  if (infos->empty() && !json) {
    std::puts("no sandboxes");
    return tell_silent();
  }
  auto& v = *infos;
  // Oldest first; those still being created (no time yet) last.
  std::sort(v.begin(), v.end(), [](const sandbox_info& x, const sandbox_info& y) {
    auto kx = x.created_ms ? x.created_ms : UINT64_MAX;
    auto ky = y.created_ms ? y.created_ms : UINT64_MAX;
    return kx != ky ? kx < ky : x.id < y.id;
  });
  if (json) {
    std::fputs("[", stdout);
    for (size_t k = 0; k < v.size(); ++k)
      std::printf("%s\n%s", k ? "," : "", sandbox_json(v[k]).c_str());
    std::fputs(v.empty() ? "]\n" : "\n]\n", stdout);
    return tell_silent();
  }
  auto now = unix_ms();
  std::vector<std::vector<std::string>> rows;
  rows.push_back(
    {"ID", "NAME", "SESSION", "STATE", "ENVIRONMENT", "AGE", "TTL LEFT", "RUNNING", "NODE", "PORTS"});
  for (const auto& i : v) {
    std::string ports;
    for (const auto& p : i.exposed)
      ports += (ports.empty() ? "" : ",") + std::to_string(p.port) + "->" + p.address();
    rows.push_back({i.id, i.key.empty() ? "-" : i.key, i.session, i.state, layers_of(i.env),
                    i.created_ms ? age(now > i.created_ms ? now - i.created_ms : 0) : "-",
                    i.env.ttl_ms && i.created_ms ? age(i.ttl_left_ms) : "-",
                    std::to_string(i.running), i.node.empty() ? "-" : i.node,
                    ports.empty() ? "-" : ports});
  }
  std::vector<size_t> width(rows.front().size(), 0);
  for (const auto& r : rows)
    for (size_t k = 0; k < r.size(); ++k)
      width[k] = std::max(width[k], r[k].size());
  for (const auto& r : rows) {
    std::string line;
    for (size_t k = 0; k < r.size(); ++k) {
      line += r[k];
      if (k + 1 < r.size())
        line.append(width[k] - r[k].size() + 2, ' ');
    }
    std::puts(line.c_str());
  }
  std::fflush(stdout);
  return tell_silent();
}

} // namespace dsec::cli::remote

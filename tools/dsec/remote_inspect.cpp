// dsec --connect HOST:PORT inspect ID...: sandboxes as JSON (environment,
// limits, network, state, times), as ps sees them.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "runtime/json.hpp"
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

namespace dsec::cli::remote {

namespace {

const char* inspect_usage = R"(usage: dsec --connect HOST:PORT inspect ID...

Prints a JSON array with an object for each sandbox ID, in the order given:
  id, session, state, node     as `ps` shows them
  created_ms, ttl_left_ms      unix ms when it became ready; ms until its TTL
  running                      commands running in it now
  key, tags                    its create's key (null if none) and tags
  environment                  base, workdir, tools, memory, pids, cpus, disk
                               (bytes; 0: the node's default was not filled in),
                               network (none, loopback, egress), allow, deny,
                               ttl_ms, backend, chronus, snapshot
  detached                     its detached commands (`run --detach`'s CMD,
                               `exec --detach`; the first and the 63 latest),
                               oldest first: exec (the id `logs --exec`,
                               `wait --exec`, `kill --exec` take), command,
                               started_ms, running, output_open, and once it
                               ended ended_ms, exit_code, signal, timed_out;
                               null where the sandbox keeps no log (microVM,
                               simulated)

Exit status: 0 when every ID was found; 1 when one was not (it is named on
stderr, the others are printed) or the daemon cannot be reached; 2 on a usage
error.
)";

// The "detached" member of a sandbox's object: its detached commands, or null.
std::string detached_json(client& c, const std::string& id) {
  auto r = detached_commands(c, id, 0);
  if (!r)
    return "null";
  std::string o = "[";
  for (size_t k = 0; k < r->commands.size(); ++k) {
    const auto& x = r->commands[k];
    o += std::string{k ? ", " : ""} + "{\"exec\": " + std::to_string(x.exec) + ", \"command\": ";
    json_string(o, x.command);
    o += ", \"started_ms\": " + std::to_string(x.started_ms) +
         ", \"running\": " + (x.running ? "true" : "false") +
         ", \"output_open\": " + (x.open ? "true" : "false");
    if (!x.running)
      o += ", \"ended_ms\": " + std::to_string(x.ended_ms) + ", \"exit_code\": " +
           std::to_string(x.exit_code) + ", \"signal\": " + std::to_string(x.signal) +
           ", \"timed_out\": " + (x.timed_out ? "true" : "false");
    o += "}";
  }
  return o + "]";
}

} // namespace

int inspect_main(context& ctx, args& a) {
  auto verb = ctx.verb("inspect");
  std::vector<std::string> ids;
  if (int rc = take_sandbox_ids(a, verb, inspect_usage, "inspect ID...", ids); rc >= 0)
    return rc;
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  auto all = (*c)->list_all();
  if (!all)
    return fail(all.error_value());
  std::map<std::string, const sandbox_info*> by_id;
  fill_labels(**c, all->sandboxes);
  std::map<std::string, std::vector<const sandbox_info*>> by_name;
  for (const auto& i : all->sandboxes) {
    by_id[i.id] = &i;
    if (!i.key.empty())
      by_name[i.key].push_back(&i);
  }
  int rc = 0;
  std::string out = "[";
  bool first = true;
  for (const auto& id : ids) {
    auto it = by_id.find(id);
    if (auto n = by_name.find(id); it == by_id.end() && n != by_name.end()) {
      if (n->second.size() > 1) {
        std::fprintf(stderr, "dsec: inspect: the name '%s' is taken in %zu sessions; use the id\n",
                     id.c_str(), n->second.size());
        rc = 1;
        continue;
      }
      it = by_id.find(n->second.front()->id);
    }
    if (it == by_id.end()) {
      std::fprintf(stderr, "dsec: inspect: no sandbox %s%s\n", id.c_str(),
                   all->missing.empty() ? "" : " (or it is on a node that did not answer)");
      rc = 1;
      continue;
    }
    auto one = sandbox_json(*it->second);
    one.insert(one.size() - 1, ", \"detached\": " + detached_json(**c, it->second->id));
    out += (first ? "\n" : ",\n") + one;
    first = false;
  }
  out += first ? "]\n" : "\n]\n";
  std::fputs(out.c_str(), stdout);
  return rc;
}

} // namespace dsec::cli::remote

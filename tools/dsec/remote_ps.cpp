// dsec --connect HOST:PORT ps: the daemon's sandboxes (of every node, or of one
// session), oldest first, and the nodes that did not answer.
#include "tools/dsec/remote.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "tools/dsec/remote_common.hpp"

namespace dsec::cli::remote {

namespace {

const char* ps_usage = R"(usage: dsec --connect HOST:PORT ps [--session ID] [--filter F]... [--json | --format F]

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
  --format F     a line per sandbox from template F, as docker's: {{.FIELD}}
                 is FIELD's value, `\t` and `\n` a tab and a newline, the
                 rest as it is. FIELD: ID, Name, Session, State, Environment,
                 Age, TTL, Running, Node, Ports (the columns above; "" when
                 there is none), Labels (K=V,K=V), and {{.Label "K"}} is tag
                 K's value. `table F` prints a header first and aligns the
                 tab-separated columns ("-" for an empty value); `table`
                 alone is the default table, `json` is --json. E.g.
                 --format '{{.ID}} {{.Name}}', --format 'table {{.Name}}\t{{.Label "tier"}}'
  -h, --help     this text

Exit status: 0 when every node answered; 1 when the daemon reported an error,
cannot be reached, or a node did not answer (the rows printed are those of
the nodes that did); 2 on a usage error.
)";

// ---- --format: docker's ps templates, the part of them a line needs ----------

// One piece of a template: literal text, or a field ({{.Name}}), or a tag's
// value ({{.Label "K"}}: `field` is "Label", `label` K).
struct piece {
  std::string text;
  std::string field;
  std::string label;
};

struct field_def {
  const char* name;
  const char* header;
};

constexpr field_def fields[] = {
  {"ID", "ID"},      {"Name", "NAME"},       {"Session", "SESSION"},
  {"State", "STATE"}, {"Environment", "ENVIRONMENT"}, {"Age", "AGE"},
  {"TTL", "TTL LEFT"}, {"Running", "RUNNING"},   {"Node", "NODE"},
  {"Ports", "PORTS"}, {"Labels", "LABELS"},
};

const char* default_table = "{{.ID}}\t{{.Name}}\t{{.Session}}\t{{.State}}\t{{.Environment}}\t"
                            "{{.Age}}\t{{.TTL}}\t{{.Running}}\t{{.Node}}\t{{.Ports}}";

std::string field_list() {
  std::string out;
  for (const auto& f : fields)
    out += std::string{out.empty() ? "" : ", "} + f.name;
  return out + ", Label \"K\"";
}

std::string trim(std::string_view s) {
  auto b = s.find_first_not_of(" \t");
  auto e = s.find_last_not_of(" \t");
  return b == std::string_view::npos ? std::string{} : std::string{s.substr(b, e - b + 1)};
}

// Parses template `t` (its `\t` and `\n` already tabs and newlines).
expected<std::vector<piece>> parse_template(const std::string& t) {
  std::vector<piece> out;
  size_t at = 0;
  while (at < t.size()) {
    auto open = t.find("{{", at);
    if (open == std::string::npos) {
      out.push_back({t.substr(at), {}, {}});
      break;
    }
    if (open > at)
      out.push_back({t.substr(at, open - at), {}, {}});
    auto close = t.find("}}", open + 2);
    if (close == std::string::npos)
      return make_error(errc::invalid_argument,
                        "--format: '{{' at offset " + std::to_string(open) + " is not closed by '}}'");
    auto inner = trim(std::string_view{t}.substr(open + 2, close - open - 2));
    piece p;
    if (inner.rfind(".Label ", 0) == 0) {
      auto k = trim(std::string_view{inner}.substr(7));
      if (k.size() < 2 || k.front() != '"' || k.back() != '"')
        return make_error(errc::invalid_argument,
                          "--format: {{" + inner + "}}: expected {{.Label \"KEY\"}}, the key in"
                          " double quotes");
      p.field = "Label";
      p.label = k.substr(1, k.size() - 2);
    } else {
      bool known = false;
      for (const auto& f : fields)
        known = known || inner == std::string{"."} + f.name;
      if (!known)
        return make_error(errc::invalid_argument,
                          "--format: unknown field {{" + inner + "}} (the fields: " + field_list() +
                            "; written {{.ID}})");
      p.field = inner.substr(1);
    }
    out.push_back(std::move(p));
    at = close + 2;
  }
  return out;
}

// A field's value for sandbox `i` ("" for none).
std::string value_of(const piece& p, const sandbox_info& i, uint64_t now) {
  const auto& f = p.field;
  if (f == "ID")
    return i.id;
  if (f == "Name")
    return i.key;
  if (f == "Session")
    return i.session;
  if (f == "State")
    return i.state;
  if (f == "Environment")
    return layers_of(i.env);
  if (f == "Age")
    return i.created_ms ? age(now > i.created_ms ? now - i.created_ms : 0) : "";
  if (f == "TTL")
    return i.env.ttl_ms && i.created_ms ? age(i.ttl_left_ms) : "";
  if (f == "Running")
    return std::to_string(i.running);
  if (f == "Node")
    return i.node;
  if (f == "Ports") {
    std::string ports;
    for (const auto& x : i.exposed)
      ports += (ports.empty() ? "" : ",") + std::to_string(x.port) + "->" + x.address();
    return ports;
  }
  if (f == "Labels") {
    std::string out;
    for (const auto& [k, v] : i.tags)
      out += (out.empty() ? "" : ",") + k + "=" + v;
    return out;
  }
  auto t = i.tags.find(p.label); // Label
  return t == i.tags.end() ? std::string{} : t->second;
}

std::string header_of(const piece& p) {
  if (p.field == "Label") {
    std::string h = p.label;
    for (auto& c : h)
      c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return h;
  }
  for (const auto& f : fields)
    if (p.field == f.name)
      return f.header;
  return p.field;
}

// Fills the template: each field by `value` (as table cells, an empty value
// is "-", when `dash`).
template <class Value>
std::string render(const std::vector<piece>& t, Value&& value, bool dash) {
  std::string out;
  for (const auto& p : t) {
    if (p.field.empty()) {
      out += p.text;
      continue;
    }
    auto v = value(p);
    out += v.empty() && dash ? "-" : v;
  }
  return out;
}

std::string unescape(const std::string& f) {
  std::string out;
  for (size_t k = 0; k < f.size(); ++k) {
    if (f[k] == '\\' && k + 1 < f.size() && (f[k + 1] == 't' || f[k + 1] == 'n')) {
      out += f[k + 1] == 't' ? '\t' : '\n';
      ++k;
    } else {
      out += f[k];
    }
  }
  return out;
}

// Prints `lines` with their tab-separated columns aligned (two spaces apart).
void print_aligned(const std::vector<std::string>& lines) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& l : lines) {
    std::vector<std::string> cells;
    size_t at = 0;
    for (;;) {
      auto tab = l.find('\t', at);
      cells.push_back(l.substr(at, tab == std::string::npos ? std::string::npos : tab - at));
      if (tab == std::string::npos)
        break;
      at = tab + 1;
    }
    rows.push_back(std::move(cells));
  }
  print_table(rows);
}

} // namespace

int ps_main(context& ctx, args& a) {
  auto verb = ctx.verb("ps");
  std::string session_id;
  bool json = false;
  // The table (default, or --format table ...) or --format's lines.
  bool table = true, formatted = false;
  std::vector<piece> tmpl = *parse_template(default_table);
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
    std::string fmt;
    auto fmt_got = a.option("--format", fmt);
    if (!fmt_got)
      return usage_error(verb, fmt_got.error_value().message);
    if (*fmt_got) {
      if (fmt == "json") {
        json = true;
      } else {
        table = fmt == "table" || fmt.rfind("table ", 0) == 0;
        auto body = fmt == "table" ? std::string{default_table}
                    : table        ? unescape(fmt.substr(6))
                                   : unescape(fmt);
        auto t = parse_template(body);
        if (!t)
          return usage_error(verb, t.error_value().message);
        if (t->empty())
          return usage_error(verb, "--format: the template is empty");
        tmpl = std::move(*t);
        formatted = true;
      }
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
  if (json && formatted)
    return usage_error(verb, "--json and --format TEMPLATE: one of them");
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
  else // a session lists dsec's own keys ("#N", creates without one): no name
    for (auto& i : *infos)
      if (i.key.rfind('#', 0) == 0)
        i.key.clear();
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
  if (infos->empty() && !json && !formatted) {
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
  std::vector<std::string> lines;
  if (table)
    lines.push_back(render(tmpl, header_of, false));
  for (const auto& i : v)
    lines.push_back(render(tmpl, [&](const piece& p) { return value_of(p, i, now); }, table));
  if (table)
    print_aligned(lines);
  else
    for (const auto& l : lines)
      std::puts(l.c_str());
  std::fflush(stdout);
  return tell_silent();
}

} // namespace dsec::cli::remote

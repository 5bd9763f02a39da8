#include "runtime/snapshot.hpp"

namespace dsec {

std::string format_on(const environment& env) {
  std::string out;
  auto add = [&](const char* key, const std::string& v) {
    if (v.empty())
      return;
    if (!out.empty())
      out += ' ';
    out += key;
    out += '=';
    out += v;
  };
  add("base", env.base);
  add("workdir", env.workdir);
  for (const auto& t : env.tools)
    add("tool", t);
  add("snapshot", env.snapshot);
  return out;
}

expected<environment> parse_on(std::string_view record) {
  environment env;
  auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_argument,
                      "malformed diff record '" + std::string{record.substr(0, 200)} + "': " + why);
  };
  while (!record.empty()) {
    auto sp = record.find(' ');
    auto item = record.substr(0, sp);
    record.remove_prefix(sp == std::string_view::npos ? record.size() : sp + 1);
    if (item.empty())
      continue;
    auto eq = item.find('=');
    if (eq == std::string_view::npos)
      return bad("'" + std::string{item} + "' is not KEY=VALUE");
    auto key = item.substr(0, eq);
    std::string value{item.substr(eq + 1)};
    if (key != "base" && key != "workdir" && key != "tool" && key != "snapshot")
      return bad("unknown key '" + std::string{key} + "'");
    if (auto r = parse_layer_ref(value); !r)
      return bad(std::string{key} + ": " + r.error_value().message);
    if (key == "base")
      env.base = value;
    else if (key == "workdir")
      env.workdir = value;
    else if (key == "tool")
      env.tools.push_back(value);
    else if (key == "snapshot")
      env.snapshot = value;
    else
      return bad("unknown key '" + std::string{key} + "'");
  }
  return env;
}

expected<std::vector<resolved_layer>>
resolve_layers(const environment& env,
               const std::function<expected<layer_record>(const std::string& ref)>& find) {
  std::vector<resolved_layer> out;
  const environment* cur = &env;
  environment next;
  std::string where; // "snapshot a@1: " for the layers of a record
  for (size_t depth = 0;; ++depth) {
    if (cur->snapshot.empty()) {
      for (const auto& sl : cur->layer_slots())
        out.push_back({std::string{sl.ref}, sl.kind, where + sl.slot});
      return out;
    }
    if (depth >= max_diff_depth)
      return make_error(errc::invalid_argument,
                        "snapshot " + env.snapshot + " stacks more than "
                          + std::to_string(max_diff_depth) + " diff layers");
    if (!cur->base.empty() || !cur->workdir.empty())
      return make_error(errc::invalid_argument,
                        where + "an environment with a snapshot (" + cur->snapshot
                          + ") takes its base and workdir from the snapshot; give neither");
    for (auto it = cur->tools.rbegin(); it != cur->tools.rend(); ++it)
      out.push_back({*it, layer_kind::tool, where + "tool"});
    std::string diff = cur->snapshot;
    DSEC_TRY(rec, find(diff));
    if (rec.kind != layer_kind::diff)
      return make_error(errc::wrong_kind, where + "snapshot " + diff + " is a "
                                            + to_string(rec.kind)
                                            + " layer, not a diff layer (made by dsec snapshot)");
    out.push_back({diff, layer_kind::diff, where + "snapshot"});
    DSEC_TRY(under, parse_on(rec.on));
    if (under.base.empty() && under.snapshot.empty())
      return make_error(errc::invalid_argument,
                        "diff layer " + diff + " records no environment it sits on");
    next = std::move(under);
    cur = &next;
    where = "snapshot " + diff + ": ";
  }
}

} // namespace dsec

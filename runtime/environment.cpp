#include "runtime/environment.hpp"

#include <charconv>

#include "runtime/json.hpp"
#include "runtime/net_policy.hpp"

namespace dsec {

std::vector<std::string_view> known_backends() {
  // "microvm": runtime/microvm.hpp, actors/microvm_sandbox.hpp (issue 22).
  return {backend_container, backend_function, "microvm"};
}

namespace {

expected<void> check_ref(const char* field, std::string_view text) {
  if (auto r = parse_layer_ref(text); !r)
    return make_error(errc::invalid_argument, std::string{field} + " '" + std::string{text}
                                                + "': " + r.error_value().message);
  return {};
}

std::string number(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return {buf, r.ptr};
}

} // namespace

expected<void> environment::validate() const {
  if (!snapshot.empty()) { // snapshots (issue 16): the layers come from the diff's record
    if (auto r = check_ref("snapshot", snapshot); !r)
      return r;
    if (!base.empty() || !workdir.empty())
      return make_error(errc::invalid_argument,
                        "an environment with a snapshot (" + snapshot
                          + ") takes its base and workdir from the snapshot; give neither");
  } else if (base.empty()) {
    return make_error(errc::invalid_argument, "an environment needs a base layer");
  }
  if (!base.empty())
    if (auto r = check_ref("base", base); !r)
      return r;
  if (!workdir.empty())
    if (auto r = check_ref("workdir", workdir); !r)
      return r;
  if (tools.size() > max_tools)
    return make_error(errc::invalid_argument, "an environment stacks at most "
                                                + std::to_string(max_tools)
                                                + " tool layers, this one "
                                                + std::to_string(tools.size()));
  for (const auto& t : tools)
    if (auto r = check_ref("tool", t); !r)
      return r;
  if (cpus < 0 || cpus != cpus)
    return make_error(errc::invalid_argument,
                      "--cpus " + number(cpus) + " is out of range: it must be between 0.01 and 1024");
  if (auto r = cgroup_limits().validate(); !r)
    return r;
  if (disk != 0 && disk < min_disk)
    return make_error(errc::invalid_argument, "--disk " + std::to_string(disk)
                                                + " is too small: a writable layer needs at "
                                                  "least 1 MiB (1048576 bytes)");
  if (egress && !net)
    return make_error(errc::invalid_argument, "network egress needs a network namespace (net)");
  if (!egress && (!allow.empty() || !deny.empty()))
    return make_error(errc::invalid_argument,
                      std::string{"--allow and --deny are for --network egress, not "} + network());
  if (allow.size() + deny.size() > max_rules)
    return make_error(errc::invalid_argument,
                      "a network policy has at most " + std::to_string(max_rules) + " rules, this one "
                        + std::to_string(allow.size() + deny.size()));
  for (const auto* rules : {&allow, &deny})
    for (const auto& r : *rules)
      if (auto p = parse_net_rule(r); !p)
        return std::move(p).error_value();
  DSEC_TRY_VOID(check_expose(*this, expose));
  DSEC_TRY_VOID(check_mounts());
  bool known = false;
  for (auto b : known_backends())
    known = known || b == backend;
  if (!known) {
    std::string names;
    for (auto b : known_backends())
      names += (names.empty() ? "" : ", ") + std::string{b};
    return make_error(errc::unsupported,
                      "backend '" + backend + "' is not available (only " + names + ")");
  }
  return {};
}

expected<void> environment::check_mounts() const {
  if (mounts.empty())
    return {};
  if (backend != backend_container && backend != backend_function)
    return make_error(errc::unsupported, "-v " + mounts.front().to_string() + ": the " + backend
                                           + " backend has no host mounts (container and "
                                             "function only)");
  if (mounts.size() > max_host_mounts)
    return make_error(errc::invalid_argument,
                      "a sandbox has at most " + std::to_string(max_host_mounts)
                        + " host mounts, this one " + std::to_string(mounts.size()));
  for (size_t i = 0; i < mounts.size(); ++i) {
    DSEC_TRY_VOID(check_host_mount(mounts[i]));
    // A target in another's would be made in the host's directory.
    for (size_t j = 0; j < i; ++j) {
      const auto& a = mounts[j].target;
      const auto& b = mounts[i].target;
      auto in = [](const std::string& p, const std::string& d) {
        return p.size() > d.size() && p.compare(0, d.size(), d) == 0 && p[d.size()] == '/';
      };
      if (a == b || in(a, b) || in(b, a))
        return make_error(errc::invalid_argument,
                          "-v " + mounts[i].to_string() + ": its sandbox path "
                            + (a == b ? "is that of " : "nests with that of ")
                            + mounts[j].to_string()
                            + " (each host mount needs a place of its own)");
    }
  }
  return {};
}

expected<void> check_expose(const environment& env, const std::vector<uint16_t>& ports) {
  if (ports.empty())
    return {};
  if (!env.net)
    return make_error(errc::invalid_argument,
                      "--expose " + std::to_string(ports.front())
                        + ": a sandbox of network none has no network namespace of its own to"
                          " forward to (give it --network loopback, --net, or --network egress)");
  if (env.backend != backend_container)
    return make_error(errc::unsupported, "--expose: the " + env.backend
                                           + " backend has no exposed ports (only container)");
  if (ports.size() > environment::max_exposed)
    return make_error(errc::invalid_argument,
                      "--expose: a sandbox exposes at most "
                        + std::to_string(environment::max_exposed) + " ports, this one "
                        + std::to_string(ports.size()));
  for (size_t i = 0; i < ports.size(); ++i) {
    if (ports[i] == 0)
      return make_error(errc::invalid_argument, "--expose 0: expected a TCP port from 1 to 65535");
    for (size_t j = 0; j < i; ++j)
      if (ports[j] == ports[i])
        return make_error(errc::already_exists,
                          "--expose " + std::to_string(ports[i]) + ": that port is already exposed");
  }
  return {};
}

expected<uint16_t> parse_port(std::string_view text, std::string_view what) {
  unsigned v = 0;
  bool ok = !text.empty() && text.size() <= 5;
  for (char ch : text)
    ok = ok && ch >= '0' && ch <= '9' && (v = v * 10 + static_cast<unsigned>(ch - '0'), true);
  if (!ok || v == 0 || v > 65535)
    return make_error(errc::invalid_argument, std::string{what} + " '" + std::string{text}
                                                + "': expected a TCP port from 1 to 65535");
  return static_cast<uint16_t>(v);
}

const char* environment::network() const {
  return !net ? "none" : egress ? "egress" : "loopback";
}

expected<void> environment::set_network(std::string_view mode) {
  if (mode == "none") {
    net = egress = false;
  } else if (mode == "loopback") {
    net = true;
    egress = false;
  } else if (mode == "egress") {
    net = egress = true;
  } else {
    return make_error(errc::invalid_argument, "--network '" + std::string{mode}
                                                + "': expected none, loopback or egress");
  }
  return {};
}

limits environment::cgroup_limits() const {
  limits l;
  if (memory)
    l.memory_bytes = memory;
  if (pids)
    l.pids = pids;
  if (cpus > 0)
    l.cpus = cpus;
  return l;
}

std::vector<environment::layer_slot> environment::layer_slots() const {
  std::vector<layer_slot> out;
  out.reserve(tools.size() + 2);
  for (auto it = tools.rbegin(); it != tools.rend(); ++it)
    out.push_back({*it, layer_kind::tool, "tool"});
  if (!workdir.empty())
    out.push_back({workdir, layer_kind::workdir, "workdir"});
  out.push_back({base, layer_kind::base, "base"});
  return out;
}

std::string environment::difference(const environment& other, std::string_view a,
                                    std::string_view b) const {
  std::string d;
  auto add = [&](const char* what, const std::string& x, const std::string& y) {
    if (x == y)
      return;
    d += std::string{d.empty() ? "" : ", "} + what + " " + (x.empty() ? "(none)" : x) + " "
         + std::string{a} + ", " + (y.empty() ? "(none)" : y) + " " + std::string{b};
  };
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& x : v)
      out += (out.empty() ? "" : ",") + x;
    return out;
  };
  const auto& o = other;
  add("base", base, o.base);
  add("workdir", workdir, o.workdir);
  add("tools", join(tools), join(o.tools));
  add("memory", std::to_string(memory), std::to_string(o.memory));
  add("pids", std::to_string(pids), std::to_string(o.pids));
  add("cpus", std::to_string(cpus), std::to_string(o.cpus));
  add("disk", std::to_string(disk), std::to_string(o.disk));
  add("net", net ? "on" : "off", o.net ? "on" : "off");
  add("egress", egress ? "on" : "off", o.egress ? "on" : "off");
  add("allow", join(allow), join(o.allow));
  add("deny", join(deny), join(o.deny));
  auto ports = [](const std::vector<uint16_t>& v) {
    std::string out;
    for (auto p : v)
      out += (out.empty() ? "" : ",") + std::to_string(p);
    return out;
  };
  add("expose", ports(expose), ports(o.expose));
  auto binds = [](const std::vector<host_mount>& v) {
    std::string out;
    for (const auto& m : v)
      out += (out.empty() ? "" : ",") + m.to_string();
    return out;
  };
  add("mounts", binds(mounts), binds(o.mounts));
  add("ttl_ms", std::to_string(ttl_ms), std::to_string(o.ttl_ms));
  add("chronus", chronus ? "on" : "off", o.chronus ? "on" : "off");
  add("backend", backend, o.backend);
  add("snapshot", snapshot, o.snapshot);
  return d.empty() ? "the same environment" : d;
}

std::string environment::to_json() const {
  std::string o = "{\"base\": ";
  json_string(o, base);
  o += ", \"workdir\": ";
  if (workdir.empty())
    o += "null";
  else
    json_string(o, workdir);
  o += ", \"tools\": [";
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i)
      o += ", ";
    json_string(o, tools[i]);
  }
  o += "], \"memory\": " + std::to_string(memory) + ", \"pids\": " + std::to_string(pids)
       + ", \"cpus\": ";
  json_number(o, cpus);
  o += ", \"disk\": " + std::to_string(disk) + ", \"network\": ";
  json_string(o, network());
  auto rules = [&](const char* name, const std::vector<std::string>& v) {
    o += std::string{", \""} + name + "\": [";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i)
        o += ", ";
      json_string(o, v[i]);
    }
    o += "]";
  };
  rules("allow", allow);
  rules("deny", deny);
  o += ", \"expose\": [";
  for (size_t i = 0; i < expose.size(); ++i)
    o += (i ? ", " : "") + std::to_string(expose[i]);
  o += "], \"mounts\": [";
  for (size_t i = 0; i < mounts.size(); ++i) {
    o += i ? ", {\"host\": " : "{\"host\": ";
    json_string(o, mounts[i].host);
    o += ", \"target\": ";
    json_string(o, mounts[i].target);
    o += std::string{", \"read_only\": "} + (mounts[i].read_only ? "true" : "false")
         + ", \"recursive\": " + (mounts[i].recursive ? "true" : "false")
         + ", \"idmap\": " + (mounts[i].idmap ? "true}" : "false}");
  }
  o += "]";
  o += ", \"ttl_ms\": " + std::to_string(ttl_ms) + ", \"backend\": ";
  json_string(o, backend);
  o += std::string{", \"chronus\": "} + (chronus ? "true" : "false") + ", \"snapshot\": ";
  if (snapshot.empty())
    o += "null";
  else
    json_string(o, snapshot);
  o += "}";
  return o;
}

expected<void> check_layer_kind(std::string_view slot, std::string_view ref, layer_kind have,
                                layer_kind want) {
  if (have == want)
    return {};
  return make_error(errc::wrong_kind, std::string{slot} + " " + std::string{ref} + " is a "
                                        + to_string(have) + " layer, not a " + to_string(want)
                                        + " layer");
}

} // namespace dsec

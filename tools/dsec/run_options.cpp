#include "tools/dsec/run_options.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "runtime/fd.hpp"
#include "runtime/net_policy.hpp"
#include "runtime/units.hpp"

namespace dsec::cli {

namespace {

// `--name VALUE` or `--name=VALUE` at the cursor: yes (value set), no, or bad.
parsed value_of(args& a, std::string_view verb, std::string_view name, std::string& v) {
  auto got = a.option(name, v);
  if (!got) {
    usage_error(verb, got.error_value().message);
    return parsed::bad;
  }
  return *got ? parsed::yes : parsed::no;
}

parsed bad(std::string_view verb, const std::string& message) {
  usage_error(verb, message);
  return parsed::bad;
}

parsed layer(std::string_view verb, const char* name, const std::string& v, std::string* one,
             std::vector<std::string>* many) {
  auto ref = parse_layer_ref(v);
  if (!ref)
    return bad(verb, std::string{name} + ": " + ref.error_value().message);
  if (one) {
    if (!one->empty())
      return bad(verb, std::string{name} + " given twice");
    *one = ref->to_string();
  } else {
    many->push_back(ref->to_string());
  }
  return parsed::yes;
}

// KEY=VALUE as given; a bare KEY takes our own value of KEY, and is left out
// when we have none (as docker's -e KEY does).
expected<void> add_env(command_spec& c, const std::string& v, const std::string& where) {
  auto eq = v.find('=');
  auto key = v.substr(0, eq);
  bool good_key = !key.empty() && key.find_first_of(" \t\0", 0, 3) == std::string::npos;
  if (!good_key)
    return make_error(errc::invalid_argument,
                      where + ": expected KEY=VALUE or KEY, got '" + v + "'");
  if (eq != std::string::npos) {
    c.env.push_back(v);
  } else if (const char* ours = std::getenv(key.c_str())) {
    c.env.push_back(key + "=" + ours);
  }
  return {};
}

// An --env-file: at most 1 MiB, read whole.
expected<std::string> read_env_file(const std::string& path) {
  unique_fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY)};
  if (!fd)
    return sys_error("--env-file: cannot open", path);
  std::string out;
  char buf[65536];
  for (;;) {
    auto n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return sys_error("--env-file: cannot read", path);
    if (n == 0)
      return out;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (1u << 20))
      return make_error(errc::too_large, "--env-file " + path + ": larger than 1 MiB");
  }
}

} // namespace

parsed parse_sandbox_option(args& a, std::string_view verb, sandbox_options& s) {
  auto& env = s.env;
  std::string v;
  parsed p;
#define DSEC_OPT(name)                                                         \
  p = value_of(a, verb, name, v);                                              \
  if (p == parsed::bad)                                                        \
    return p;                                                                  \
  if (p == parsed::yes)
  DSEC_OPT("--base") return layer(verb, "--base", v, &env.base, nullptr);
  DSEC_OPT("--workdir") return layer(verb, "--workdir", v, &env.workdir, nullptr);
  DSEC_OPT("--tool") return layer(verb, "--tool", v, nullptr, &env.tools);
  // snapshots (issue 16): the layers come from the diff's record
  DSEC_OPT("--snapshot") return layer(verb, "--snapshot", v, &env.snapshot, nullptr);
  DSEC_OPT("--memory") {
    if (v == "none") {
      s.no_memory = true;
      env.memory = 0;
      return parsed::yes;
    }
    s.no_memory = false;
    auto n = parse_size(v, "--memory");
    if (!n)
      return bad(verb, n.error_value().message);
    if (*n == 0) // 0 in an environment means "the default": say it is too small
      return bad(verb, "--memory 0 is too small: a sandbox needs at least 4 MiB (4194304 "
                       "bytes)");
    env.memory = *n;
    return parsed::yes;
  }
  DSEC_OPT("--disk") {
    auto n = parse_size(v, "--disk");
    if (!n)
      return bad(verb, n.error_value().message);
    if (*n < 1024 * 1024)
      return bad(verb, "--disk: must be at least 1m, got '" + v + "'");
    env.disk = *n;
    return parsed::yes;
  }
  DSEC_OPT("--pids") {
    if (v == "none") {
      s.no_pids = true;
      env.pids = 0;
      return parsed::yes;
    }
    s.no_pids = false;
    char* end = nullptr;
    long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < 1 || n > 4'194'304)
      return bad(verb, "--pids: expected a whole number from 1 to 4194304, got '" + v + "'");
    env.pids = static_cast<uint64_t>(n);
    return parsed::yes;
  }
  DSEC_OPT("--cpus") {
    char* end = nullptr;
    double n = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(n > 0))
      return bad(verb, "--cpus: expected a positive number, got '" + v + "'");
    env.cpus = n;
    return parsed::yes;
  }
  if (a.flag("--net")) { // a synonym of --network loopback
    if (!env.egress)
      env.net = true;
    return parsed::yes;
  }
  DSEC_OPT("--network") {
    if (auto r = env.set_network(v); !r)
      return bad(verb, r.error_value().message);
    return parsed::yes;
  }
  DSEC_OPT("--allow") {
    if (auto r = parse_net_rule(v); !r)
      return bad(verb, "--allow: " + r.error_value().message);
    env.allow.push_back(v);
    return parsed::yes;
  }
  DSEC_OPT("--deny") {
    if (auto r = parse_net_rule(v); !r)
      return bad(verb, "--deny: " + r.error_value().message);
    env.deny.push_back(v);
    return parsed::yes;
  }
  p = value_of(a, verb, "--volume", v);
  if (p == parsed::no)
    p = value_of(a, verb, "-v", v);
  if (p == parsed::bad)
    return p;
  if (p == parsed::yes) {
    auto m = parse_host_mount(v, s.mounts_read_only);
    if (!m)
      return bad(verb, "-v: " + m.error_value().message);
    env.mounts.push_back(std::move(*m));
    return parsed::yes;
  }
  DSEC_OPT("--expose") {
    auto port = parse_port(v, "--expose");
    if (!port)
      return bad(verb, port.error_value().message);
    env.expose.push_back(*port);
    return parsed::yes;
  }
  return parsed::no;
}

parsed parse_command_option(args& a, std::string_view verb, command_spec& c) {
  std::string v;
  parsed p;
#define DSEC_OPT2(name, short_name)                                             \
  p = value_of(a, verb, name, v);                                              \
  if (p == parsed::no)                                                         \
    p = value_of(a, verb, short_name, v);                                      \
  if (p == parsed::bad)                                                        \
    return p;                                                                  \
  if (p == parsed::yes)
  DSEC_OPT2("--env", "-e") {
    if (auto r = add_env(c, v, "--env"); !r)
      return bad(verb, r.error_value().message);
    return parsed::yes;
  }
  DSEC_OPT("--env-file") {
    auto text = read_env_file(v);
    if (!text)
      return bad(verb, text.error_value().message);
    size_t n = 0;
    for (size_t at = 0; at < text->size();) {
      auto nl = text->find('\n', at);
      auto line = text->substr(at, nl == std::string::npos ? std::string::npos : nl - at);
      at = nl == std::string::npos ? text->size() : nl + 1;
      ++n;
      if (!line.empty() && line.back() == '\r')
        line.pop_back();
      auto first = line.find_first_not_of(" \t");
      if (first == std::string::npos || line[first] == '#')
        continue;
      if (auto r = add_env(c, line.substr(first), v + ":" + std::to_string(n)); !r)
        return bad(verb, "--env-file " + r.error_value().message);
    }
    return parsed::yes;
  }
  DSEC_OPT2("--cwd", "-w") {
    if (v.empty() || v.front() != '/')
      return bad(verb, "--cwd: expected an absolute path, got '" + v + "'");
    c.cwd = v;
    c.cwd_given = true;
    return parsed::yes;
  }
  DSEC_OPT2("--user", "-u") {
    // USER[:GROUP], each part a number below 65536 or a name as useradd takes
    // them: letters, digits, '.', '_', '-' (and a final '$'). The sandbox's
    // image decides what it means (resolve_command_user): a number is looked
    // up in its /etc/passwd too, as docker's -u.
    auto part_ok = [](std::string_view n) {
      if (n.empty() || n.size() > 32 || n.front() == '-')
        return false;
      for (size_t k = 0; k < n.size(); ++k) {
        char ch = n[k];
        bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')
                     || ch == '.' || ch == '_' || ch == '-';
        if (!plain && !(ch == '$' && k + 1 == n.size()))
          return false;
      }
      return true;
    };
    std::string_view sv{v};
    auto colon = sv.find(':');
    if (!part_ok(sv.substr(0, colon)) || (colon != std::string::npos && !part_ok(sv.substr(colon + 1))))
      return bad(verb, "--user: expected USER[:GROUP], each a name of the image's /etc/passwd "
                       "(/etc/group) or a number below 65536, got '" + v + "'");
    c.user = v;
    c.user_given = true;
    return parsed::yes;
  }
  DSEC_OPT("--timeout") {
    auto d = parse_duration(v, "--timeout");
    if (!d)
      return bad(verb, d.error_value().message);
    if (d->count() <= 0)
      return bad(verb, "--timeout: must be positive");
    c.timeout = *d;
    return parsed::yes;
  }
#undef DSEC_OPT
#undef DSEC_OPT2
  return parsed::no;
}

std::optional<int> check_sandbox_options(std::string_view verb, const sandbox_options& s) {
  if (s.env.base.empty() && s.env.snapshot.empty())
    return usage_error(verb, "--base NAME@VERSION is required (or --snapshot NAME@VERSION)");
  if (auto ok = s.env.validate(); !ok)
    return usage_error(verb, ok.error_value().message);
  return std::nullopt;
}

} // namespace dsec::cli

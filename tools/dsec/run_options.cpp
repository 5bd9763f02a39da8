#include "tools/dsec/run_options.hpp"

#include <cstdlib>

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
  if (a.flag("--net")) {
    env.net = true;
    return parsed::yes;
  }
  return parsed::no;
}

parsed parse_command_option(args& a, std::string_view verb, command_spec& c) {
  std::string v;
  parsed p;
  DSEC_OPT("--env") {
    if (v.find('=') == std::string::npos || v.front() == '=')
      return bad(verb, "--env: expected KEY=VALUE, got '" + v + "'");
    c.env.push_back(v);
    return parsed::yes;
  }
  DSEC_OPT("--cwd") {
    if (v.empty() || v.front() != '/')
      return bad(verb, "--cwd: expected an absolute path, got '" + v + "'");
    c.cwd = v;
    return parsed::yes;
  }
  DSEC_OPT("--user") {
    auto colon = v.find(':');
    auto num = [&](std::string_view s, uint32_t& out) {
      if (s.empty() || s.size() > 9)
        return false;
      out = 0;
      for (char ch : s) {
        if (ch < '0' || ch > '9')
          return false;
        out = out * 10 + static_cast<uint32_t>(ch - '0');
      }
      return out < 65536;
    };
    uint32_t uid = 0, gid = 0;
    std::string_view sv{v};
    if (!num(sv.substr(0, colon), uid)
        || (colon != std::string::npos && !num(sv.substr(colon + 1), gid)))
      return bad(verb, "--user: expected UID[:GID] with numbers below 65536, got '" + v + "'");
    c.uid = uid;
    c.gid = colon == std::string::npos ? uid : gid;
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
  return parsed::no;
}

std::optional<int> check_sandbox_options(std::string_view verb, const sandbox_options& s) {
  if (s.env.base.empty() && s.env.snapshot.empty())
    return usage_error(verb, "--base NAME@VERSION is required (or --snapshot NAME@VERSION)");
  if (auto ok = s.env.validate(); !ok)
    return usage_error(verb, ok.error_value().message);
  return std::nullopt;
}

std::vector<std::string> merge_env(std::vector<std::string> env,
                                   const std::vector<std::string>& overrides) {
  for (const auto& kv : overrides) {
    auto key = kv.substr(0, kv.find('=') + 1);
    std::erase_if(env, [&](const std::string& e) { return e.rfind(key, 0) == 0; });
    env.push_back(kv);
  }
  return env;
}

} // namespace dsec::cli

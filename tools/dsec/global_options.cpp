#include "tools/dsec/global_options.hpp"

#include <cstdio>
#include <cstdlib>

#include "tools/dsec/cli.hpp"

namespace dsec::cli {

std::string global_options::tls() const {
  if (!tls_dir.empty())
    return tls_dir;
  const char* env = std::getenv("DSEC_TLS");
  return env ? env : "";
}

namespace {

int global_usage_error(const std::string& message) {
  std::fprintf(stderr, "dsec: %s\nTry 'dsec --help'.\n", message.c_str());
  return 2;
}

} // namespace

std::optional<int> parse_global_options(args& a, global_options& g) {
  while (a.at_option()) {
    if (a.help()) {
      g.help = true;
      return std::nullopt;
    }
    if (a.flag("--version")) {
      g.version = true;
      return std::nullopt;
    }
    std::string value;
    auto r = a.option("--state", value);
    if (!r)
      return global_usage_error(r.error_value().message);
    if (*r) {
      if (value.empty())
        return global_usage_error("--state needs a directory");
      g.state_dir = value;
      continue;
    }
    r = a.option("--connect", value);
    if (!r)
      return global_usage_error(r.error_value().message);
    if (*r) {
      auto ep = parse_endpoint(value, "--connect");
      if (!ep)
        return global_usage_error(ep.error_value().message);
      g.connect = std::move(*ep);
      continue;
    }
    r = a.option("--tls", value);
    if (!r)
      return global_usage_error(r.error_value().message);
    if (*r) {
      if (value.empty())
        return global_usage_error("--tls needs a directory (with ca.pem, cert.pem and key.pem)");
      g.tls_dir = value;
      continue;
    }
    std::fprintf(stderr, "dsec: unknown global option '%s'\nTry 'dsec --help'.\n",
                 std::string{a.peek()}.c_str());
    return 2;
  }
  return std::nullopt;
}

} // namespace dsec::cli

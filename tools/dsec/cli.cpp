#include "tools/dsec/cli.hpp"

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace dsec::cli {

args::args(int argc, char** argv, int first) : pos_(0) {
  for (int i = first; i < argc; ++i)
    argv_.emplace_back(argv[i]);
}

expected<bool> args::option(std::string_view name, std::string& value) {
  if (empty())
    return false;
  std::string_view a = argv_[pos_];
  if (a == name) {
    if (pos_ + 1 >= argv_.size())
      return make_error(errc::invalid_argument,
                        "option " + std::string{name} + " needs a value");
    value = argv_[pos_ + 1];
    pos_ += 2;
    return true;
  }
  if (a.size() > name.size() && a.substr(0, name.size()) == name
      && a[name.size()] == '=') {
    value = std::string{a.substr(name.size() + 1)};
    ++pos_;
    return true;
  }
  return false;
}

bool args::flag(std::string_view name) {
  if (!empty() && argv_[pos_] == name) {
    ++pos_;
    return true;
  }
  return false;
}

bool args::help() {
  return flag("-h") || flag("--help");
}

bool args::rest(std::vector<std::string>& out) {
  if (empty() || argv_[pos_] != "--")
    return false;
  ++pos_;
  while (pos_ < argv_.size())
    out.push_back(argv_[pos_++]);
  return true;
}

int fail(const error& err, int code) {
  std::fprintf(stderr, "dsec: %s\n", err.to_string().c_str());
  return code;
}

int usage_error(std::string_view verb, std::string_view message) {
  std::fprintf(stderr, "dsec %.*s: %.*s\nTry 'dsec %.*s --help'.\n",
               static_cast<int>(verb.size()), verb.data(),
               static_cast<int>(message.size()), message.data(),
               static_cast<int>(verb.size()), verb.data());
  return 2;
}

void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t k = 0; k < r.size(); ++k) {
      if (width.size() <= k)
        width.push_back(0);
      width[k] = std::max(width[k], r[k].size());
    }
  for (const auto& r : rows) {
    std::string line;
    for (size_t k = 0; k < r.size(); ++k) {
      line += r[k];
      if (k + 1 < r.size())
        line.append(width[k] - r[k].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

std::string default_state_dir() {
  if (const char* env = std::getenv("DSEC_STATE"); env && *env)
    return env;
  return "/var/lib/dsec";
}

bool parse_uint(const std::string& s, uint64_t max, uint64_t& out) {
  if (s.empty() || s.size() > 12)
    return false;
  out = 0;
  for (char c : s) {
    if (c < '0' || c > '9')
      return false;
    out = out * 10 + static_cast<uint64_t>(c - '0');
  }
  return out <= max;
}

std::string find_companion(const char* name, const char* env_var, std::string& beside_dir) {
  auto runnable = [](const std::string& p) {
    struct stat st{};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  beside_dir.clear();
  char self[PATH_MAX];
  if (auto n = ::readlink("/proc/self/exe", self, sizeof self - 1); n > 0) {
    self[n] = '\0';
    beside_dir = self;
    beside_dir.resize(beside_dir.rfind('/'));
  }
  if (auto beside = beside_dir + "/" + name; !beside_dir.empty() && runnable(beside))
    return beside;
  if (const char* env = std::getenv(env_var); env && *env)
    return env;
  if (auto installed = std::string{DSEC_LIBEXECDIR} + "/" + name; runnable(installed))
    return installed;
  return {};
}

} // namespace dsec::cli

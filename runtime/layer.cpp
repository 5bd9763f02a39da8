#include "runtime/layer.hpp"

namespace dsec {

const char* to_string(layer_kind k) noexcept {
  switch (k) {
    case layer_kind::base: return "base";
    case layer_kind::workdir: return "workdir";
    case layer_kind::tool: return "tool";
    case layer_kind::diff: return "diff";
  }
  return "unknown";
}

expected<layer_kind> parse_layer_kind(std::string_view s) {
  if (s == "base")
    return layer_kind::base;
  if (s == "workdir")
    return layer_kind::workdir;
  if (s == "tool")
    return layer_kind::tool;
  if (s == "diff")
    return layer_kind::diff;
  return make_error(errc::invalid_argument,
                    "unknown layer kind '" + std::string{s}
                      + "' (expected base, workdir or tool; diff layers come from `dsec snapshot`)");
}

namespace {

bool valid_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
         || c == '.' || c == '_' || c == '+' || c == '-';
}

bool alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

// Returns an empty string if `part` is a valid name or version, else why not.
std::string check_part(std::string_view part) {
  if (part.empty())
    return "is empty";
  if (part.size() > 128)
    return "is longer than 128 characters";
  if (!alnum(part.front()))
    return "must start with a letter or digit";
  for (char c : part)
    if (!valid_char(c))
      return std::string{"contains '"} + c
             + "' (allowed: letters, digits and . _ + -)";
  return {};
}

} // namespace

expected<layer_ref> parse_layer_ref(std::string_view s) {
  auto at = s.find('@');
  if (at == std::string_view::npos)
    return make_error(errc::invalid_argument,
                      "malformed layer '" + std::string{s}
                        + "': expected NAME@VERSION, e.g. python@3.11");
  auto name = s.substr(0, at);
  auto version = s.substr(at + 1);
  if (auto why = check_part(name); !why.empty())
    return make_error(errc::invalid_argument, "malformed layer '" + std::string{s}
                                                + "': the name " + why);
  if (auto why = check_part(version); !why.empty())
    return make_error(errc::invalid_argument, "malformed layer '" + std::string{s}
                                                + "': the version " + why);
  return layer_ref{std::string{name}, std::string{version}};
}

} // namespace dsec

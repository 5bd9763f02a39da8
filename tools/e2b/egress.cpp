// E2B's egress options (allow_internet_access, network.allowOut and
// network.denyOut, at create and by PUT /sandboxes/{id}/network) as a dsec
// egress policy. They narrow the template's "network", never widen it: the
// template is the operator's, the options an API key holder's.
#include "runtime/net_policy.hpp"
#include "tools/e2b/gateway_impl.hpp"

namespace dsec::e2b {

namespace {

constexpr const char* all_traffic = "0.0.0.0/0"; // E2B's ALL_TRAFFIC

expected<std::vector<std::string>> strings_of(const json& body, const char* name) {
  std::vector<std::string> out;
  if (!body.contains(name) || body[name].is_null())
    return out;
  const auto& v = body[name];
  if (!v.is_array())
    return make_error(errc::invalid_argument,
                      std::string{"network."} + name + " must be a list of strings");
  for (auto& x : v) {
    if (!x.is_string())
      return make_error(errc::invalid_argument,
                        std::string{"network."} + name + " must be a list of strings");
    out.push_back(x.get<std::string>());
  }
  return out;
}

bool below(const std::string& name, const std::string& parent) {
  return name.size() > parent.size() + 1 && name.compare(name.size() - parent.size(),
                                                         parent.size(), parent) == 0 &&
         name[name.size() - parent.size() - 1] == '.';
}

// What of allowOut entry `e` the template's allow rule `a` lets through, as a
// dsec rule: e itself for a domain or service `a` covers, e's network with
// a's ports for an address inside a's; nullopt if `a` does not cover it.
std::optional<std::string> within(const net_rule& e, const net_rule& a) {
  using k = net_rule::kind;
  switch (e.what) {
  case k::cidr:
    if (a.what != k::cidr || !a.net.contains(e.net))
      return std::nullopt;
    // An address in a range that is denied unless named stays denied: naming
    // it here would open what the template's wider rule does not.
    if (names_special(e.net, always_denied_ranges()) &&
        !names_special(a.net, always_denied_ranges()))
      return std::nullopt;
    {
      uint16_t lo = std::max(e.port_lo, a.port_lo), hi = std::min(e.port_hi, a.port_hi);
      if (lo > hi)
        return std::nullopt;
      auto r = e.net.to_string();
      if (lo != 0 || hi != 65535)
        r += ":" + std::to_string(lo) + (lo == hi ? "" : "-" + std::to_string(hi));
      return r;
    }
  case k::domain:
    if ((a.what == k::domain && a.name == e.name) || (a.what == k::wildcard && below(e.name, a.name)))
      return e.text;
    return std::nullopt;
  case k::wildcard:
    if (a.what == k::wildcard && (a.name == e.name || below(e.name, a.name)))
      return e.text;
    return std::nullopt;
  case k::service:
    if (a.what == k::service && a.name == e.name)
      return e.text;
    return std::nullopt;
  }
  return std::nullopt;
}

} // namespace

expected<std::optional<egress_policy>>
egress_of(const std::string& tmpl, const template_def& def, const json& network,
          std::optional<bool> internet) {
  auto allow_out = strings_of(network, "allowOut");
  if (!allow_out)
    return allow_out.error_value();
  auto deny_out = strings_of(network, "denyOut");
  if (!deny_out)
    return deny_out.error_value();
  if (allow_out->empty() && deny_out->empty() && internet.value_or(true))
    return std::optional<egress_policy>{}; // the template's, unchanged
  bool deny_all = !internet.value_or(true);
  std::vector<std::string> deny_rules;
  for (auto& d : *deny_out) {
    if (d == all_traffic) {
      deny_all = true;
      continue;
    }
    auto r = parse_net_rule(d);
    if (!r)
      return make_error(errc::invalid_argument, "network.denyOut: " + r.error_value().message);
    if (r->what != net_rule::kind::cidr)
      return make_error(errc::invalid_argument, "network.denyOut '" + d +
                                                  "': only IP addresses and CIDR ranges are "
                                                  "denied (E2B takes domains in allowOut only)");
    deny_rules.push_back(d);
  }
  const environment& env = def.env;
  if (!env.egress) {
    // No egress to narrow: denying is moot, allowing would widen.
    if (!allow_out->empty())
      return make_error(errc::invalid_argument,
                        "network.allowOut: template '" + tmpl + "' has no egress (network " +
                          env.network() + "): nothing can be allowed out of it");
    return std::optional<egress_policy>{};
  }
  std::vector<net_rule> ceiling;
  for (auto& a : env.allow)
    if (auto r = parse_net_rule(a))
      ceiling.push_back(*r);
  std::vector<std::string> allowed;
  for (auto& e : *allow_out) {
    auto r = parse_net_rule(e);
    if (!r)
      return make_error(errc::invalid_argument, "network.allowOut: " + r.error_value().message);
    bool any = false;
    for (auto& a : ceiling)
      if (auto w = within(*r, a)) {
        allowed.push_back(*w);
        any = true;
      }
    if (!any)
      return make_error(errc::invalid_argument,
                        "network.allowOut '" + e + "' is not within template '" + tmpl +
                          "''s network, which allows only what its allow rules name");
  }
  // E2B lets allowOut win over denyOut; dsec's deny rules win. Say so rather
  // than deny what was allowed.
  for (auto& a : allowed) {
    auto ar = parse_net_rule(a);
    if (!ar || ar->what != net_rule::kind::cidr)
      continue;
    for (auto& d : deny_rules) {
      auto dr = parse_net_rule(d);
      if (dr && dr->net.first() <= ar->net.last() && ar->net.first() <= dr->net.last())
        return make_error(errc::invalid_argument,
                          "network.allowOut '" + a + "' overlaps network.denyOut '" + d +
                            "': in dsec a deny rule wins, so leave the overlap out of one");
    }
  }
  egress_policy p;
  // Without a deny of everything, allowOut adds nothing to what the template
  // lets through (E2B's default is all of it).
  p.allow = deny_all ? allowed : env.allow;
  p.deny = env.deny;
  p.deny.insert(p.deny.end(), deny_rules.begin(), deny_rules.end());
  if (p.allow.size() + p.deny.size() > environment::max_rules)
    return make_error(errc::invalid_argument,
                      "network: more than " + std::to_string(environment::max_rules) +
                        " rules with the template's");
  return std::optional<egress_policy>{std::move(p)};
}

} // namespace dsec::e2b

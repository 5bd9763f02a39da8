// The sandboxes' ports as the SDK's getHost(PORT) names them: a request for
// "PORT-ID.DOMAIN" is tunnelled whole to PORT inside sandbox ID, through the
// port its node exposes for it (dsec's `expose`, docs/network.md), exposed on
// the first such request. The HTTP server does the splicing (http.hpp,
// router); this decides where to, and who may.
#include <cctype>

#include "tools/e2b/gateway_impl.hpp"

namespace dsec::e2b {

namespace {

route answer(int status, json body) {
  route r;
  r.status = status;
  r.body = body.dump();
  return r;
}

route to(const exposed_port& at, const std::string& id, uint16_t port) {
  route r;
  // 0.0.0.0 (dsecd --expose-address for all) is reached on the node's loopback.
  r.host = at.host == "0.0.0.0" ? "127.0.0.1" : at.host == "::" ? "::1" : at.host;
  r.port = at.host_port;
  r.strip = {"e2b-traffic-access-token"};
  r.unanswered = "The sandbox '" + id + "' is running but nothing answered on port " +
                 std::to_string(port) +
                 " (a server there must listen on 127.0.0.1 or on all addresses)";
  return r;
}

} // namespace

std::optional<host_target> target_of(const http_request& head) {
  auto host = head.header("host");
  for (auto& ch : host)
    ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  auto dash = host.find('-');
  auto dot = host.find('.');
  if (dash != std::string::npos && dash >= 1 && dash <= 5 && dot != std::string::npos &&
      dot > dash + 1) {
    bool digits = true;
    for (size_t i = 0; i < dash; ++i)
      digits = digits && std::isdigit(static_cast<unsigned char>(host[i]));
    if (digits)
      return host_target{std::stoul(host.substr(0, dash)), host.substr(dash + 1, dot - dash - 1)};
  }
  auto id = head.header("e2b-sandbox-id");
  auto port = head.header("e2b-sandbox-port");
  if (id.empty() || port.empty() || port.size() > 5)
    return std::nullopt;
  for (char ch : port)
    if (!std::isdigit(static_cast<unsigned char>(ch)))
      return host_target{0, id}; // a port that is not one: refused by tunnel()
  return host_target{std::stoul(port), id};
}

bool gateway::tunnel(const http_request& head, std::function<void(route)> decide) {
  return p_->tunnel(head, std::move(decide));
}

bool gateway::impl::tunnel(const http_request& head, std::function<void(route)> decide) {
  auto t = target_of(head);
  if (!t || t->port == envd_port)
    return false; // the control plane, or envd: the handler's
  if (t->port == 0 || t->port > 65535) {
    decide(answer(400, {{"code", 400},
                        {"message", "no port " + std::to_string(t->port) + " of sandbox '" +
                                      t->id + "': ports go from 1 to 65535"}}));
    return true;
  }
  auto port = static_cast<uint16_t>(t->port);
  auto s = find(t->id);
  if (!s) {
    decide(answer(502, {{"code", 502},
                        {"message", "The sandbox was not found"},
                        {"sandboxId", t->id}}));
    return true;
  }
  bool paused;
  {
    std::lock_guard<std::mutex> g{mu};
    paused = s->paused;
  }
  if (s->restricted && head.header("e2b-traffic-access-token") != s->traffic_token) {
    decide(answer(403, {{"code", 403},
                        {"message", "sandbox '" + s->id +
                                      "' takes traffic only with its e2b-traffic-access-token "
                                      "header (it was created with allowPublicTraffic false)"}}));
    return true;
  }
  if (paused) {
    decide(answer(502, {{"code", 502},
                        {"message", "sandbox '" + s->id + "' is paused: resume it (connect) to "
                                      "reach its port " + std::to_string(port)},
                        {"sandboxId", s->id}}));
    return true;
  }
  reach(std::move(s), port, std::move(decide));
  return true;
}

void gateway::impl::reach(std::shared_ptr<sandbox> s, uint16_t port,
                          std::function<void(route)> decide) {
  {
    std::lock_guard<std::mutex> g{mu};
    auto& p = s->ports[port];
    if (p.at) {
      auto r = to(*p.at, s->id, port);
      // (decide only posts to the connection's strand: fine under the lock)
      decide(std::move(r));
      return;
    }
    p.waiting.push_back(std::move(decide));
    if (p.waiting.size() > 1)
      return; // the expose in flight answers it too
  }
  // Everyone waiting for this port gets the same answer.
  auto settle = [this, s, port](std::optional<exposed_port> at, route failed) {
    std::vector<std::function<void(route)>> waiting;
    {
      std::lock_guard<std::mutex> g{mu};
      auto& p = s->ports[port];
      waiting.swap(p.waiting);
      if (at)
        p.at = at;
      else
        s->ports.erase(port); // the next request tries again
    }
    for (auto& w : waiting)
      w(at ? to(*at, s->id, port) : failed);
  };
  auto failure = [s, port](const error& e) {
    bool gone = sandbox_gone(e) || e.code == errc::not_found;
    return answer(502, {{"code", 502},
                        {"message", gone ? "The sandbox was not found"
                                         : "sandbox '" + s->id + "' cannot expose its port " +
                                             std::to_string(port) + ": " + describe(e)},
                        {"sandboxId", s->id}});
  };
  sess(s->key).expose_async(
    s->id, port, [this, s, port, settle, failure](expected<exposed_port> at) {
      if (at)
        return settle(*at, {});
      if (at.error_value().code != errc::already_exists)
        return settle(std::nullopt, failure(at.error_value()));
      // Exposed already (by an earlier gateway's call): the sandbox's listing has it.
      sess(s->key).list_async(
        [s, port, settle, failure](expected<std::vector<sandbox_info>> all) {
          if (!all)
            return settle(std::nullopt, failure(all.error_value()));
          for (auto& i : *all)
            if (i.id == s->id)
              for (auto& e : i.exposed)
                if (e.port == port)
                  return settle(e, {});
          settle(std::nullopt,
                 failure(make_error(errc::already_exists,
                                    "it is exposed already, but its listing does not show it")));
        });
    });
}

} // namespace dsec::e2b

#include "actors/door.hpp"

#include <caf/actor_system.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/doorman_impl.hpp>
#include <caf/scoped_actor.hpp>

#include <unistd.h>

#include <cstdio>

#include "actors/types.hpp"
#include "actors/thread_guard.hpp"
#include "runtime/peer.hpp"
#include "runtime/log.hpp"

namespace dsec {

namespace {

namespace net = caf::io::network;

// CAF's plain doorman, with the check between accept(2) and the first read.
class checking_doorman : public net::doorman_impl {
public:
  checking_doorman(net::default_multiplexer& mx, net::native_socket fd, door_policy policy)
    : net::doorman_impl(mx, fd), policy_(std::move(policy)),
      gid_(group_id(policy_.group.c_str())) {}

  bool new_connection() override {
    auto& fd = acceptor_.accepted_socket();
    std::string why;
    if (!admits(fd, why)) {
      auto n = ++policy_.counts->refused;
      // Once per 10 s, with a count: a flood must not fill the log.
      log::refusal("door", "peer", "refused a connection",
                   {{"why", why}, {"refused_total", std::to_string(n)}});
      ::close(fd);
      fd = net::invalid_native_socket;
      return true;
    }
    ++policy_.counts->admitted;
    return net::doorman_impl::new_connection();
  }

private:
  bool admits(int fd, std::string& why) const {
    auto peer = tcp_peer_of(fd);
    if (!peer) {
      why = "cannot tell who connected: " + peer.error_value().to_string();
      return false;
    }
    if (!peer->loopback) {
      why = peer->address + " is not on this machine (without --tls, dsecd admits local "
                            "processes only)";
      return false;
    }
    if (uid_in_group(peer->uid, gid_))
      return true;
    why = "the process at " + peer->address + " runs as uid " + std::to_string(peer->uid)
          + ", which is neither root nor a member of the group " + policy_.group
          + (gid_ == static_cast<gid_t>(-1) ? " (there is no such group here)" : "");
    return false;
  }

  door_policy policy_;
  gid_t gid_;
};

// CAF's middleman actor, opening checking doormen.
class door_middleman : public caf::io::middleman_actor_impl {
public:
  door_middleman(caf::actor_config& cfg, caf::actor broker, door_policy policy)
    : caf::io::middleman_actor_impl(cfg, std::move(broker)), policy_(std::move(policy)) {}

protected:
  caf::expected<caf::io::doorman_ptr> open(uint16_t port, const char* addr,
                                           bool reuse) override {
    auto fd = net::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd)
      return std::move(fd.error());
    auto& mpx = static_cast<net::default_multiplexer&>(system().middleman().backend());
    return caf::make_counted<checking_doorman>(mpx, *fd, policy_);
  }

private:
  door_policy policy_;
};

} // namespace

expected<uint16_t> publish_behind_door(caf::actor_system& sys, const caf::strong_actor_ptr& whom,
                                       const std::set<std::string>& ifs, uint16_t port,
                                       const std::string& host, door_policy policy) {
  if (!whom)
    return make_error(errc::invalid_argument, "publish: no actor given");
  auto broker = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  // It only opens the doorman and hands it to CAF's broker, which keeps it.
  caller_thread_guard pin; // see thread_guard.hpp
  auto mm = sys.spawn<door_middleman, caf::hidden>(std::move(broker), std::move(policy));
  expected<uint16_t> out = make_error(errc::system_error, "publish: no answer");
  {
    caf::scoped_actor self{sys};
    self->request(caf::actor_cast<caf::io::middleman_actor>(mm), caf::infinite,
                  caf::publish_atom::value, port, whom, ifs, host, true)
      .receive([&](uint16_t actual) { out = actual; },
               [&](caf::error& e) {
                 out = make_error(errc::system_error,
                                  "cannot listen on " + host + ":" + std::to_string(port) + ": "
                                    + in_words(e));
               });
  }
  caf::anon_send_exit(mm, caf::exit_reason::user_shutdown);
  return out;
}

} // namespace dsec

#include "actors/basp_guard.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/system_messages.hpp>
#include <caf/message_id.hpp>

#include <string>

#include "actors/surface.hpp"

namespace dsec {

namespace {

namespace basp = caf::io::basp;

// What a message's type list is when CAF acts on it before dsec's handlers
// would (scheduled_actor::categorize and BASP's link interception, CAF 0.17).
// Null when it is an ordinary message.
const char* system_message(const std::string& types, caf::binary_deserializer& rest,
                           const basp::header& hdr) {
  if (types == "@<>+@exit")
    return "an exit message from a connection (CAF's; dsec sends none between processes)";
  if (types == "@<>+@down")
    return "a down message from a connection (dsec's come from its own BASP broker)";
  if (types == "@<>+@timeout")
    return "a timeout message from a connection";
  if (types == "@<>+@open_stream_msg" || types == "@<>+@upstream_msg"
      || types == "@<>+@downstream_msg")
    return "a stream message from a connection (dsec has no streams)";
  if (types == "@<>+@error" && !caf::make_message_id(hdr.operation_data).is_response())
    return "an error message that answers nothing, from a connection (it would end the actor)";
  if (types == "@<>+@atom+@strong_actor_ptr") {
    auto what = static_cast<caf::atom_value>(0);
    if (rest(what))
      return "a message that cannot be read";
    if (what == caf::link_atom::value || what == caf::unlink_atom::value)
      return "a link request from a connection (CAF would link the peer's actor to dsec's)";
    return nullptr;
  }
  if (types == "@<>+@atom+@atom+@str") {
    auto what = static_cast<caf::atom_value>(0);
    if (rest(what))
      return "a message that cannot be read";
    // CAF's own query between middlemen goes to a named service actor
    // (SpawnServ), which holds nothing of dsec's.
    if (what == caf::sys_atom::value && !hdr.has(basp::header::named_receiver_flag))
      return "a system query from a connection";
    return nullptr;
  }
  return nullptr;
}

// CAF's BASP broker, with the screen (actors/basp_guard.hpp) before it.
class guarded_broker : public caf::io::basp_broker {
public:
  explicit guarded_broker(caf::actor_config& cfg) : caf::io::basp_broker(cfg) {}

  caf::behavior make_behavior() override {
    auto inner = caf::io::basp_broker::make_behavior();
    return caf::message_handler{[this, inner](caf::io::new_data_msg& msg) mutable {
                                  if (!screen(msg))
                                    return;
                                  // CAF's handler, on the same message (its
                                  // scribe reuses the buffer).
                                  inner(current_mailbox_element()->content());
                                }}
      .or_else(inner);
  }

private:
  // Whether CAF may have `msg`; false when the connection was closed. A
  // message that may not take effect becomes a heartbeat (its payload is read
  // and dropped, and the connection goes on).
  bool screen(caf::io::new_data_msg& msg) {
    auto i = ctx.find(msg.handle);
    if (i == ctx.end() || i->second.cstate != basp::await_payload)
      return true; // a header: CAF checks it
    auto& hdr = i->second.hdr;
    if (msg.buf.size() != hdr.payload_len)
      return true; // CAF refuses it
    caf::binary_deserializer in{context(), msg.buf};
    switch (hdr.operation) {
      case basp::message_type::client_handshake: {
        caf::node_id claimed;
        if (in(claimed))
          return true; // CAF closes the connection
        auto current = instance.tbl().lookup_direct(msg.handle);
        bool ok = current ? claimed == current
                          : claimed && claimed != this_node()
                              && !instance.tbl().lookup_direct(claimed);
        if (ok)
          return true;
        count_refusal("a handshake naming a node that is connected already (the connection is "
                      "closed)");
        connection_cleanup(msg.handle, caf::sec::redundant_connection);
        close(msg.handle);
        return false;
      }
      case basp::message_type::down_message: {
        // Also when CAF would forward it: the next node would take this
        // process's connection for the route to `source`.
        caf::node_id source, dest;
        if (in(source, dest))
          return true; // CAF closes the connection
        if (!reports_for(msg.handle, source)) {
          count_refusal("a BASP down message for an actor of another node than the "
                        "connection's");
          hdr.operation = basp::message_type::heartbeat;
        }
        return true;
      }
      case basp::message_type::routed_message:
      case basp::message_type::direct_message: {
        if (hdr.operation == basp::message_type::routed_message) {
          caf::node_id source, dest;
          if (in(source, dest))
            return true; // CAF drops it
          if (dest != this_node())
            return true; // for another node, which screens it itself
        }
        const char* refused = nullptr;
        // The forwarding stack: (actor id, node) pairs, read without making
        // proxies; then the message's type list.
        size_t stages = 0;
        uint16_t zero = 0;
        std::string types;
        bool readable = !in.begin_sequence(stages);
        for (size_t k = 0; readable && k < stages; ++k) {
          caf::actor_id aid = 0;
          caf::node_id nid;
          readable = !in(aid, nid);
        }
        readable = readable && !in.end_sequence() && !in.begin_object(zero, types);
        if (!readable)
          refused = "a message that cannot be read";
        else
          refused = system_message(types, in, hdr);
        if (refused) {
          count_refusal(refused);
          hdr.operation = basp::message_type::heartbeat;
        }
        return true;
      }
      default:
        return true;
    }
  }

  // Whether the connection `hdl` may report the end of actors of `node`: it is
  // that node's connection, or the one this process reaches it through.
  bool reports_for(caf::io::connection_handle hdl, const caf::node_id& node) {
    auto& tbl = instance.tbl();
    auto peer = tbl.lookup_direct(hdl);
    if (!peer)
      return false;
    if (peer == node)
      return true;
    if (tbl.lookup_direct(node))
      return false;
    auto route = tbl.lookup(node);
    return route && route->hdl == hdl;
  }
};

// CAF's middleman (as caf::io::middleman::make builds it), whose BASP broker is
// the guarded one: spawned under CAF's name before CAF would spawn its own,
// so the middleman actor and OpenSSL's manager both find it.
class guarded_middleman : public caf::io::middleman {
public:
  explicit guarded_middleman(caf::actor_system& sys) : caf::io::middleman(sys), backend_(&sys) {}

  caf::io::network::multiplexer& backend() override { return backend_; }

  void start() override {
    // The multiplexer's thread does not run yet: the broker's start waits in
    // its pipe, ahead of everything the middleman starts below.
    named_broker<guarded_broker>(caf::atom("BASP"));
    caf::io::middleman::start();
  }

  static caf::actor_system::module* make(caf::actor_system& sys, caf::detail::type_list<>) {
    return new guarded_middleman(sys);
  }

private:
  caf::io::network::default_multiplexer backend_;
};

} // namespace

void load_guarded_middleman(caf::actor_system_config& cfg) {
  cfg.load<guarded_middleman>();
}

} // namespace dsec

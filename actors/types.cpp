#include "actors/types.hpp"
#include "actors/ready_ids.hpp"

#include <caf/actor_system_config.hpp>
#include <caf/message.hpp>
#include <caf/exit_reason.hpp>
#include <caf/sec.hpp>

#include "actors/interfaces.hpp"

namespace dsec {

caf::error make_error(errc code) {
  return caf::error{static_cast<uint8_t>(code), error_category};
}

caf::error to_caf(const error& e) {
  return caf::error{static_cast<uint8_t>(e.code), error_category,
                    caf::make_message(e.to_string())};
}

error from_caf(const caf::error& e) {
  error out;
  if (!e) { // no error at all (e.g. a normal exit): say so rather than crash
    out.code = errc::disconnected;
    out.message = "the other side ended";
    return out;
  }
  if (e.category() == error_category) {
    out.code = static_cast<errc>(e.code());
    const auto& ctx = e.context();
    if (ctx.match_elements<std::string>())
      out.message = ctx.get_as<std::string>(0);
    else
      out.message = to_string(out.code);
    return out;
  }
  out.code = errc::disconnected;
  if (e.category() == caf::atom("system")) {
    switch (static_cast<caf::sec>(e.code())) {
      case caf::sec::request_timeout: out.code = errc::timeout; break;
      case caf::sec::unexpected_message:
      case caf::sec::invalid_argument: out.code = errc::invalid_argument; break;
      default: break;
    }
  }
  out.message = in_words(e);
  return out;
}

std::string in_words(const caf::error& e) {
  if (!e)
    return "it ended";
  if (e.category() == error_category)
    return from_caf(e).message;
  using caf::exit_reason;
  using caf::sec;
  if (e.category() == caf::atom("exit")) {
    switch (static_cast<exit_reason>(e.code())) {
      case exit_reason::normal: return "it ended";
      case exit_reason::unhandled_exception: return "it failed (an unhandled exception)";
      case exit_reason::user_shutdown: return "it was shut down";
      case exit_reason::kill: return "it was stopped";
      case exit_reason::remote_link_unreachable:
        return "the connection to its process dropped (the process died or hung, or the "
               "network failed)";
      case exit_reason::unreachable: return "it cannot be reached any more";
      default: return "it ended (for a reason the actor system does not know)";
    }
  }
  std::string words;
  if (e.category() == caf::atom("system")) {
    switch (static_cast<sec>(e.code())) {
      case sec::unexpected_message:
        words = "the other side does not understand the message (another version of dsec?)";
        break;
      case sec::unexpected_response: words = "an unexpected answer came"; break;
      case sec::request_receiver_down:
        words = "what was asked ended before it answered";
        break;
      case sec::request_timeout: words = "no answer in time"; break;
      case sec::no_actor_published_at_port: words = "nothing is published on that port"; break;
      case sec::unexpected_actor_messaging_interface:
        words = "what listens there is not the expected service of this version";
        break;
      case sec::disconnect_during_handshake:
        words = "the other side closed the connection during the handshake";
        break;
      case sec::cannot_forward_to_invalid_actor:
      case sec::no_route_to_receiving_node:
        words = "no connection to the process that holds it";
        break;
      case sec::cannot_connect_to_node: words = "cannot connect"; break;
      case sec::cannot_open_port: words = "cannot open the port"; break;
      case sec::network_syscall_failed: words = "a network call failed"; break;
      case sec::invalid_argument: words = "an invalid argument"; break;
      case sec::remote_linking_failed: words = "cannot watch the other side"; break;
      case sec::incompatible_versions:
      case sec::incompatible_application_ids:
        words = "the other side runs another version";
        break;
      case sec::malformed_basp_message: words = "the other side sent a malformed message"; break;
      case sec::connection_timeout: words = "the connection timed out"; break;
      case sec::socket_disconnected: words = "the connection dropped"; break;
      case sec::redundant_connection: words = "a second connection to the same process"; break;
      default:
        words = "an error of the actor system (" + caf::to_string(static_cast<sec>(e.code()))
                + ")";
        break;
    }
  } else {
    words = "an error of the actor system (" + caf::to_string(e.category()) + " "
            + std::to_string(e.code()) + ")";
  }
  // What the system said about it, as far as it is text (a path, a port, the
  // errno's words): never its actor or node ids.
  const auto& ctx = e.context();
  for (size_t i = 0; i < ctx.size(); ++i)
    if (ctx.match_element<std::string>(i)) {
      const auto& x = ctx.get_as<std::string>(i);
      if (!x.empty() && x.find("node") == std::string::npos)
        words += ": " + x;
    }
  return words;
}

void register_types(caf::actor_system_config& cfg) {
  cfg.add_error_category(error_category,
                         [](uint8_t code, caf::atom_value, const caf::message& ctx) {
                           std::string s = "dsec::";
                           s += to_string(static_cast<errc>(code));
                           if (ctx.match_elements<std::string>()) {
                             s += ": ";
                             s += ctx.get_as<std::string>(0);
                           }
                           return s;
                         });
  cfg.add_message_type<internal_key>("dsec.internal_key");
  cfg.add_message_type<environment>("dsec.environment");
  cfg.add_message_type<session_options>("dsec.session_options");
  cfg.add_message_type<placement>("dsec.placement");
  cfg.add_message_type<create_labels>("dsec.create_labels");
  cfg.add_message_type<exec_request>("dsec.exec_request");
  cfg.add_message_type<exec_result>("dsec.exec_result");
  cfg.add_message_type<output_chunk>("dsec.output_chunk");
  cfg.add_message_type<logs_request>("dsec.logs_request");
  cfg.add_message_type<logs_reply>("dsec.logs_reply");
  cfg.add_message_type<ready_ids>("dsec.ready_ids");
  cfg.add_message_type<sandbox_info>("dsec.sandbox_info");
  cfg.add_message_type<exposed_port>("dsec.exposed_port");
  cfg.add_message_type<backend_offer>("dsec.backend_offer");
  cfg.add_message_type<node_stats>("dsec.node_stats");
  cfg.add_message_type<egress_traffic>("dsec.egress_traffic");
  cfg.add_message_type<sandbox_process>("dsec.sandbox_process");
  cfg.add_message_type<resource_usage>("dsec.resource_usage");
  cfg.add_message_type<sandbox_usage>("dsec.sandbox_usage");
  cfg.add_message_type<pool_info>("dsec.pool_info");
  cfg.add_message_type<session_summary>("dsec.session_summary");
  cfg.add_message_type<layer_set>("dsec.layer_set");
  cfg.add_message_type<layer_meta>("dsec.layer_meta");
  cfg.add_message_type<held_session>("dsec.held_session");
  cfg.add_message_type<node_report>("dsec.node_report");
  cfg.add_message_type<member_info>("dsec.member_info");
  cfg.add_message_type<chronus_event_msg>("dsec.chronus_event");
  cfg.add_message_type<chronus_feedback_msg>("dsec.chronus_feedback");
  cfg.add_message_type<session_actor>("dsec.session_actor");
  cfg.add_message_type<sandbox_actor>("dsec.sandbox_actor");
  cfg.add_message_type<scheduler_actor>("dsec.scheduler_actor");
  cfg.add_message_type<node_actor>("dsec.node_actor");
  cfg.add_message_type<layer_cache_actor>("dsec.layer_cache_actor");
  cfg.add_message_type<layer_store_actor>("dsec.layer_store_actor");
}

} // namespace dsec

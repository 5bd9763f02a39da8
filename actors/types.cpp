#include "actors/types.hpp"
#include "actors/ready_ids.hpp"

#include <caf/actor_system_config.hpp>
#include <caf/message.hpp>
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
  out.message = "actor system: " + caf::to_string(e);
  return out;
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
  cfg.add_message_type<ready_ids>("dsec.ready_ids");
  cfg.add_message_type<sandbox_info>("dsec.sandbox_info");
  cfg.add_message_type<node_stats>("dsec.node_stats");
  cfg.add_message_type<layer_set>("dsec.layer_set");
  cfg.add_message_type<layer_meta>("dsec.layer_meta");
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

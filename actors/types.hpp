// What every dsec actor system needs: the project's error category and the
// message types, registered the same way on every side of a connection.
#pragma once

#include <caf/error.hpp>
#include <caf/fwd.hpp>

#include "runtime/error.hpp"

namespace dsec {

/// The CAF error category of dsec::errc.
constexpr caf::atom_value error_category = caf::atom("dsec");

/// Lets caf::error be built from a dsec::errc (found by ADL).
caf::error make_error(errc code);

/// A dsec::error as a caf::error: the code, and its text as context.
caf::error to_caf(const error& e);

/// A caf::error as a dsec::error: our codes keep their meaning and message;
/// CAF's own (a lost connection, a dead actor) become disconnected.
error from_caf(const caf::error& e);

/// Registers the error category and every message type of actors/messages.hpp.
/// Call it on both sides (daemon and client) before the actor system starts.
void register_types(caf::actor_system_config& cfg);

} // namespace dsec

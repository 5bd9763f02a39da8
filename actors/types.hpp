// What every dsec actor system needs: the project's error category and the
// message types, registered the same way on every side of a connection.
#pragma once

#include <caf/abstract_actor.hpp>
#include <caf/actor_cast.hpp>
#include <caf/error.hpp>
#include <caf/fwd.hpp>

#include "actors/surface.hpp"
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

/// A caf::error in words, for people: what happened, never CAF's ids of
/// actors and processes (`actor 7 on node BFFA...`) or its enum names
/// (`exit_reason(remote_link_unreachable)`). dsec's own errors give their
/// message.
std::string in_words(const caf::error& e);

/// An internal verb refused for want of the right key (actors/surface.hpp).
inline caf::error refuse(const char* what) {
  return to_caf(unauthorized(what));
}

/// Whether the actor behind `h` has really ended: a down message about it
/// may come from any peer (CAF does not check who sends one), so an actor acts
/// on a down message only when this says so, and counts the others as refused.
template <class Handle>
bool really_down(const Handle& h, const char* what) {
  auto* p = caf::actor_cast<caf::abstract_actor*>(h);
  if (p == nullptr
      || p->getf(caf::abstract_actor::is_terminated_flag | caf::abstract_actor::is_cleaned_up_flag))
    return true;
  count_refusal(what);
  return false;
}

/// Registers the error category and every message type of actors/messages.hpp.
/// Call it on both sides (daemon and client) before the actor system starts.
void register_types(caf::actor_system_config& cfg);

} // namespace dsec

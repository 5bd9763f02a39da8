// basp_guard: what a connection may not make CAF do to dsec's actors
// (docs/security.md, "CAF's own messages").
//
// CAF 0.17's BASP broker hands whatever a connected peer sends to the actor it
// names by numeric id, and some of it CAF's actors carry out before any handler
// of dsec's sees it: an exit message (exit_reason::kill cannot be trapped), a
// link request (the broker links the peer's actor to ours, so ours dies with
// it), a down message, an error that is no reply (its default handler ends the
// actor), a timeout, stream control, a system query. dsec's own traffic
// between processes uses none of them: a monitor across processes travels as
// BASP's own monitor and down operations, and the down_msg an actor gets is
// made by its own process's broker when the peer reports its actor's end or
// the connection goes.
//
// dsecd's BASP broker is CAF's with a screen in front (one class, installed as
// the middleman's broker, so plain TCP, TLS, published ports and outgoing
// connections all pass it). For every message a connection delivers to this
// process, before CAF deserializes it:
//   - one of the messages above is dropped, and counted (refused_internal);
//   - a BASP down operation (for this process, or to be forwarded) is taken
//     only from the peer whose actor it names, or from the connection this
//     process routes to that peer through;
//   - a client handshake naming a node that is connected already, this
//     process itself, or another node than the connection's first handshake
//     said, closes the connection (CAF would route that node's traffic, the
//     cluster key with it, to whoever sent it).
#pragma once

#include <caf/fwd.hpp>

namespace dsec {

/// Loads CAF's middleman with the screened BASP broker into `cfg`: what
/// dsecd loads in place of caf::io::middleman (load one or the other).
void load_guarded_middleman(caf::actor_system_config& cfg);

} // namespace dsec

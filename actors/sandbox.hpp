// sandbox: one actor per sandbox, owning its runtime::container.
//
// States: creating (layers acquired, init setting itself up), ready (idle),
// running (one or more commands), destroying (being torn down; then the actor
// quits). If init dies unexpectedly the sandbox destroys itself, and its
// commands in flight fail with the reason. A sandbox is destroyed on request,
// when its TTL expires, when its session ends (it monitors the session), or
// when its init dies.
//
// Nothing here blocks on the sandbox: the node's reactor thread watches init's
// control socket, its pidfd and the commands' output pipes, and posts what it
// sees to this actor (event_atom, output_atom, reaped_atom).
#pragma once

#include <string>

#include "actors/interfaces.hpp"

namespace dsec {

class engine;

struct sandbox_config {
  std::string id;
  std::string session_id;
  environment env;         ///< ttl_ms already defaulted by the session
  session_actor session;
  uint64_t request = 0;    ///< the session's create request it belongs to
  node_actor node;
  layer_cache_actor cache;
  engine* eng = nullptr;
};

sandbox_actor spawn_sandbox(caf::actor_system& sys, sandbox_config cfg);

} // namespace dsec

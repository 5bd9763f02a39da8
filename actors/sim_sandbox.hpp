// sim_sandbox: a sandbox actor without a runtime (dsecd --backend sim). It has
// the typed interface of the real one (actors/sandbox.hpp) and talks to its
// session and node exactly like it: ready_atom once "created", gone_atom once
// "destroyed", failed_atom if destroyed before it was ready. Creation, commands
// and destruction take the modelled latencies (0: at once); commands exit 0
// with no output. It monitors its session and goes with it, and honours its
// TTL. Its state is a few words: what the sandboxes of one spawn share (the
// environment, the session, the node, the model) is held once, by pointer, so
// that a coordinator can hold hundreds of thousands of them.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "actors/interfaces.hpp"

namespace dsec {

/// The model of a node's runtime.
struct sim_model {
  std::chrono::microseconds create{0};  ///< until ready
  std::chrono::microseconds exec{0};    ///< per command
  std::chrono::microseconds destroy{0}; ///< until gone
  uint64_t memory = 0;       ///< modelled bytes per sandbox (environment.memory overrides)
  uint64_t node_memory = 0;  ///< the node refuses sandboxes beyond this; 0: no limit
};

/// What the sandboxes of one spawn request share.
struct sim_common {
  std::string session_id;
  environment env;          ///< ttl_ms already defaulted
  session_actor session;
  node_actor node;
  std::string node_name;
  sim_model model;
  internal_key key;         ///< the member key (actors/surface.hpp)
};

sandbox_actor spawn_sim_sandbox(caf::actor_system& sys, std::shared_ptr<const sim_common> common,
                                std::string id, uint64_t request);

} // namespace dsec

// backend: how a node makes the sandboxes of one kind (environment::backend,
// runtime/environment.hpp).
//
// The interface a backend implements is the sandbox actor's
// (sandbox_actor, actors/interfaces.hpp): creation reported to the session
// (ready_atom, or failed_atom for its create request) and to the node
// (gone_atom when it ends, actors/sandbox.hpp tell_end); exec with the
// output collected or streamed (output_chunk to the caller); put and get;
// signal; destroy; its sandbox_info (state, limits, TTL left) for list and
// stats; TTL changes. Sessions, the scheduler and clients talk to that
// interface only, so none of them knows which backend a sandbox has.
//
// A node holds the backends it offers, each with its capacity, and its
// stats and heartbeats advertise them (backend_offer); the coordinator's
// cluster_map places a sandbox only on a node that offers its backend, and a
// node refuses a backend it does not offer (errc::unsupported, naming the
// ones it does).
//
// Backends now:
//   container  actors/sandbox.cpp: runtime/builder.hpp over the node's
//              engine (namespaces, overlayfs of EROFS layers, cgroups).
// A simulated node (dsecd --backend sim, actors/sim_sandbox.cpp) offers
// "container" too: it models that backend's latencies and memory.
#pragma once

#include <memory>
#include <string_view>

#include "actors/sandbox.hpp"

namespace dsec {

class backend {
public:
  virtual ~backend() = default;

  /// Its name in environment::backend.
  [[nodiscard]] virtual std::string_view name() const = 0;

  /// Spawns the actor of one admitted sandbox; it reports to cfg.session and
  /// cfg.node as above.
  virtual sandbox_actor spawn(caf::actor_system& sys, sandbox_config cfg) = 0;
};

/// The container backend (actors/sandbox.cpp).
std::unique_ptr<backend> make_container_backend();

} // namespace dsec

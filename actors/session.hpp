// session: one per training run. It owns its sandboxes' ids, enforces its
// quota, gives sandboxes its default TTL, creates in batches (each sandbox is
// announced as soon as it is ready: a batch never waits for its slowest), and
// destroys all of them when it is closed or when its trainer disappears (it
// monitors the trainer's actor).
//
// With options.trajectory it keeps a trajectory log (actors/trajectory.hpp,
// docs/trajectory.md): every create, command and put with its result, and a
// pack of the sandbox's writable layer after each one that is not idempotent.
// Replies wait until their record is durable; records are fsynced in batches
// (everything the session appended while its mailbox had messages). A resumed
// session answers commands from the log while they match it, and rebuilds a
// sandbox (from the last pack, re-running the idempotent commands after it)
// only when the trainer goes past the log or asks for something new.
#pragma once

#include <memory>
#include <string>

#include "actors/interfaces.hpp"

namespace dsec {

struct trajectory_plan;

struct session_config {
  std::string id;
  session_options options;
  caf::actor trainer;          ///< monitored; null for the daemon's own session
  scheduler_actor scheduler;
  /// Where trajectory logs live (<state dir>/trajectories); empty: nowhere,
  /// and options.trajectory is refused.
  std::string trajectories;
  /// A resumed session: what its log says (docs/trajectory.md).
  std::shared_ptr<const trajectory_plan> resume;
  /// Its sandboxes may live on other nodes (a coordinator's session): it
  /// tracks where creations and calls are in flight, so that when a node is
  /// lost (lost_atom) every one of them is answered with errc::lost and the
  /// trainer's watchers get a `lost` event per sandbox (docs/cluster.md).
  bool cluster = false;
  /// The member key (actors/surface.hpp): the cluster's, or this daemon's own.
  internal_key key;
  /// Rebuilt by a restarted coordinator (docs/cluster.md): from a node's
  /// report (held_session) or a trainer's reattach. An owned one without a
  /// trainer yet waits `reattach_grace` for one to reattach, then closes.
  bool recovered = false;
  bool owned = false;
  std::chrono::milliseconds reattach_grace{60000};
};

session_actor spawn_session(caf::actor_system& sys, session_config cfg);

} // namespace dsec

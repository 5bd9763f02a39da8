// scheduler: the entry of a dsecd, published with CAF's middleman. Trainers
// open sessions here; sessions ask it to place sandboxes. On one node it admits
// everything to that node; a coordinator's chooses among the nodes that joined
// it (heartbeats, failure detection, placement: docs/cluster.md); by sandbox id
// it serves the command line, which has no session. It keeps one session of
// its own, "default", for sandboxes nobody owns (`dsec run --detach`).
#pragma once

#include <chrono>

#include <string>

#include "actors/door.hpp"
#include "actors/interfaces.hpp"

namespace dsec {

struct scheduler_config {
  node_actor node;
  std::string name = "embedded";
  /// Where sessions keep trajectory logs (<state dir>/trajectories); empty: none.
  std::string trajectories;
  /// A log no session wrote to for this long is removed (checked at start and
  /// hourly); 0: never.
  std::chrono::milliseconds trajectory_keep{0};
  // ---- the cluster (docs/cluster.md) ----
  /// A coordinator: places sandboxes over the nodes that joined it (its own
  /// node among them once its member joins), with power-of-k choices
  /// (actors/cluster_map.hpp).
  bool coordinator = false;
  /// The coordinator's layer store, handed to joining nodes.
  layer_store_actor store;
  /// Its own node's layer cache (copy_atom: diffs made on other nodes).
  layer_cache_actor cache;
  /// A node with no heartbeat for this long is lost.
  std::chrono::milliseconds beat_timeout{1500};
  /// A session a restarted coordinator rebuilt from its nodes' reports waits
  /// this long for its trainer to reattach (dsecd --orphan-grace).
  std::chrono::milliseconds orphan_grace{60000};
  /// A node that joined a coordinator (its address): sessions are opened
  /// there; this scheduler only serves the node's own sandboxes by id.
  std::string joined;
  /// What the daemon's door refused (actors/door.hpp); null: it has none.
  std::shared_ptr<door_counts> door;
  /// The member key (actors/surface.hpp): the cluster's, or this daemon's own.
  internal_key key;
};

scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_config cfg);

} // namespace dsec

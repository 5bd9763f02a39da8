// node: one per machine. Admission control (slots), the registry of the
// node's sandboxes, and its statistics. It spawns one sandbox actor per
// admitted sandbox (a few at a time, so that the first of a large batch are
// ready early); each reports to its session and back here when it is gone.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <optional>

#include "actors/interfaces.hpp"
#include "actors/microvm_sandbox.hpp"
#include "actors/sim_sandbox.hpp"
#include "actors/warm_pool.hpp"
#include "runtime/defaults.hpp"

namespace dsec {

class engine;

struct node_config {
  std::string name = "embedded";
  uint32_t slots = 3200;       ///< sandboxes the machine is sized for
  double oversubscribe = 1.0;  ///< admit up to slots * oversubscribe
  /// Memory admission: the sandboxes a node admits ask for this many bytes
  /// at most in all (dsecd: the machine's memory x oversubscribe); 0: no
  /// such bound. A sandbox counts with its environment's memory, or, when
  /// it takes the default limit, with memory / (slots x oversubscribe): the
  /// default-sized fill the slots first, large ones the memory. A simulated
  /// node uses its model instead (sim_model::node_memory, ::memory).
  uint64_t memory = 0;
  uint32_t max_starting = 8;   ///< sandboxes being created at once; more wait
  /// Disk admission: while the filesystem of disk_path (the state dir: its
  /// layers, packs) has less than min_free_disk bytes free for it, the node
  /// admits no sandbox (it would fail fetching a layer or writing a pack);
  /// a cluster's scheduler places them elsewhere. 0 or no path: no check.
  std::string disk_path;
  uint64_t min_free_disk = 0;
  layer_cache_actor cache;
  engine* eng = nullptr;
  std::vector<std::string> gc; ///< what start-up garbage collection removed
  /// What a sandbox whose environment names no memory, pids or disk gets
  /// (filled into its environment, so `ps` shows them).
  sandbox_defaults defaults;
  /// A simulated node (dsecd --backend sim): sim sandboxes with this model,
  /// no engine and no layer cache; every admitted one is spawned at once
  /// (max_starting does not apply: the model's latency is the creation).
  std::optional<sim_model> sim;
  /// Where its sandboxes keep packs for trajectory logs
  /// (<trajectories>/<session id>/); empty: none (packs are refused).
  std::string trajectories;
  /// The member key (actors/surface.hpp): the cluster's, or this daemon's own.
  internal_key key;
  // ---- warm pools (actors/warm_pool.hpp) ----
  /// The node's own pools, made at start (dsecd --pool).
  std::vector<pool_spec> pools;
  /// Where memory pressure is read (PSI format); dsecd --pool-pressure-file
  /// points it at a file a test writes. Pools shrink at "some avg10=" of at
  /// least pool_pressure_avg10; checked every pool_pressure_interval while the
  /// node has a pool.
  std::string pool_pressure_file = "/proc/pressure/memory";
  double pool_pressure_avg10 = 10.0;
  std::chrono::milliseconds pool_pressure_interval{500};
  // ---- the microVM backend (issue 22, docs/microvm.md) ----
  /// Set: the node offers "microvm" too, with these slots of its own (they
  /// count against the node's slots as well).
  std::optional<microvm_node_config> microvm;
  /// A node of a cluster: how long a sandbox whose session's process went
  /// away (the coordinator died) is kept for a restarted coordinator to adopt
  /// (dsecd --orphan-grace); 0: it is destroyed at once.
  std::chrono::milliseconds orphan_grace{0};
};

node_actor spawn_node(caf::actor_system& sys, node_config cfg);

} // namespace dsec

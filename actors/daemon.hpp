// daemon: the actors of one node, wired together. dsecd (tools/dsecd.cpp)
// starts one and publishes its scheduler; the demo and the tests start one
// embedded in their own process.
#pragma once

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <optional>

#include "actors/door.hpp"
#include "actors/interfaces.hpp"
#include "actors/microvm_sandbox.hpp"
#include "actors/sim_sandbox.hpp"
#include "actors/warm_pool.hpp"
#include "runtime/defaults.hpp"
#include "runtime/egress.hpp"
#include "runtime/engine.hpp"
#include "runtime/port_forward.hpp"

namespace dsec {

struct daemon_options {
  std::string name = "embedded";  ///< how the node calls itself (host:port for dsecd)
  std::string state_dir;          ///< the layer store
  uint32_t slots = 3200;
  double oversubscribe = 1.0;
  /// The memory its sandboxes may ask for in all is this x oversubscribe
  /// (node_config::memory); nullopt: the machine's (machine_resources), 0:
  /// no memory admission (slots only).
  std::optional<uint64_t> node_memory;
  /// The node admits no sandbox while its state dir's filesystem has less
  /// free (node_config::min_free_disk); 0: no check.
  uint64_t min_free_disk = 64ull << 20;
  uint64_t cache_bytes = 0;       ///< layer cache budget; 0: unlimited
  unsigned spawners = 2;
  unsigned netns_prewarm = 8;
  /// The limits of a sandbox that asks for none; nullopt: derived from this
  /// machine, `slots` and `oversubscribe` (runtime/defaults.hpp).
  std::optional<sandbox_defaults> defaults;
  /// Released sandbox cgroups kept for reuse (runtime/cgroup.hpp), and how
  /// many are made at start.
  size_t cgroup_pool = 256;
  size_t cgroup_prewarm = 16;
  /// Egress networking (dsecd --uplink, docs/network.md); nullopt: none.
  /// Its tag is filled from state_dir when empty.
  std::optional<egress_options> egress;
  /// Network namespaces each spawner keeps wired for egress sandboxes
  /// (dsecd --egress-prewire N; egress_network::prewire); 0: none, each
  /// create wires its own.
  unsigned egress_prewire = 4;
  /// The directories its sandboxes may bind-mount (dsecd --allow-host-mount
  /// DIR[:rw], runtime/host_mount.hpp); empty: none.
  std::vector<std::string> host_mounts;
  /// Exposed ports (dsecd --expose-address, docs/network.md): where they
  /// listen, and their bounds.
  port_forward_options ports;
  /// Trajectory logs unused for this long are removed; 0: kept until closed.
  std::chrono::milliseconds trajectory_keep{std::chrono::hours(24 * 7)};
  /// The microVM backend (dsecd --microvm-slots, docs/microvm.md); nullopt: none.
  std::optional<microvm_node_config> microvm;
  // ---- the cluster (docs/cluster.md) ----
  /// Be a coordinator: place sandboxes over the nodes that join, this
  /// daemon's own node among them (it joins its own scheduler).
  bool coordinator = false;
  /// Join the coordinator at join_host:join_port (empty: do not).
  std::string join_host;
  uint16_t join_port = 0;
  /// What a joining node sends connect_atom to (CAF's middleman actor, or the
  /// TLS one); null: the actor system's middleman.
  caf::actor connector;
  std::chrono::milliseconds beat_interval{500};
  std::chrono::milliseconds beat_timeout{1500};
  /// How long a node whose coordinator was lost keeps its ready sandboxes
  /// for a restarted coordinator to adopt; on a coordinator, how long a
  /// session it rebuilt from its nodes' reports waits for its trainer.
  std::chrono::milliseconds orphan_grace{60000};
  /// What the published port's door refused, for node stats (actors/door.hpp);
  /// null: not published, or behind TLS.
  std::shared_ptr<door_counts> door;
  // ---- the simulated backend (docs/cluster.md) ----
  /// A coordinator whose nodes are simulated: no engine, no state dir; it
  /// spawns `sim_nodes` nodes named sim-1..sim-N in this process, each with
  /// `sim_slots` slots and sim sandboxes (actors/sim_sandbox.hpp), each
  /// joining the scheduler through its own member actor.
  std::optional<sim_model> sim;
  uint32_t sim_nodes = 160;
  uint32_t sim_slots = 3200;
  // ---- who may send what (docs/security.md) ----
  /// The cluster key (dsecd --cluster-key): what the coordinator and its nodes
  /// share, carried by every message between them. None: a key of this
  /// daemon's own (random), which no other process has.
  std::optional<internal_key> cluster_key;
  std::string cluster_key_file; ///< where it came from, for messages
  /// Where sessions keep trajectory logs and sandboxes their packs
  /// (<trajectories>/<session id>/); empty: <state_dir>/trajectories. The
  /// daemons of a cluster share one (tools/cluster) so that a sandbox can be
  /// rebuilt on any node from a pack another node took.
  std::string trajectories;
  // ---- warm pools (actors/warm_pool.hpp) ----
  std::vector<pool_spec> pools;  ///< the node's own (dsecd --pool)
  std::string pool_pressure_file = "/proc/pressure/memory";
  double pool_pressure_avg10 = 10.0;
};

/// The node's actors and the engine under them. Destroying it shuts the
/// node down: every sandbox destroyed, every actor ended.
class daemon {
public:
  /// Starts the engine (from the calling thread, which must outlive the daemon),
  /// collects what a crashed predecessor left, and spawns the actors.
  static expected<std::unique_ptr<daemon>> start(caf::actor_system& sys,
                                                 const daemon_options& opts);

  [[nodiscard]] const scheduler_actor& scheduler() const { return scheduler_; }
  [[nodiscard]] const node_actor& node() const { return node_; }
  /// The node's layer cache (tell it `source_atom` to fetch missing layers
  /// from a peer).
  [[nodiscard]] const layer_cache_actor& layer_cache() const { return cache_; }
  /// Serves this node's layers to peers (docs/cluster.md).
  [[nodiscard]] const layer_store_actor& layer_store() const { return layer_store_; }
  /// The member key its actors use (the cluster's, or its own).
  [[nodiscard]] const internal_key& member_key() const { return key_; }
  /// What start-up garbage collection removed.
  [[nodiscard]] const std::vector<std::string>& collected() const { return gc_; }

  /// Destroys every sandbox and ends the actors; returns how many sandboxes
  /// were destroyed. Idempotent.
  expected<uint32_t> shutdown();

  ~daemon();

private:
  daemon() = default;
  caf::actor_system* sys_ = nullptr;
  std::unique_ptr<engine> engine_;
  std::unique_ptr<egress_network> egress_; ///< the engine points at it
  std::unique_ptr<port_forwarder> ports_;  ///< the engine points at it
  layer_cache_actor cache_;
  layer_store_actor layer_store_;
  node_actor node_;
  member_actor member_;
  std::vector<node_actor> sim_nodes_;     ///< after node_ (sim-1), with --backend sim
  std::vector<member_actor> sim_members_; ///< one per simulated node
  scheduler_actor scheduler_;
  std::vector<std::string> gc_;
  internal_key key_;
  bool down_ = false;
  uint64_t collector_ = 0; ///< its engine's counters in the process's /metrics
};

} // namespace dsec

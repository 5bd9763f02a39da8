// member: one per node of a cluster, its link to the coordinator
// (docs/cluster.md). It joins (connecting with CAF's middleman, retrying every
// second until the coordinator answers), sends one heartbeat per interval
// (capacity, and the node's layers when they changed), and hands the
// coordinator's layer store to the node's layer_cache. When the coordinator is
// lost (its connection drops) it joins again at once, retrying with backoff
// (100 ms doubling to 2 s): the node's ready sandboxes are kept meanwhile, each
// for `grace` (--orphan-grace, actors/sandbox.cpp), and its join report names
// them by session (node_report.held) for a restarted coordinator to adopt.
// When the coordinator says it no longer knows the node (it was declared lost
// while it did not answer), it destroys every sandbox of the node and joins
// again.
#pragma once

#include <caf/actor.hpp>

#include <chrono>
#include <string>

#include "actors/interfaces.hpp"

namespace dsec {

struct member_config {
  std::string name;            ///< the node's name (its host:port)
  node_actor node;
  layer_cache_actor cache;
  layer_store_actor store;     ///< the node's own, for peers
  /// The coordinator in this process (its own node joins it too); else
  /// `host`:`port` is reached through `connector`.
  scheduler_actor coordinator;
  std::string host;
  uint16_t port = 0;
  /// What `connect_atom` goes to: CAF's middleman actor (or the TLS one);
  /// null: the actor system's middleman.
  caf::actor connector;
  std::chrono::milliseconds interval{500};
  std::chrono::milliseconds grace{60000}; ///< --orphan-grace (for its messages)
  /// The member key (the cluster's) and the file it came from (for messages).
  internal_key key;
  std::string key_file;
};

member_actor spawn_member(caf::actor_system& sys, member_config cfg);

} // namespace dsec

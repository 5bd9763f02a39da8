// engine: what a node's sandboxes share, in one place. The layer store, a few
// spawners (zygotes; one serves one request at a time), the reactor thread
// that watches every sandbox's descriptors, and the cgroup root. dsecd makes
// one and hands it to its actors; nothing here is global.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cgroup.hpp"
#include "runtime/chronus_endpoint.hpp"
#include "runtime/error.hpp"
#include "runtime/host_mount.hpp"
#include "runtime/reactor.hpp"
#include "runtime/spawner.hpp"
#include "runtime/store.hpp"

namespace dsec {

class egress_network; // runtime/egress.hpp
class port_forwarder; // runtime/port_forward.hpp

struct engine_options {
  std::string state_dir;      ///< the layer store
  unsigned spawners = 2;      ///< zygotes; one per core is about right
  unsigned netns_prewarm = 4; ///< empty network namespaces each zygote makes at start
  chronus_endpoint::config chronus; ///< rate limit and connections per sandbox
  /// Released sandbox cgroups kept for the next sandboxes (cgroup_root's
  /// pool); 0: a fresh cgroup per sandbox.
  size_t cgroup_pool = 256;
};

class engine {
public:
  /// Opens the store, starts the spawners (from the calling thread, which must
  /// live as long as the engine: see spawner::start) and the reactor thread.
  static expected<std::unique_ptr<engine>> start(const engine_options& opts);

  [[nodiscard]] store& layers() { return *store_; }
  [[nodiscard]] reactor& io() { return *reactor_; }
  /// The node's end of every sandbox's /run/chronus.sock, on the reactor thread.
  [[nodiscard]] chronus_endpoint& chronus() { return *chronus_; }

  /// A spawner, round-robin; one that is busy serialises its callers.
  spawner& pick();
  /// Every spawner (the egress network wires namespaces ahead for each).
  [[nodiscard]] const std::vector<std::unique_ptr<spawner>>& spawners() const {
    return spawners_;
  }

  /// The user namespace the layer mounts are idmapped into.
  [[nodiscard]] int userns_fd() const { return spawners_.front()->userns_fd(); }

  /// The cgroup root, detected on first use (only sandboxes with limits need
  /// it), with a pool of options.cgroup_pool cgroups.
  expected<const cgroup_root*> cgroups();

  /// The cgroup pool's counters (all 0 before the root is detected).
  dsec::cgroup_pool_stats cgroup_pool_stats();

  /// Removes what a crashed predecessor left (cgroups of dead dsec processes,
  /// stale temporary files of the store); returns what was removed.
  std::vector<std::string> collect_garbage();

  /// The node's egress network (dsecd --uplink; runtime/egress.hpp), owned
  /// by whoever set it; null: egress sandboxes are refused.
  [[nodiscard]] egress_network* network() const { return network_; }
  void set_network(egress_network* n) { network_ = n; }
  /// The directories its sandboxes may mount (dsecd --allow-host-mount;
  /// runtime/host_mount.hpp); empty: none.
  [[nodiscard]] const host_mount_policy& host_mounts() const { return host_mounts_; }
  void set_host_mounts(host_mount_policy p) { host_mounts_ = std::move(p); }
  /// The node's forwarder of exposed ports (runtime/port_forward.hpp), owned
  /// by whoever set it; null: exposing a port is refused.
  [[nodiscard]] port_forwarder* ports() const { return ports_; }
  void set_ports(port_forwarder* p) { ports_ = p; }

  ~engine();

private:
  egress_network* network_ = nullptr;
  port_forwarder* ports_ = nullptr;
  host_mount_policy host_mounts_;
  engine() = default;
  std::optional<store> store_;
  std::vector<std::unique_ptr<spawner>> spawners_;
  std::unique_ptr<reactor> reactor_;
  std::unique_ptr<chronus_endpoint> chronus_;
  std::atomic<size_t> next_{0};
  std::mutex cgroups_mu_;
  std::optional<cgroup_root> cgroups_;
  std::optional<error> cgroups_error_;
  size_t cgroup_pool_ = 0;
};

} // namespace dsec

// builder: an environment (runtime/environment.hpp) plus its mounted layers
// becomes a running sandbox. The one place that maps an environment onto the
// container's options (limits, network, writable layer, Chronus); `dsec run`
// (tools/dsec/run.cpp) and the sandbox actor (actors/sandbox.cpp) both build
// through it, and both take their layers in environment::layer_slots() order,
// each checked with check_layer_kind().
//
// It does not fill in defaults: whoever owns them (the node, `dsec run`)
// writes them into the environment first, so that what is listed is what was
// built. It does not validate either: environment::validate() ran where the
// environment came in (the session, the CLI).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/container.hpp"
#include "runtime/environment.hpp"
#include "runtime/store.hpp"

namespace dsec {

/// What a sandbox is built with besides its environment: who it is, and
/// where its writable layer starts from.
struct build_extras {
  std::string id;       ///< empty: a random one
  std::string hostname; ///< empty: the id
  /// Keep the upper dir's descriptor for packs (container_options::keep_upper).
  bool keep_upper = false;
  /// A pack to restore first (container_options::seed_*): a file, or the
  /// manifest itself, and the blob directory.
  std::string seed_pack;
  std::string seed_manifest;
  std::string seed_blobs;
  /// Egress networking: /etc/resolv.conf (container_options::resolv_conf).
  std::string resolv_conf;
  /// Egress networking: a namespace wired ahead to join
  /// (container_options::netns; not owned); -1: a fresh one.
  int netns = -1;
  /// Where environment::mounts may come from (the node's dsecd
  /// --allow-host-mount, or everything for `dsec run`); null: nowhere, and a
  /// sandbox with host mounts is refused.
  const host_mount_policy* host_mounts = nullptr;
};

/// The container options for `env`.
container_options container_options_for(const environment& env, build_extras extras);

/// Where the cgroup root comes from; asked only when the environment sets a
/// limit (a node keeps one root with a pool, `dsec run` detects one).
using cgroup_source = std::function<expected<const cgroup_root*>()>;

/// How far build_sandbox goes before it returns.
enum class build_until {
  /// The host steps and the spawn: init sets itself up while the caller
  /// watches container::control_fd() (the asynchronous API, dsecd).
  started,
  /// And until init is ready (the synchronous API: `dsec run`, benchmarks).
  ready,
};

/// Builds the sandbox. `lowers`: the mounted layers' directory fds, topmost
/// first (the system layer, then layer_slots()).
expected<std::unique_ptr<container>> build_sandbox(spawner& sp, const environment& env,
                                                   std::span<const int> lowers,
                                                   build_extras extras,
                                                   const cgroup_source& cgroups,
                                                   build_until until);

/// Leases the environment's layers from a store, topmost first, each checked
/// against its slot; `slot_prefix` goes before the slot's name in errors ("--"
/// for the CLI: "--tool x@1 is a base layer, not a tool layer").
expected<std::vector<layer_lease>> lease_layers(const store& st, const environment& env,
                                                const char* slot_prefix = "");

} // namespace dsec

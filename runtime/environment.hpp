// environment: what one sandbox is made of. The one spec type of dsec: a
// trainer sends it (C++ client, Python SDK), `dsec run` and `dsec create`
// fill it from their options, and it travels unchanged session -> scheduler
// -> node -> sandbox, where runtime/builder.hpp turns it and the mounted
// layers into a running sandbox. It is validated once, by validate(): the
// session calls it before anything is placed, the CLI before anything is
// sent. No CAF here; actors/messages.hpp gives it an inspect() for the wire.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/cgroup.hpp"
#include "runtime/error.hpp"
#include "runtime/host_mount.hpp"
#include "runtime/layer.hpp"

namespace dsec {

/// The backends a sandbox can ask for (environment::backend). A node
/// advertises the ones it offers (actors/backend.hpp); the scheduler places a
/// sandbox only on a node that offers its backend.
inline constexpr std::string_view backend_container = "container";
/// One sandbox per call (session::call, `dsec call`), taken from a warm pool
/// of its environment when one is ready, destroyed after the call: a
/// container underneath, so nodes offer it wherever they offer "container".
inline constexpr std::string_view backend_function = "function";

/// Every backend name dsec knows, whether or not a node offers it now.
std::vector<std::string_view> known_backends();

struct environment {
  std::string base;               ///< NAME@VERSION of a base layer (required)
  std::string workdir;            ///< NAME@VERSION of a workdir layer, or empty
  std::vector<std::string> tools; ///< NAME@VERSION of tool layers, the last on top
  uint64_t memory = 0;            ///< bytes; 0: the node's default (node_stats)
  uint64_t pids = 0;              ///< most processes; 0: the node's default
  double cpus = 0;                ///< CPU bandwidth; 0: no limit
  uint64_t disk = 0;              ///< size of the writable layer; 0: the node's default
  bool net = false;               ///< a private network with loopback up
  uint64_t ttl_ms = 0;            ///< lifetime; 0: the session's default
  std::string backend{backend_container}; ///< one of known_backends()
  /// Chronus (docs/chronus.md): trusted commands that report to the session over
  /// a channel of their own, kept apart from the agent's commands; dsec's
  /// `chronus` at /.dsec/bin; pristine commands; /run/chronus.sock
  bool chronus = false;
  // ---- snapshots (issue 16) ----
  /// NAME@VERSION of a diff layer (`dsec snapshot`, kind diff) to start from:
  /// the layers are the environment the diff records (base, workdir, tools,
  /// and its own snapshot: diffs stack), the diff on top of them, then this
  /// environment's `tools` on top. base and workdir must then be empty.
  std::string snapshot;

  // ---- networking (issue 14; docs/network.md) ----
  /// With `net`: network "egress", the sandbox reaches out through its node's
  /// uplink by `allow` and `deny` (rules of runtime/net_policy.hpp), denying
  /// everything else. Without `net`: "none"; `net` alone: "loopback".
  bool egress = false;
  std::vector<std::string> allow; ///< CIDR[:PORT[-PORT]], DOMAIN, *.DOMAIN, service
  std::vector<std::string> deny;
  /// The most rules one policy may have (allow and deny together).
  static constexpr size_t max_rules = 256;
  /// TCP ports inside the sandbox that its node forwards from a port of its
  /// own from creation on (docs/network.md, "Exposed ports"): needs a
  /// network of its own (loopback or egress); each 1-65535, no repeats.
  std::vector<uint16_t> expose;
  /// The most ports one sandbox may expose.
  static constexpr size_t max_exposed = 32;

  // ---- host mounts (issue 23; runtime/host_mount.hpp) ----
  /// Host paths bind-mounted into the sandbox (`-v HOST:SANDBOX[:ro|:rw]`),
  /// idmapped so that they keep their host owners, nosuid and nodev, each
  /// allowed by the policy of the node that builds it (dsecd
  /// --allow-host-mount). At most max_host_mounts, no target twice or
  /// beneath another's; container and function backends only.
  std::vector<host_mount> mounts;
  /// "none", "loopback" or "egress".
  [[nodiscard]] const char* network() const;
  /// Sets net and egress from "none", "loopback" or "egress"; the error names
  /// the bad value.
  expected<void> set_network(std::string_view mode);

  /// The most tool layers one environment may stack.
  static constexpr size_t max_tools = 128;
  /// The smallest writable layer (bytes) when `disk` is set.
  static constexpr uint64_t min_disk = 1ull << 20;

  /// Everything that can be checked without a store: a base is given; every
  /// layer name parses as NAME@VERSION; at most max_tools tools; the limits
  /// are in range (limits::validate's rules; disk 0 or at least 1 MiB); the
  /// backend is a known one. The invalid_argument error names the bad field
  /// and value; an unknown backend is errc::unsupported.
  [[nodiscard]] expected<void> validate() const;
  /// validate()'s rules for `mounts`.
  [[nodiscard]] expected<void> check_mounts() const;

  /// The cgroup limits it asks for (unset where it asks for none).
  [[nodiscard]] limits cgroup_limits() const;

  /// One layer slot of the root: its NAME@VERSION, the kind it must be, and
  /// the slot's name for messages ("base", "workdir", "tool").
  struct layer_slot {
    std::string_view ref;
    layer_kind kind;
    const char* slot;
  };
  /// The layers, topmost first (the last tool, ..., the first tool, the
  /// workdir, the base): the order overlayfs stacks them in. The views point
  /// into this environment.
  [[nodiscard]] std::vector<layer_slot> layer_slots() const;

  /// What differs from `other`, field by field ("memory 0 in A, 1048576 in
  /// B"), or "the same environment"; `a` and `b` name the two sides.
  [[nodiscard]] std::string difference(const environment& other, std::string_view a,
                                       std::string_view b) const;

  /// One JSON object of every field (`dsec inspect`, `ps --json`): base,
  /// workdir (null if none), tools, memory, pids, cpus, disk, network (none,
  /// loopback, egress), allow, deny, expose, mounts (objects: host, target,
  /// read_only), ttl_ms, backend, chronus, snapshot (null if none).
  [[nodiscard]] std::string to_json() const;

  friend bool operator==(const environment&, const environment&) = default;
};

/// Whether `env` may expose `ports` (its own and later ones): a network of
/// its own (loopback or egress), a container, ports 1-65535 without repeats
/// (errc::already_exists for one given twice), at most max_exposed.
expected<void> check_expose(const environment& env, const std::vector<uint16_t>& ports);

/// A TCP port from 1 to 65535 in decimal; the error names `what` and the text.
expected<uint16_t> parse_port(std::string_view text, std::string_view what);

/// The error for a layer that is not of the kind its slot needs: "SLOT REF is
/// a KIND layer, not a WANT layer" (errc::wrong_kind), or nothing when it is.
/// `slot` is how the caller names the slot ("base", "--tool").
expected<void> check_layer_kind(std::string_view slot, std::string_view ref, layer_kind have,
                                layer_kind want);

} // namespace dsec

// microvm_sandbox: the sandbox actor of the "microvm" backend (issue 22,
// docs/microvm.md). The same interface as the container's (sandbox_actor,
// actors/backend.hpp); underneath, runtime/microvm.hpp: QEMU's microvm
// machine booting the environment's EROFS layers as read-only disks.
//
// Nothing here blocks the actor: each VM has a thread of its own (its
// "worker") that leases the layers from the node's store, boots QEMU (a child
// of that thread: it dies with it), and pumps the agent channel; it hands what
// the guest says to the actor through a queue and an event_atom. The actor
// only queues frames (runtime/microvm.hpp's queue() never blocks).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "actors/backend.hpp"

namespace dsec {

/// A node's microVM backend (dsecd --microvm-slots, --microvm-guest).
struct microvm_node_config {
  uint32_t slots = 0;      ///< microVMs it admits at most (its own capacity)
  std::string guest_dir;   ///< vmlinux and initrd.cpio (tools/microvm-guest)
  std::string qemu = "qemu-system-x86_64";
  std::string accel = "auto"; ///< auto, kvm or tcg
};

/// The backend. Its VMs' merged disks (more layer images than disk slots:
/// runtime/microvm_disks.hpp) go in `eng`'s store directory.
std::unique_ptr<backend> make_microvm_backend(microvm_node_config cfg, engine& eng);

/// "kvm" or "tcg": what a microVM of `cfg` runs with on this machine.
std::string microvm_accel_of(const microvm_node_config& cfg);

} // namespace dsec

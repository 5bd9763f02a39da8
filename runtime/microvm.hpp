// microvm: one sandbox as a QEMU microVM (issue 22, docs/microvm.md). The same
// EROFS layers as a container, each the read-only virtio-blk disk of its image
// file, overlaid in the guest over a tmpfs by the guest agent (tools/guest,
// the initramfs's /init), which runs commands over a virtio-serial port: the
// exec protocol of runtime/vm_proto.h.
//
// Mechanism only, no CAF. The QEMU process is a child of the thread that calls
// boot() (its pdeathsig is tied to that thread: boot from a thread that lives
// as long as the VM), owned by the microvm object: its destructor kills and
// reaps it. QEMU gets its three channels (the agent port, the console, its own
// stderr) as socketpair ends: no socket or log file is ever made on the host,
// so nothing can be left behind.
//
// I/O is non-blocking: queue() adds a frame to send (thread-safe, any thread),
// pump() moves bytes both ways and hands over whole frames; one thread pumps.
// The synchronous calls (exec, put_file, get_file) pump themselves, for `dsec`
// tools and the tests; a daemon pumps on a thread of its own.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <optional>

#include "runtime/cgroup.hpp"
#include "runtime/error.hpp"
#include "runtime/fd.hpp"
#include "runtime/vm_proto.h"

namespace dsec {

/// The guest kernel and initramfs (tools/microvm-guest's output directory).
struct microvm_guest {
  std::string kernel; ///< an uncompressed PVH vmlinux
  std::string initrd; ///< initrd.cpio: dsec-guest as /init and the modules
  /// DIR/vmlinux and DIR/initrd.cpio; not_found names what is missing.
  static expected<microvm_guest> in(const std::string& dir);
};

/// How QEMU runs the guest.
enum class microvm_accel { automatic, kvm, tcg };

/// KVM when /dev/kvm opens, answers KVM_GET_API_VERSION and the CPU shows vmx
/// or svm (a nested guest can have a /dev/kvm that hangs every VM); else TCG.
microvm_accel detect_accel();
const char* to_string(microvm_accel a);

struct microvm_options {
  std::string qemu = "qemu-system-x86_64"; ///< found on PATH when not absolute
  microvm_guest guest;
  /// EROFS images, topmost first. At most max_layers: virtio-mmio has 8
  /// slots and the virtio-serial device takes one.
  std::vector<std::string> layers;
  static constexpr size_t max_layers = 7;
  uint64_t memory = 128ull << 20; ///< guest RAM (QEMU -m); at least 64 MiB
  unsigned cpus = 1;              ///< vCPUs (QEMU -smp)
  uint64_t disk = 0;              ///< the writable tmpfs' size; 0: half the RAM
  std::string hostname;           ///< letters, digits, '-', '.' (it is on the kernel command line)
  microvm_accel accel = microvm_accel::automatic;
  /// How long one boot may take until the agent is ready, and how many times
  /// a boot that hangs is tried (TCG boots hang at random now and then).
  std::chrono::milliseconds boot_timeout{180000};
  unsigned attempts = 2;
  /// When set and it turns true, boot() stops waiting (errc::closed): a
  /// sandbox destroyed while it boots.
  const std::atomic<bool>* cancel = nullptr;
  /// Where QEMU's own cgroup is made (engine::cgroups()); none: QEMU runs
  /// in the caller's cgroup. With it, QEMU (every thread of it) joins a cgroup
  /// named `cgroup_name` before it execs, bounded by qemu_limits(): the
  /// guest's RAM plus QEMU's own (qemu_overhead), tasks, and `cpus` of CPU
  /// time. It goes when the VM does.
  const cgroup_root* cgroups = nullptr;
  std::string cgroup_name;
  /// What QEMU may use on top of the guest's RAM: its own code, devices, I/O
  /// buffers, and under TCG its translation cache (bounded at 128 MiB).
  static constexpr uint64_t qemu_overhead = 384ull << 20;
  /// The limits of QEMU's cgroup: memory = RAM + qemu_overhead, at most 256
  /// tasks, `cpus` CPUs of time.
  [[nodiscard]] limits qemu_limits() const;
};

/// Where a boot's time went (host wall clock, and the guest's CLOCK_BOOTTIME).
struct microvm_boot_times {
  double total_ms = 0;  ///< fork of QEMU to the agent's READY
  double kernel_ms = 0; ///< the guest kernel, to /init
  double agent_ms = 0;  ///< /init: modules, disks, mounts
  double qemu_ms = 0;   ///< the rest: QEMU's own setup and the channel
  unsigned attempts = 0;
};

/// Who a guest command runs as: root unless said (the guest agent sets the
/// groups, gid and uid after its chroot, before the exec).
struct vm_credentials {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups; ///< supplementary; at most VM_MAX_GROUPS
};

class microvm {
public:
  /// One whole frame from the guest.
  struct frame {
    uint16_t type = 0;
    uint16_t flags = 0;
    uint32_t id = 0;
    std::string payload;
  };

  /// Starts QEMU and waits until the guest agent is ready (or boot_timeout,
  /// then again up to `attempts`). Errors: invalid_argument (a bad option,
  /// naming it), not_found (qemu, the kernel, a layer), sandbox_failed (the
  /// guest said why, or QEMU exited: the message carries the console's tail),
  /// timeout.
  static expected<std::unique_ptr<microvm>> boot(const microvm_options& opts);

  /// Kills QEMU (SIGKILL) and reaps it.
  ~microvm();
  microvm(const microvm&) = delete;
  microvm& operator=(const microvm&) = delete;

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  [[nodiscard]] microvm_accel accel() const noexcept { return accel_; }
  [[nodiscard]] const microvm_boot_times& boot_times() const noexcept { return times_; }
  /// QEMU's cgroup directories (empty without options.cgroups).
  [[nodiscard]] std::vector<std::string> cgroup_paths() const;
  /// The last bytes of the guest console and QEMU's stderr (for errors).
  [[nodiscard]] std::string console_tail() const;

  /// The bytes queued and not yet written to the guest. Thread-safe.
  [[nodiscard]] size_t queued() const;
  /// Adds a frame to send. Thread-safe; wakes pump().
  void queue(uint16_t type, uint32_t id, std::string_view a, std::string_view b = {},
             uint16_t flags = 0);
  /// Encodes an exec frame's payload.
  static std::string exec_payload(const std::vector<std::string>& argv,
                                  const std::vector<std::string>& env, const std::string& cwd,
                                  const vm_credentials& who = {});

  /// Moves bytes: sends what is queued, reads what the guest wrote and calls
  /// on_frame for each whole frame. Waits at most timeout_ms (-1: until
  /// something happens). Errors: sandbox_failed when QEMU has exited or the
  /// guest broke the protocol (the VM is then useless).
  expected<void> pump(int timeout_ms, const std::function<void(frame&&)>& on_frame);
  /// Wakes a pump() that waits, from any thread.
  void wake();

  // ---- synchronous calls (they pump; not while another thread pumps) ----
  using output_fn = std::function<void(int stream, std::string_view bytes)>;
  /// Runs argv in the guest's root; feeds it `input` then closes its stdin;
  /// streams its output to `out` as it comes. Returns its wait status.
  /// not_found (or another code) when it could not start.
  expected<int> exec(const std::vector<std::string>& argv, std::string_view input,
                     const output_fn& out, const std::vector<std::string>& env = {},
                     const std::string& cwd = "/");
  expected<void> put_file(const std::string& path, std::string_view content,
                          uint32_t mode = 0644);
  expected<std::string> get_file(const std::string& path);
  /// A fresh id for a command or transfer.
  uint32_t next_id() { return ++last_id_; }

private:
  microvm() = default;
  expected<void> start_once(const microvm_options& opts);
  expected<void> wait_ready(std::chrono::milliseconds timeout, const std::atomic<bool>* cancel);
  void kill_qemu();
  void read_console();
  expected<frame> wait_for(uint32_t id, const std::function<bool(frame&)>& keep_going);

  pid_t pid_ = -1;
  unique_fd pidfd_;
  std::optional<sandbox_cgroup> cgroup_; ///< QEMU's, when options.cgroups is set
  unique_fd channel_; ///< the agent port (a socketpair end), non-blocking
  unique_fd console_; ///< console and QEMU's stderr
  unique_fd wake_;    ///< an eventfd
  microvm_accel accel_ = microvm_accel::tcg;
  microvm_boot_times times_;
  std::chrono::steady_clock::time_point started_;

  mutable std::mutex out_mutex_;
  std::string out_; ///< queued bytes not yet written
  std::string in_;  ///< bytes read, not yet a whole frame
  std::string console_tail_;
  uint32_t last_id_ = 0;
};

} // namespace dsec

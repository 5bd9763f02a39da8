// What a sandbox's /proc hides and protects, the way container runtimes do it
// (runc's and crun's default masked and read-only paths, plus /proc/cmdline):
// the host's kernel command line, kernel memory, keys, timers and scheduler
// internals read as empty files; hardware directories (/proc/acpi, /proc/scsi,
// /proc/asound) as empty directories; /proc/sys, /proc/sysrq-trigger,
// /proc/irq, /proc/bus and /proc/fs are read-only.
//
// Cost: one bind mount per masked path and a bind plus a remount per
// read-only one (~5 us per bind, ~1.5 us per remount here), nothing made per
// sandbox. The empty file and directory bound over the masked paths live on
// one read-only tmpfs the zygote makes once (prepare_proc_masks): a bind takes
// that mount's flags (read-only, nosuid, nodev, noexec) and the tmpfs itself
// is read-only, so no sandbox can write into what every sandbox of the zygote
// shares. Paths this kernel lacks when the zygote starts are not tried again
// (each failed lookup costs ~2 us), except those a module can add later.
//
// Async-signal-safe and allocation-free: all of it runs in the zygote and in a
// sandbox's first process (runtime/zygote.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsec {

enum class proc_mask_kind : uint8_t {
  empty_file, ///< an empty read-only file bound over it
  empty_dir,  ///< an empty read-only directory bound over it
  read_only,  ///< bound onto itself, read-only
};

struct proc_mask {
  const char* name; ///< below /proc
  proc_mask_kind kind;
  bool by_module;   ///< a module can add it after boot: always tried
};

inline constexpr proc_mask proc_masks[] = {
  {"cmdline", proc_mask_kind::empty_file, false},
  {"kcore", proc_mask_kind::empty_file, false},
  {"keys", proc_mask_kind::empty_file, false},
  {"timer_list", proc_mask_kind::empty_file, false},
  {"timer_stats", proc_mask_kind::empty_file, false},
  {"sched_debug", proc_mask_kind::empty_file, false},
  {"latency_stats", proc_mask_kind::empty_file, false},
  {"acpi", proc_mask_kind::empty_dir, false},
  {"scsi", proc_mask_kind::empty_dir, true},
  {"asound", proc_mask_kind::empty_dir, true},
  {"sys", proc_mask_kind::read_only, false},
  {"sysrq-trigger", proc_mask_kind::read_only, false},
  {"irq", proc_mask_kind::read_only, false},
  {"bus", proc_mask_kind::read_only, false},
  {"fs", proc_mask_kind::read_only, false},
};
inline constexpr size_t proc_mask_count = sizeof proc_masks / sizeof proc_masks[0];
static_assert(proc_mask_count <= 32);

/// Mounts a small tmpfs at `dir` (an existing empty directory) holding an empty
/// file "file" and an empty directory "dir", then makes it read-only. Needs
/// CAP_SYS_ADMIN over the caller's mount namespace. 0 or -errno.
int prepare_proc_masks(const char* dir);

/// The masks worth trying (bit i: proc_masks[i]): those whose path exists
/// below the proc mounted at `proc`, and those a module may add later.
uint32_t proc_masks_to_apply(const char* proc);

/// Applies the masks of `which` to the proc mounted at `proc` (e.g.
/// "/mnt/proc") from the tmpfs that prepare_proc_masks made at `masks`; a path
/// that does not exist is skipped. 0, or -errno with the name (below /proc) of
/// the path that failed in *failed.
int mask_proc(const char* proc, const char* masks, uint32_t which, const char** failed);

} // namespace dsec

// A sandbox's init: pid 1 of the sandbox's pid namespace, forked from the
// zygote. It is not exec'd: after the setup steps it serves the control socket.
//
// It runs commands the dsec process sends (exec), signals their process groups
// (signal), reports when they start and end, and reaps every orphan. It is not
// dumpable, so no process in the sandbox can ptrace it or read its memory; and
// being pid 1 of its namespace it ignores every signal sent from inside. When
// the control socket closes (dsec went away), init exits and the kernel kills
// everything left in the sandbox.
//
// In a Chronus sandbox (proto::spawn_chronus) init first forks the trusted
// helper, which stays in the sandbox's Landlock domain, and then enters a nested
// domain of its own (the agent's): untrusted commands are init's vfork children
// and share it, so they can ptrace and signal one another as before. A trusted
// command goes to the helper, which clones it with CLONE_PARENT: init remains
// its parent, reaps it and reports it like any other command, but it lives in
// the outer domain, where Landlock keeps every process of the agent's domain
// from ptracing it (so from /proc/PID/environ, /proc/PID/mem, pidfd_getfd) and
// from signalling it. The helper is not dumpable, holds nothing but its socket
// to init, the trusted channel (each trusted command gets it at fd 3: its way to
// Chronus, docs/chronus.md) and the pristine root (what `exec_pristine`
// commands are chrooted into), and dies with init (the end of a pid
// namespace's init kills every process in it).
#pragma once

#include <cstddef>

namespace dsec {

/// Forks the trusted helper (see above). The caller must still be in the
/// sandbox's own Landlock domain, hold CAP_SYS_CHROOT, and hold no descriptor
/// but `ctl` (which the helper closes), `channel` and `pristine` (which init
/// closes: only the helper keeps them). `channel`: the sandbox's end of the
/// trusted channel, which every trusted command gets at fd 3. `pristine`: an
/// O_PATH descriptor of the pristine root, which pristine commands enter with
/// chroot (the helper keeps CAP_SYS_CHROOT for that; its commands drop it).
/// `argv_begin`/`argv_len`: the process's argv strings, which the helper
/// overwrites with its name (what `ps` shows). Returns init's end of the
/// helper's socket, or -errno.
int start_trusted_helper(int ctl, char* argv_begin, size_t argv_len, int channel, int pristine);

/// Set by the zygote when it could lower its oom_score_adj (to -999, so that
/// the memory cgroup's OOM killer takes the sandbox's commands before its
/// init): init inherits the value and then gives each command 0 again. When
/// it could not, init's children start at 500 instead (init_oom_score_fd).
extern bool init_resets_oom_score_adj;

/// When it could not: init's own /proc/self/oom_score_adj, opened for writing
/// by the zygote's child before it became init (init cannot open its own /proc
/// files: it is not dumpable); -1 otherwise. Init raises itself to 500 around
/// each fork, so that its children start there, and goes back to 0.
extern int init_oom_score_fd;

/// The root of the sandbox's own devpts instance, an O_PATH descriptor the
/// zygote's child opened right after mounting it (before any command of the
/// sandbox ran), or -1. Init opens pseudo-terminals (proto::exec_pty) through
/// it, never through a path of the sandbox: an agent that renames, replaces
/// or symlinks /dev/pts, or /dev/ptmx, changes nothing for init. (devpts
/// itself lets nobody create, rename or remove its entries, and the sandbox
/// holds no CAP_SYS_ADMIN to mount over them.) The trusted helper and the
/// commands do not inherit it.
extern int init_devpts_fd;

/// Serves `ctl` until it closes; never returns. `helper`: the trusted helper's
/// socket (start_trusted_helper), or -1 when there is none: trusted commands
/// are then refused.
[[noreturn]] void init_main(int ctl, int helper);

} // namespace dsec

// A sandbox's init: pid 1 of the sandbox's pid namespace, forked from the
// zygote. It is not exec'd: after the setup steps it serves the control socket.
//
// It runs commands the dsec process sends (exec), signals their process groups
// (signal), reports when they start and end, and reaps every orphan. It is not
// dumpable, so no process in the sandbox can ptrace it or read its memory; and
// being pid 1 of its namespace it ignores every signal sent from inside. When
// the control socket closes (dsec went away), init exits and the kernel kills
// everything left in the sandbox.
#pragma once

namespace dsec {

/// Serves `ctl` until it closes; never returns.
[[noreturn]] void init_main(int ctl);

} // namespace dsec

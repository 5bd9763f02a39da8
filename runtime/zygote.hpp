// The zygote: dsec's sandbox spawner process (the dsec-spawner binary).
//
// A dsec process starts one zygote per spawning thread. The zygote lives in a
// minimal private mount namespace (a tmpfs root holding only /proc and an empty
// /mnt), inside the sandbox user namespace and an empty network namespace. For
// each request it clones a sandbox's first process with fresh mount, pid, uts
// and ipc namespaces (and a network namespace when asked), as a child of the
// dsec process (CLONE_PARENT), which therefore reaps it. That first process sets
// up the sandbox root and stays as the sandbox's init (see init.hpp).
//
// Why a separate process: every CLONE_NEWNS copies the caller's mounts (6 here
// instead of the host's ~25), whatever lies beneath the sandbox's root is an
// empty tmpfs instead of the host, and the multithreaded daemon never forks.
#pragma once

namespace dsec {

/// Entry point of dsec-spawner. fd 3: SOCK_SEQPACKET to the dsec process;
/// fd 4: the sandbox user namespace. argv[1] == "--zygote", argv[2] the pid
/// of the dsec process.
int zygote_main(int argc, char** argv);

} // namespace dsec

// Messages with file descriptors over AF_UNIX SOCK_SEQPACKET sockets: how dsec
// talks to its zygote and to each sandbox's init. No allocation, so the zygote
// and init can use them anywhere.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace dsec::unix_socket {

/// Most descriptors one message carries.
constexpr size_t max_fds = 40;

/// Sends one message with `nfds` descriptors attached. Returns bytes sent or -1
/// with errno set. Retries EINTR; never raises SIGPIPE.
ssize_t send(int sock, const void* buf, size_t len, const int* fds, size_t nfds);

/// Receives one message; received descriptors are stored in `fds` (close-on-exec)
/// and their count in `*nfds`. Returns bytes received, 0 on EOF, or -1 with errno.
/// A truncated message or surplus descriptors fail with EMSGSIZE (the extra
/// descriptors are closed), so a peer cannot smuggle or overflow anything.
/// `flags` are recvmsg's (MSG_DONTWAIT: EAGAIN rather than wait).
ssize_t recv(int sock, void* buf, size_t cap, int* fds, size_t max, size_t* nfds,
             int flags = 0);

/// socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC).
int pair(int out[2]);

} // namespace dsec::unix_socket

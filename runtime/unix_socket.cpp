#include "runtime/unix_socket.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dsec::unix_socket {

ssize_t send(int sock, const void* buf, size_t len, const int* fds, size_t nfds) {
  if (nfds > max_fds) {
    errno = EINVAL;
    return -1;
  }
  iovec iov{const_cast<void*>(buf), len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds)];
  if (nfds > 0) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    auto* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  ssize_t n;
  do
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n;
}

ssize_t recv(int sock, void* buf, size_t cap, int* fds, size_t max, size_t* nfds, int flags) {
  iovec iov{buf, cap};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | flags);
  while (n < 0 && errno == EINTR);
  if (nfds)
    *nfds = 0;
  if (n < 0)
    return n;
  size_t got = 0;
  bool overflow = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
  for (auto* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    int tmp[max_fds];
    if (k > max_fds)
      k = max_fds;
    std::memcpy(tmp, CMSG_DATA(c), k * sizeof(int));
    for (size_t i = 0; i < k; ++i) {
      if (got < max && fds)
        fds[got++] = tmp[i];
      else {
        ::close(tmp[i]);
        overflow = true;
      }
    }
  }
  if (overflow) {
    for (size_t i = 0; i < got; ++i)
      ::close(fds[i]);
    errno = EMSGSIZE;
    return -1;
  }
  if (nfds)
    *nfds = got;
  return n;
}

int pair(int out[2]) {
  return ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, out);
}

} // namespace dsec::unix_socket

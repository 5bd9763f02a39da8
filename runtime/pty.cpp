#include "runtime/pty.hpp"

#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>

namespace dsec::pty {

bool is_master(int fd) {
  struct stat st;
  // TTYAUX_MAJOR 5, minor 2: /dev/ptmx, and the ptmx node of every devpts.
  return ::fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && ::major(st.st_rdev) == 5
         && ::minor(st.st_rdev) == 2;
}

expected<void> resize(int master, window w) {
  winsize ws{};
  ws.ws_row = w.rows;
  ws.ws_col = w.cols;
  if (::ioctl(master, TIOCSWINSZ, &ws) < 0)
    return sys_error("setting the terminal's window size");
  return {};
}

char eof_char(int master) {
  termios t{};
  // On a master, the termios is the slave's: what the command's line
  // discipline takes as end of file.
  if (::tcgetattr(master, &t) == 0 && t.c_cc[VEOF] != _POSIX_VDISABLE)
    return static_cast<char>(t.c_cc[VEOF]);
  return '\x04';
}

std::optional<window> size_of(int fd) {
  winsize ws{};
  if (::ioctl(fd, TIOCGWINSZ, &ws) < 0 || ws.ws_row == 0 || ws.ws_col == 0)
    return std::nullopt;
  return window{ws.ws_row, ws.ws_col};
}

namespace {

termios saved{};
int saved_fd = -1;
std::atomic<bool> raw{false};

} // namespace

bool make_raw(int fd) {
  if (raw.load())
    return true;
  termios t{};
  if (::tcgetattr(fd, &t) < 0)
    return false;
  saved = t;
  saved_fd = fd;
  ::cfmakeraw(&t);
  t.c_cc[VMIN] = 1;
  t.c_cc[VTIME] = 0;
  static bool registered = false;
  if (!registered) {
    registered = true;
    std::atexit(restore);
  }
  raw.store(true);
  if (::tcsetattr(fd, TCSADRAIN, &t) < 0) {
    raw.store(false);
    return false;
  }
  return true;
}

void restore() {
  if (!raw.exchange(false))
    return;
  int err = errno;
  (void) ::tcsetattr(saved_fd, TCSADRAIN, &saved);
  errno = err;
}

} // namespace dsec::pty

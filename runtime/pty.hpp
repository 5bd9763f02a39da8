// Pseudo-terminals: what the host side does with a command's terminal master
// (container::take_pty, container_event::pty), and the local terminal of the
// command line (raw mode, its size). No CAF.
//
// The master comes from the sandbox's init (proto::exec_pty): dsec never
// opens a path of the sandbox to get it, checks that what it got is a pty
// master, and only reads, writes (non-blocking) and ioctls it.
#pragma once

#include <cstdint>
#include <optional>

#include "runtime/error.hpp"

namespace dsec::pty {

/// A terminal's window size.
struct window {
  uint16_t rows = 24;
  uint16_t cols = 80;
};

/// True if `fd` is a pseudo-terminal master (a devpts ptmx: character device
/// 5:2).
bool is_master(int fd);

/// Sets the window size of the terminal whose master is `master`; the
/// kernel sends SIGWINCH to its foreground process group when it changed.
expected<void> resize(int master, window w);

/// The terminal's end-of-file character (VEOF of its termios), ^D when it
/// cannot be read.
char eof_char(int master);

// ---- the local terminal (the command line) ----

/// The window size of the terminal at `fd`, if it is one.
std::optional<window> size_of(int fd);

/// Puts the terminal at `fd` in raw mode (cfmakeraw: no echo, no line
/// editing, no signals from ^C, ^Z, ^\, no output processing), keeping its
/// settings for restore(). False if it is not a terminal or cannot be set.
bool make_raw(int fd);

/// Restores what make_raw() changed; nothing if it did not. Async-signal-safe
/// and idempotent: call it on every way out (it is also registered with
/// atexit by make_raw).
void restore();

} // namespace dsec::pty

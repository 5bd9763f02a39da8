// Streamed file transfers (issue 20; docs/actors.md, "Transfers"): the sizes
// that bound them, and sources and sinks over file descriptors for
// client::put_from and client::get_into. A transfer is a command with a
// process handle whose tar the sandbox runs itself (exec_request.transfer):
// a put writes the tar stream to its stdin in pieces (each sent once the
// daemon took the one before), a get's tar streams its stdout back with a
// window of credit (exec_request.window, credit_atom), so neither the client,
// a coordinator relaying, nor the sandbox's daemon holds more than a few
// pieces of a transfer, whatever its size and however slow either end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "actors/client.hpp"

namespace dsec {

/// The piece a put sends at a time (the daemon takes it into the command's
/// stdin buffer only while less than stdin_buffer waits there).
constexpr size_t transfer_piece = 512u << 10;
/// A get's window: at most this much of its tar stream is on its way to the
/// client and not yet consumed (the sandbox's pipe reads up to 256 KiB more).
constexpr uint64_t transfer_window = 1u << 20;
/// The whole-buffer put up to this size is one message (client::put).
constexpr size_t transfer_single = 1u << 20;
/// A get holds back its first bytes until there are this many or its tar
/// ended, so that a get that fails (a missing path) gives its error and no
/// bytes of an empty archive.
constexpr size_t transfer_hold_back = 64u << 10;

/// The PATH a transfer's tar is found in (the image's first, then the static
/// busybox of the node's system layer, /.dsec/libexec).
constexpr const char* transfer_tar_path =
  "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/.dsec/libexec";

/// A source reading `fd` until its end (EINTR retried).
source_fn fd_source(int fd);
/// A sink writing everything to `fd` (EINTR and short writes handled).
sink_fn fd_sink(int fd);

} // namespace dsec

// What put and get run in a sandbox, and how their tar's end reads as an
// error (docs/actors.md, "Transfers"): shared by the container and microVM
// sandbox actors. No CAF here beyond the message types.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "actors/messages.hpp"
#include "actors/transfer.hpp"

namespace dsec {

// put and get run a tar in the sandbox (the image's, else the system layer's
// busybox), which the agent may have replaced or may keep busy (a fifo it
// reads, a tree that never ends): bounded like any command, in output and in
// time, so a request cannot wait for ever.
constexpr uint64_t put_get_timeout_ms = 5 * 60 * 1000;

// put's and get's PATH: the image's tar first, else the static busybox of the
// system layer (/.dsec/libexec/tar, store::system_layer), so an image without tar
// can still take and give files.
constexpr const char* put_get_path = transfer_tar_path;

/// What a put or get that found no tar says.
extern const char* const no_tar;

/// What a failed tar of put or get (`what`: "get /work/x") means: a missing
/// file or directory is not_found, a full disk too_large, anything else
/// `otherwise` with tar's first line of stderr.
error tar_failure(const std::string& what, const exec_result& r, errc otherwise);
/// A transfer (exec_request.transfer) as the command the sandbox runs: its
/// own tar, PATH, limits and handle settings; only the path, the window and
/// the user come from the request.
expected<exec_request> transfer_command(const exec_request& in);
/// How a put's or get's tar (of `path`) failed; nothing when it succeeded.
std::optional<error> tar_error(bool put, const std::string& path,
                               const expected<exec_result>& r);
/// What a transfer's tar ended with, as put's and get's errors say it.
expected<exec_result> transfer_outcome(const exec_request& req, expected<exec_result> r);
/// The whole-buffer put and get (put_atom, get_atom): the transfer's own
/// command, with `tar` as its input and its output collected (at most 256
/// MiB) instead of streamed.
expected<exec_request> whole_buffer_command(uint8_t kind, const std::string& path,
                                            const std::string& tar);
/// A whole-buffer put's answer from its tar's end: the archive's `size`.
expected<uint64_t> put_answer(const std::string& dir, uint64_t size,
                              const expected<exec_result>& r);
/// A whole-buffer get's answer from its tar's end: the archive (at most 256 MiB).
expected<std::string> get_answer(const std::string& path, expected<exec_result> r);
/// Gives a response promise an answer: its value, or its error (to_caf of
/// actors/types.hpp, found where it is used).
template <class Promise, class T>
void deliver(Promise& rp, expected<T> r) {
  if (r)
    rp.deliver(std::move(*r));
  else
    rp.deliver(to_caf(std::move(r).error_value()));
}

} // namespace dsec

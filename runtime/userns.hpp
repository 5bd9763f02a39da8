// The user namespace every sandbox runs in. Sandbox uid/gid 0..count-1 map to
// host ids base..base+count-1: a sandbox's root owns its own files and has
// capabilities over its own namespaces, and no privilege at all on the host.
#pragma once

#include <cstdint>

#include "runtime/error.hpp"
#include "runtime/fd.hpp"

namespace dsec {

struct id_range {
  uint32_t base = 1'000'000'000; ///< host uid/gid of the sandbox's root
  uint32_t count = 65536;        ///< sandbox ids 0..count-1
};

/// Creates a user namespace mapping `ids` (uids and gids) and returns its fd.
/// Safe to call from a multithreaded process (the helper child only blocks and
/// exits).
expected<unique_fd> make_userns(const id_range& ids);

} // namespace dsec

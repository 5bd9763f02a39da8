// The user namespace every sandbox runs in. Sandbox uid/gid 0..count-1 map to
// host ids base..base+count-1: a sandbox's root owns its own files and has
// capabilities over its own namespaces, and no privilege at all on the host.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "runtime/error.hpp"
#include "runtime/fd.hpp"

namespace dsec {

struct id_range {
  uint32_t base = 1'000'000'000; ///< host uid/gid of the sandbox's root
  uint32_t count = 65536;        ///< sandbox ids 0..count-1
  /// The namespace's first id (mapped to `base`): 0 for the sandbox's
  /// namespace; pack_diff's idmap maps inside base..base+count-1 to 0.. (snapshot.hpp).
  uint32_t inside = 0;
};

/// A small helper process living in a new sandbox user namespace. It holds the
/// namespace while its fd is taken, and makes network namespaces owned by it,
/// in parallel with its caller (making one takes ~0.36 ms). It shares our
/// memory (CLONE_VM) and runs only raw system calls, so it is safe to start
/// from a multithreaded process.
class userns_helper {
public:
  /// Creates the user namespace (mapping `ids`) and the helper inside it.
  static expected<userns_helper> start(const id_range& ids);

  /// The user namespace.
  [[nodiscard]] int userns_fd() const { return userns_.get(); }
  unique_fd take_userns() { return std::move(userns_); }

  /// Asks for a network namespace; returns at once.
  expected<void> request_netns();

  /// Waits for the namespace asked for and returns its fd.
  expected<unique_fd> take_netns();

  /// Tells the helper to exit and reaps it.
  ~userns_helper();
  userns_helper(userns_helper&&) noexcept;
  userns_helper& operator=(userns_helper&&) = delete;
  userns_helper(const userns_helper&) = delete;

private:
  userns_helper() = default;
  void stop() noexcept;

  pid_t pid_ = -1;
  unique_fd to_helper_;   // commands: 'n' make a netns, EOF quit
  unique_fd from_helper_; // answers: 'y' started, 'n' netns made, 'e' failed
  unique_fd userns_;
  void* stack_ = nullptr;
};

/// Creates a user namespace mapping `ids` (uids and gids) and returns its fd.
expected<unique_fd> make_userns(const id_range& ids);

} // namespace dsec

// Sandboxes through the runtime API directly (no CLI): one spawner, the
// fixture's layers mounted once, and a helper that runs a command in a
// container and captures its output. For tests that need several sandboxes of
// one zygote (they share its empty network namespace) or thousands of them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/container.hpp"
#include "runtime/mount.hpp"
#include "runtime/spawner.hpp"
#include "runtime/store.hpp"

namespace dsec::test {

/// A spawner and mounted layers, ready to create containers from.
class api_env {
public:
  /// Leases and mounts the system layer and `refs` (topmost first) from the
  /// suite's store; the test fails if anything does not work.
  explicit api_env(const std::vector<std::string>& refs);

  [[nodiscard]] spawner& sp() { return *sp_; }
  /// Directory fds of the layers, topmost (the system layer) first.
  [[nodiscard]] const std::vector<int>& lowers() const { return lowers_; }
  /// Only the given layers, without the system layer (no /proc, /dev/pts:
  /// creation fails inside the sandbox).
  [[nodiscard]] std::vector<int> lowers_without_system() const {
    return {lowers_.begin() + 1, lowers_.end()};
  }

  /// container::create with these layers; the test fails if it does not work.
  std::unique_ptr<container> create(const container_options& opts = {},
                                    const cgroup_root* cgroups = nullptr);

private:
  std::unique_ptr<spawner> sp_;
  std::vector<layer_lease> leases_;
  std::vector<layer_mount> mounts_;
  std::vector<int> lowers_;
};

struct exec_result {
  exit_status status;
  std::string out; ///< stdout and stderr
};

/// Runs argv in `c` (default environment, cwd /), waits (a generous safety
/// deadline; the test fails past it) and returns its status and output.
exec_result exec_capture(container& c, const std::vector<std::string>& argv);

} // namespace dsec::test

// The fixture every suite shares: one temporary directory per test executable
// holding a state dir with the layers below, built once through the real CLI
// ($DSEC_BIN layer build), and helpers that run `dsec` against it.
//
// Layers (sources under ROOT/src/):
//   bb@1  base     /bin/busybox and its applets (sh, ls, cat, echo, sleep, ...),
//                  /usr/bin/probe (test/probe), /etc/layer-file "base",
//                  /etc/base-only, /etc/passwd, /etc/group, /home/user (uid 1000)
//   wd@1  workdir  /work/marker, /work/src/main.c, /etc/layer-file "workdir"
//   ta@1  tool     /opt/ta/bin/ta, /etc/layer-file "tool-a"
//   tb@1  tool     /opt/tb/marker, /etc/layer-file "tool-b"
//
// Cleanup in every outcome: the directory is removed when the executable exits;
// if it dies instead (a crash, SIGKILL, meson's timeout), a janitor process
// started with it notices (its pipe closes) and removes it. Programs the tests
// start die with the test process (PR_SET_PDEATHSIG), taking their sandboxes.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "test/support/process.hpp"

namespace dsec::test {

inline constexpr const char* base_layer = "bb@1";
inline constexpr const char* workdir_layer = "wd@1";
inline constexpr const char* tool_a = "ta@1";
inline constexpr const char* tool_b = "tb@1";

/// Removes a directory tree; symlinks are not followed. Errors are ignored.
void remove_tree(const std::string& path);

/// Writes `content` to `path` (parent directories created) with `mode`.
void write_file(const std::string& path, std::string_view content, unsigned mode = 0644);

/// The whole file; empty if it cannot be read.
std::string read_file(const std::string& path);

/// The lower-case hex sha256 of a file.
std::string sha256_of(const std::string& path);

/// `text` split into lines (no trailing empty line).
std::vector<std::string> lines_of(const std::string& text);

/// $NAME, or a failed test if unset.
std::string env_path(const char* name);

/// A directory made with mkdtemp under `parent`, removed with its contents on
/// destruction.
class temp_dir {
public:
  explicit temp_dir(const std::string& parent = "/tmp", const std::string& prefix = "dsec-test");
  ~temp_dir();
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] std::string operator/(const std::string& sub) const { return path_ + "/" + sub; }

private:
  std::string path_;
};

class suite {
public:
  /// The executable's fixture; builds the layers on first use.
  static suite& get();

  [[nodiscard]] const std::string& root() const { return root_; }
  [[nodiscard]] const std::string& state() const { return state_; }
  [[nodiscard]] const std::string& dsec_bin() const { return dsec_; }
  [[nodiscard]] const std::string& probe_bin() const { return probe_; }

  /// A fresh scratch dir below root() (removed on destruction, and with root()).
  [[nodiscard]] temp_dir scratch() const { return temp_dir{root_, "scratch"}; }

  /// `dsec --state STATE ARGS...`.
  proc_result dsec(const std::vector<std::string>& args, const spawn_options& opts = {}) const;

  /// The argv of `dsec --state STATE run OPTIONS -- CMD...`; OPTIONS get
  /// `--base bb@1` unless they name a base.
  [[nodiscard]] std::vector<std::string> run_argv(const std::vector<std::string>& options,
                                                  const std::vector<std::string>& cmd) const;

  /// Runs run_argv(options, cmd) to completion.
  proc_result run(const std::vector<std::string>& options, const std::vector<std::string>& cmd,
                  const spawn_options& opts = {}) const;

  /// Writes `files` (path below the tree -> content) into a new directory
  /// ROOT/src/NAME and returns its path.
  std::string make_tree(const std::string& name,
                        const std::map<std::string, std::string>& files) const;

  /// `dsec layer build --kind KIND REF SRC`; the test fails unless it succeeds.
  void build_layer(const std::string& kind, const std::string& ref,
                   const std::string& src) const;

  /// "sha256:HEX" of a layer, from its ref file.
  [[nodiscard]] std::string digest_of(const std::string& ref) const;

  /// The blob (EROFS image) of a layer.
  [[nodiscard]] std::string blob_of(const std::string& ref) const;

  /// Everything a failed command must not change: `layer ls` and the listing
  /// (path, type, size) of blobs/, refs/, tmp/ and system/.
  [[nodiscard]] std::string store_snapshot() const;

  ~suite();
  suite(const suite&) = delete;
  suite& operator=(const suite&) = delete;

private:
  suite();
  void build_layers();

  std::string dsec_, probe_;
  std::string root_, state_;
  pid_t janitor_ = -1;
  int janitor_pipe_ = -1;
};

} // namespace dsec::test

// Options that `dsec run` shares with the remote verbs (`dsec --connect
// HOST:PORT run` and `exec`): a sandbox's layers and limits, and how a command
// runs in it. Each parser looks at the current argument only; no CAF here, the
// static dsec uses it too.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/environment.hpp"
#include "tools/dsec/cli.hpp"

namespace dsec::cli {

/// --base --workdir --tool --memory --pids --cpus --disk --net -v: the
/// sandbox's environment (runtime/environment.hpp), as every verb sends it.
struct sandbox_options {
  environment env;
  /// `--memory none`, `--pids none`: no such limit (a local `dsec run` only;
  /// a daemon applies its own defaults and takes no "none").
  bool no_memory = false, no_pids = false;
  /// What `-v HOST:SANDBOX` without :ro or :rw is: read-only through a
  /// daemon, writable in a local `dsec run` (whose user is root here).
  bool mounts_read_only = true;
};

/// --env --cwd --user --timeout
struct command_spec {
  std::vector<std::string> env; ///< KEY=VALUE overrides, in the order given
  std::string cwd = "/";
  /// --user as given (USER[:GROUP], names or numbers): looked up in the
  /// image's /etc/passwd and /etc/group, which decide over uid and gid (a
  /// number of no entry stays itself).
  std::string user;
  std::optional<std::chrono::milliseconds> timeout;
  /// --cwd / --user came (an OCI image's WorkingDir and User apply otherwise).
  bool cwd_given = false, user_given = false;
};

/// What became of the current argument.
enum class parsed {
  no,  ///< not one of these options; left where it is
  yes, ///< consumed (with its value)
  bad, ///< a usage error, already printed: exit with status 2
};

/// Offers the current argument to the sandbox options; errors are reported as
/// `dsec VERB: ...`.
parsed parse_sandbox_option(args& a, std::string_view verb, sandbox_options& s);

/// Offers the current argument to the command options.
parsed parse_command_option(args& a, std::string_view verb, command_spec& c);

/// The checks once all options are read: --base given, then
/// environment::validate(). Prints the usage error and returns 2, or nothing
/// when all is well.
std::optional<int> check_sandbox_options(std::string_view verb, const sandbox_options& s);

} // namespace dsec::cli

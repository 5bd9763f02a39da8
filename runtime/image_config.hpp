// image_config: what dsec keeps of an OCI image's config (Env, WorkingDir,
// User, Entrypoint, Cmd), and those as the defaults of a sandbox's commands
// (docs/images.md, "The image config"). One rule for the local `dsec run` and
// for the daemon's sandboxes: a field the command gives wins, else the image's,
// else dsec's own default.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.hpp"

namespace dsec {

/// The "config" object of an OCI image config, as far as dsec uses it.
struct image_config {
  std::vector<std::string> env; ///< "K=V"
  std::string working_dir;
  std::string user;
  std::vector<std::string> entrypoint;
  std::vector<std::string> cmd;

  /// One line of JSON: {"Env":[...],"WorkingDir":"...","User":"...",
  /// "Entrypoint":[...],"Cmd":[...]} (the OCI names).
  [[nodiscard]] std::string to_json() const;
  /// Reads to_json()'s output (or an OCI config's "config" object).
  static expected<image_config> from_json(std::string_view json);

  friend bool operator==(const image_config&, const image_config&) = default;
};

/// The user an image's `User` names: `UID`, `UID:GID`, `NAME` or `NAME:GID`.
/// A name is looked up in `passwd`, the text of the image's /etc/passwd
/// (nullopt: it has none); its entry gives the gid (unless one is given) and
/// the home directory. A group must be a number. Errors (invalid_argument)
/// quote the User and say what is wrong with it.
struct image_user {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::string home; ///< from the passwd entry of a name; empty for a number
};
expected<image_user> resolve_image_user(std::string_view user,
                                        const std::optional<std::string>& passwd);

/// An image's etc/passwd and etc/group, as texts (nullopt: it has none).
struct user_files {
  std::optional<std::string> passwd;
  std::optional<std::string> group;
  /// Takes each file it does not have yet from the image root `root_fd` (its
  /// lowers in turn, topmost first), as read_image_passwd reads.
  void add_lower(int root_fd);
};

/// A command's user as a caller names it (`--user USER[:GROUP]`,
/// exec_request.user), each part a name or a number below 65536. A user name
/// is looked up in files.passwd: its uid, its primary gid (unless GROUP is
/// given), its home; a number takes the same from an entry of that uid, if
/// passwd has one. The supplementary groups are the primary one and those of
/// files.group that list the entry's name, as login(1) and docker give them.
/// A group name is looked up in files.group. Errors (invalid_argument) quote
/// the spec and say what is missing.
struct command_user {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::string name;             ///< the passwd entry's name, if one was found
  std::string home;             ///< its home directory, if it has one
  std::vector<uint32_t> groups; ///< supplementary, the primary gid first
};
expected<command_user> resolve_command_user(std::string_view spec, const user_files& files);

struct command;
/// `cmd` runs as `u`: its uid, gid and groups, and HOME (the entry's home,
/// else /) and USER (the entry's name) unless `given` (the caller's own
/// environment entries) sets them.
void apply_command_user(command& cmd, command_user u, const std::vector<std::string>& given);

/// The environment `env` with each "K=V" of `over` added, replacing a K= that
/// `env` has.
std::vector<std::string> merge_env(std::vector<std::string> env,
                                   const std::vector<std::string>& over);

/// What a command of a sandbox takes from its base image when it leaves a field
/// out. Made once per sandbox (the config and passwd do not change under it).
struct command_defaults {
  std::vector<std::string> argv; ///< Entrypoint then Cmd
  /// command::default_env() (PATH, HOME=/root, LANG, TERM), with HOME from the
  /// User's passwd entry, under the image's Env.
  std::vector<std::string> env;
  std::string cwd = "/";           ///< WorkingDir (made absolute), else /
  std::optional<image_user> user;  ///< none: root
  /// The image names a User that cannot be resolved: a command that does not
  /// give its own user fails with this, naming the image's User.
  std::optional<error> user_error;

  /// From `config_json` (image_config::to_json's output; empty: no config, so
  /// dsec's own defaults) and the image's /etc/passwd text (read only when
  /// User is a name: `passwd` is called at most once). A config that is not
  /// valid JSON is an error.
  static expected<command_defaults>
  of(std::string_view config_json,
     const std::function<std::optional<std::string>()>& passwd);
};

/// The text of etc/passwd beneath `root_fd` (an image's root directory),
/// opened with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS) so that a
/// symbolic link in the image cannot lead outside it; at most 1 MiB is read.
/// nullopt when the image has none (or it is not a regular file).
std::optional<std::string> read_image_passwd(int root_fd);

} // namespace dsec

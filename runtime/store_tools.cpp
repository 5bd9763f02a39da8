// The store's external tools (see store_detail.hpp): running tar and mkfs.erofs
// (no shell, output captured for the error, SOURCE_DATE_EPOCH pinned), the argv of
// a deterministic mkfs.erofs, and what a layer leaves out of its source tree.
#include "runtime/store_detail.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "runtime/sys.hpp"

extern char** environ;

namespace dsec::store_detail {

namespace {

// mkfs.erofs clamps every mtime above SOURCE_DATE_EPOCH to it and stamps the
// superblock with it; 2100-01-01 is above any real mtime, so per-file mtimes are
// kept while the image no longer depends on when it was built. (-T would also be
// deterministic, but it overwrites every file's mtime, which breaks make and
// friends inside the sandbox.) The fixed UUID removes the last random field.
constexpr const char* source_date_epoch = "SOURCE_DATE_EPOCH=4102444800";
constexpr const char* fixed_uuid = "-U00000000-0000-0000-0000-000000000000";

// How much of a failing tool's output goes into the error message.
constexpr size_t max_tool_output = 4096;

// Trims, joins lines with "; " and caps a tool's output so it fits in a message.
std::string tidy_output(std::string_view out) {
  while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back())))
    out.remove_suffix(1);
  while (!out.empty() && std::isspace(static_cast<unsigned char>(out.front())))
    out.remove_prefix(1);
  std::string tidy;
  for (char c : out)
    if (c == '\n')
      tidy += "; ";
    else
      tidy += c;
  return tidy;
}

} // namespace

expected<void> run_tool(const std::vector<std::string>& argv, const std::string& subject,
                        int input_fd) {
  const std::string& tool = argv.front();

  std::vector<char*> cargv;
  for (auto& a : argv)
    cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);

  std::vector<char*> envp;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e)
    if (std::strncmp(*e, "SOURCE_DATE_EPOCH=", 18) != 0)
      envp.push_back(*e);
  envp.push_back(const_cast<char*>(source_date_epoch));
  envp.push_back(nullptr);

  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0)
    return sys_error("cannot create a pipe for", tool);
  unique_fd read_end{pipe_fds[0]};
  unique_fd write_end{pipe_fds[1]};

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), 2);
  if (input_fd >= 0)
    posix_spawn_file_actions_adddup2(&actions, input_fd, 3);
  // A daemon may ignore SIGPIPE or block signals; the tool should not inherit that.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, tool.c_str(), &actions, &attr, cargv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  write_end.reset(); // so the read below sees EOF when the tool exits
  if (rc == ENOENT) {
    auto e = make_error(errc::tool_failed,
                        tool + " not found in PATH (install "
                          + (tool == "tar" ? "tar" : "erofs-utils") + ")");
    e.path = subject;
    return e;
  }
  if (rc != 0)
    return sys_error("cannot run " + tool + " for", subject, rc);

  std::string output;
  char buf[4096];
  for (;;) {
    auto n = sys::retry([&] { return ::read(read_end.get(), buf, sizeof buf); });
    if (n <= 0)
      break; // EOF, or a read error we cannot act on: the exit status still tells
    if (output.size() < max_tool_output)
      output.append(buf, std::min(static_cast<size_t>(n), max_tool_output - output.size()));
  }
  int status = 0;
  if (sys::retry([&] { return ::waitpid(pid, &status, 0); }) < 0)
    return sys_error("cannot wait for " + tool + " running on", subject);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
    return {};

  std::string how = WIFEXITED(status)
                      ? "exit status " + std::to_string(WEXITSTATUS(status))
                      : "killed by signal " + std::to_string(WTERMSIG(status));
  auto text = tidy_output(output);
  auto e = make_error(errc::tool_failed, tool + " failed on " + subject + " (" + how
                                           + (text.empty() ? ")" : "): " + text));
  e.path = subject;
  return e;
}

// What a layer leaves out of its source tree: device nodes (the system layer
// makes /dev; a node in an image would be a door to the host's devices
// wherever the layer is mounted without nodev) other than overlayfs whiteouts
// (0/0 character devices, which only hide a lower layer's name), and sockets
// (nothing listens on them in an image). Fifos, files, directories and links
// are kept; nothing is opened but directories (O_DIRECTORY|O_NOFOLLOW, which
// never waits on a fifo). Returns the paths relative to `tree` and, in
// `shown`, "/PATH (a socket)" for each.
//
// The same walk refuses what mkfs.erofs would fail on without naming it (a
// name of 255 bytes or more), and, when `rules.refuse_overlay_metadata`, the
// overlayfs metadata that would hide or rename a lower layer's files (0/0
// character devices, trusted.overlay.opaque and .redirect on directories). It
// notes sparse files (holes of at least 1 MiB), for mkfs_argv.
constexpr size_t max_left_out = 4096;
constexpr size_t max_erofs_name = 254; // mkfs.erofs 1.5 cannot format a 255-byte name
constexpr uint64_t sparse_hole = 1 << 20;

namespace {

// An overlayfs xattr on the directory `fd`, if any: its name.
const char* overlay_xattr_of(int fd) {
  for (const char* x : {"trusted.overlay.opaque", "trusted.overlay.redirect"})
    if (::fgetxattr(fd, x, nullptr, 0) >= 0)
      return x;
  return nullptr;
}

error overlay_metadata(const std::string& tree, const std::string& path, const std::string& what) {
  auto e = make_error(errc::invalid_argument,
                      "layer source " + tree + ": /" + path + " is " + what
                        + ", which in a tool or workdir layer hides or renames the files of the "
                          "layers below it; give --whiteouts if that is meant, or remove it");
  e.path = tree + "/" + path;
  return e;
}

} // namespace

expected<source_scan> scan_source(const std::string& tree, std::vector<std::string>& shown,
                                  const source_rules& rules) {
  source_scan out;
  auto& rel = out.exclude;
  struct frame {
    unique_fd fd;
    std::string path;
  };
  std::vector<frame> todo;
  todo.push_back({unique_fd{::open(tree.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)}, ""});
  if (!todo.back().fd)
    return sys_error("cannot open the layer source", tree);
  if (rules.refuse_overlay_metadata)
    if (auto x = overlay_xattr_of(todo.back().fd.get()))
      return overlay_metadata(tree, "", std::string{"a directory with "} + x);
  while (!todo.empty()) {
    auto f = std::move(todo.back());
    todo.pop_back();
    DIR* d = ::fdopendir(f.fd.release());
    if (!d)
      return sys_error("cannot list", tree + "/" + f.path);
    while (auto* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0)
        continue;
      std::string path = f.path.empty() ? e->d_name : f.path + "/" + e->d_name;
      if (auto len = std::strlen(e->d_name); len > max_erofs_name) {
        ::closedir(d);
        auto err = make_error(errc::invalid_argument,
                              "layer source " + tree + ": the name of /" + path + " is "
                                + std::to_string(len)
                                + " bytes long; a layer's names may be at most "
                                + std::to_string(max_erofs_name) + " bytes (mkfs.erofs)");
        err.path = tree + "/" + path;
        return err;
      }
      struct stat st{};
      if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        continue; // gone: mkfs.erofs will not see it either
      if (S_ISDIR(st.st_mode)) {
        unique_fd sub{::openat(::dirfd(d), e->d_name,
                               O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
        if (sub && rules.refuse_overlay_metadata)
          if (auto x = overlay_xattr_of(sub.get())) {
            ::closedir(d);
            return overlay_metadata(tree, path, std::string{"a directory with "} + x);
          }
        if (sub)
          todo.push_back({std::move(sub), path});
        continue;
      }
      if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) >= sparse_hole
          && static_cast<uint64_t>(st.st_blocks) * 512 + sparse_hole
               <= static_cast<uint64_t>(st.st_size))
        out.sparse = true;
      if (rules.refuse_overlay_metadata && S_ISCHR(st.st_mode) && st.st_rdev == 0) {
        ::closedir(d);
        return overlay_metadata(tree, path, "a 0/0 character device (an overlayfs whiteout)");
      }
      const char* what = S_ISSOCK(st.st_mode)                        ? "a socket"
                         : S_ISBLK(st.st_mode)                        ? "a block device"
                         : S_ISCHR(st.st_mode) && st.st_rdev != 0     ? "a character device"
                                                                      : nullptr;
      if (!what)
        continue;
      if (rel.size() >= max_left_out) {
        ::closedir(d);
        return make_error(errc::invalid_argument,
                          "layer source " + tree + " holds more than "
                            + std::to_string(max_left_out)
                            + " device nodes and sockets, which a layer leaves out");
      }
      rel.push_back(path);
      shown.push_back("/" + path + " (" + what + ")");
    }
    ::closedir(d);
  }
  std::sort(rel.begin(), rel.end());
  std::sort(shown.begin(), shown.end());
  return out;
}

expected<std::vector<std::string>> left_out(const std::string& tree,
                                            std::vector<std::string>& shown) {
  DSEC_TRY(scan, scan_source(tree, shown, {}));
  return std::move(scan.exclude);
}

std::vector<std::string> mkfs_argv(const std::string& compress, const std::string& out,
                                   const std::string& dir,
                                   const std::vector<std::string>& exclude, bool sparse) {
  std::vector<std::string> argv{"mkfs.erofs", "--quiet", fixed_uuid};
  if (!compress.empty())
    argv.push_back("-z" + compress);
  // Chunk-based files store a hole as no block at all; mkfs.erofs hashes every
  // chunk then (4-5x slower to build), so only a tree with a sparse file asks.
  else if (sparse)
    argv.push_back("--chunksize=4096");
  for (const auto& rel : exclude)
    argv.push_back("--exclude-path=" + rel);
  argv.push_back(out);
  argv.push_back(dir);
  return argv;
}

} // namespace dsec::store_detail

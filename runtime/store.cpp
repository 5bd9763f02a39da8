#include "runtime/store.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>

#include "runtime/io.hpp"
#include "runtime/sha256.hpp"
#include "runtime/sys.hpp"

extern char** environ;

namespace dsec {

namespace {

namespace fs = std::filesystem;

// mkfs.erofs clamps every mtime above SOURCE_DATE_EPOCH to it and stamps the
// superblock with it; 2100-01-01 is above any real mtime, so per-file mtimes are
// kept while the image no longer depends on when it was built. (-T would also be
// deterministic, but it overwrites every file's mtime, which breaks make and
// friends inside the sandbox.) The fixed UUID removes the last random field.
constexpr const char* source_date_epoch = "SOURCE_DATE_EPOCH=4102444800";
constexpr const char* fixed_uuid = "-U00000000-0000-0000-0000-000000000000";

// How much of a failing tool's output goes into the error message.
constexpr size_t max_tool_output = 4096;

// ---------------------------------------------------------------------------
// Small file helpers

std::string join(std::string_view a, std::string_view b) {
  std::string out{a};
  out += '/';
  out += b;
  return out;
}

std::string refs_dir(const std::string& dir) { return join(dir, "refs"); }
std::string blobs_dir(const std::string& dir) { return join(dir, "blobs/sha256"); }
std::string tmp_dir(const std::string& dir) { return join(dir, "tmp"); }
std::string system_dir(const std::string& dir) { return join(dir, "system"); }

std::string ref_path(const std::string& dir, const layer_ref& ref) {
  return join(refs_dir(dir), ref.to_string());
}

// Library callers may build a layer_ref by hand; a '/' or ".." in it must never
// reach a path, so every entry point re-validates it.
expected<void> check_ref(const layer_ref& ref) {
  DSEC_TRY(parsed, parse_layer_ref(ref.to_string()));
  if (!(parsed == ref))
    return make_error(errc::invalid_argument,
                      "malformed layer '" + ref.to_string() + "'");
  return {};
}

error unknown_layer(const layer_ref& ref) {
  return make_error(errc::not_found,
                    "unknown layer " + ref.to_string() + " (see 'dsec layer ls')");
}

// rename(2) that never replaces `to`: EEXIST tells the caller someone got there
// first. Falls back to plain rename on file systems without RENAME_NOREPLACE; every
// caller holds the store lock, so the existence check it already made still holds.
int rename_noreplace(const std::string& from, const std::string& to) {
  int r = ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE);
  if (r != 0 && errno == EINVAL)
    r = ::rename(from.c_str(), to.c_str());
  return r;
}

// ---------------------------------------------------------------------------
// Locks

// Opens STATE/lock and takes flock `op` (LOCK_SH or LOCK_EX) on it. A fresh open
// per call: flock excludes open file descriptions, so this also excludes threads
// of one process that share a store. Closing the fd releases the lock.
expected<unique_fd> lock_store(const std::string& dir, int op) {
  auto path = join(dir, "lock");
  unique_fd fd{sys::retry([&] {
    return ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  })};
  if (!fd)
    return sys_error("cannot open store lock", path);
  if (sys::retry([&] { return ::flock(fd.get(), op); }) != 0)
    return sys_error("cannot lock", path);
  return fd;
}

// ---------------------------------------------------------------------------
// Staging directories

// A directory under STATE/tmp that one build owns. It holds a flock(LOCK_EX) on the
// directory for its whole life, which is how open() tells a live build's staging
// dir (lock busy) from one a crashed build left (lock free). Removed with all its
// contents on destruction, whatever happened.
class staging_dir {
public:
  staging_dir(staging_dir&& other) noexcept
    : path_(std::exchange(other.path_, {})), lock_(std::move(other.lock_)) {}
  staging_dir& operator=(staging_dir&&) = delete;
  ~staging_dir() {
    if (!path_.empty()) {
      std::error_code ec;
      fs::remove_all(path_, ec); // best effort: a leftover is cleaned by open()
    }
    // lock_ closes after the tree is gone, so open() never sees it half removed.
  }

  static expected<staging_dir> create(const std::string& store_dir,
                                      std::string_view prefix) {
    // Under LOCK_SH so that open()'s cleanup (LOCK_EX) cannot see the directory
    // between mkdtemp and flock, when it looks abandoned.
    DSEC_TRY(store_lock, lock_store(store_dir, LOCK_SH));
    std::string templ = join(tmp_dir(store_dir), prefix) + "-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr)
      return sys_error("cannot create staging directory in", tmp_dir(store_dir));
    staging_dir out{templ};
    out.lock_.reset(sys::retry([&] {
      return ::open(templ.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    }));
    if (!out.lock_)
      return sys_error("cannot open staging directory", templ);
    if (sys::retry([&] { return ::flock(out.lock_.get(), LOCK_EX); }) != 0)
      return sys_error("cannot lock staging directory", templ);
    return out;
  }

  [[nodiscard]] const std::string& path() const noexcept { return path_; }

private:
  explicit staging_dir(std::string path) : path_(std::move(path)) {}

  std::string path_;
  unique_fd lock_;
};

// Removes what builds that died left in STATE/tmp. The caller holds LOCK_EX on the
// store, so no staging dir is between creation and locking.
expected<void> clean_tmp(const std::string& dir) {
  auto tmp = tmp_dir(dir);
  DIR* d = ::opendir(tmp.c_str());
  if (d == nullptr)
    return sys_error("cannot open", tmp);
  std::vector<std::string> stale;
  while (auto* ent = ::readdir(d)) {
    std::string_view name = ent->d_name;
    if (name == "." || name == "..")
      continue;
    auto path = join(tmp, name);
    // O_NONBLOCK: never hang on a fifo someone dropped here; O_NOFOLLOW: a
    // symlink is removed itself, never what it points to.
    unique_fd fd{::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)};
    if (fd && ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK)
      continue; // a live build owns it
    stale.push_back(std::move(path));
  }
  ::closedir(d);
  for (auto& path : stale) {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec)
      return sys_error("cannot remove stale staging entry", path, ec.value());
  }
  return {};
}

// ---------------------------------------------------------------------------
// External tools

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

// Runs argv[0] (looked up in PATH) without a shell, stdin from /dev/null, stdout
// and stderr captured, SOURCE_DATE_EPOCH set; `input_fd`, when not -1, is its
// descriptor 3. `subject` (the layer source) goes into the error so the user
// knows which input the tool choked on.
expected<void> run_tool(const std::vector<std::string>& argv, const std::string& subject,
                        int input_fd = -1) {
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
constexpr size_t max_left_out = 4096;

expected<std::vector<std::string>> left_out(const std::string& tree,
                                            std::vector<std::string>& shown) {
  std::vector<std::string> rel;
  struct frame {
    unique_fd fd;
    std::string path;
  };
  std::vector<frame> todo;
  todo.push_back({unique_fd{::open(tree.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)}, ""});
  if (!todo.back().fd)
    return sys_error("cannot open the layer source", tree);
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
      struct stat st{};
      if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        continue; // gone: mkfs.erofs will not see it either
      if (S_ISDIR(st.st_mode)) {
        unique_fd sub{::openat(::dirfd(d), e->d_name,
                               O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
        if (sub)
          todo.push_back({std::move(sub), path});
        continue;
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
  return rel;
}

std::vector<std::string> mkfs_argv(const std::string& compress, const std::string& out,
                                   const std::string& dir,
                                   const std::vector<std::string>& exclude = {}) {
  std::vector<std::string> argv{"mkfs.erofs", "--quiet", fixed_uuid};
  if (!compress.empty())
    argv.push_back("-z" + compress);
  for (const auto& rel : exclude)
    argv.push_back("--exclude-path=" + rel);
  argv.push_back(out);
  argv.push_back(dir);
  return argv;
}

// ---------------------------------------------------------------------------
// Ref files

bool valid_digest(std::string_view d) {
  if (d.size() != 7 + 64 || d.substr(0, 7) != "sha256:")
    return false;
  return std::all_of(d.begin() + 7, d.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

std::string blob_path_of(const std::string& dir, std::string_view digest) {
  return join(blobs_dir(dir), digest.substr(7));
}

std::string format_ref(const layer_info& info) {
  std::string out;
  out += "kind=" + std::string{to_string(info.kind)} + '\n';
  out += "digest=" + info.digest + '\n';
  out += "size=" + std::to_string(info.size) + '\n';
  out += "created=" + std::to_string(info.created) + '\n';
  out += "source=" + info.source + '\n';
  return out;
}

template <class Int>
bool parse_int(std::string_view s, Int& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return !s.empty() && ec == std::errc{} && end == s.data() + s.size();
}

expected<layer_info> parse_ref(std::string_view text, const layer_ref& ref,
                               const std::string& path, const std::string& dir) {
  layer_info info;
  info.ref = ref;
  bool has_kind = false, has_size = false, has_created = false;
  auto corrupt = [&](const std::string& why) {
    auto e = make_error(errc::system_error, "corrupt layer ref " + path + ": " + why);
    e.path = path;
    return e;
  };
  while (!text.empty()) {
    auto nl = text.find('\n');
    auto line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line.empty())
      continue;
    auto eq = line.find('=');
    if (eq == std::string_view::npos)
      return corrupt("line '" + std::string{line} + "' is not KEY=VALUE");
    auto key = line.substr(0, eq);
    auto value = line.substr(eq + 1);
    if (key == "kind") {
      auto k = parse_layer_kind(value);
      if (!k)
        return corrupt(k.error_value().message);
      info.kind = *k;
      has_kind = true;
    } else if (key == "digest") {
      if (!valid_digest(value))
        return corrupt("bad digest '" + std::string{value} + "'");
      info.digest = value;
    } else if (key == "size") {
      if (!parse_int(value, info.size))
        return corrupt("bad size '" + std::string{value} + "'");
      has_size = true;
    } else if (key == "created") {
      if (!parse_int(value, info.created))
        return corrupt("bad created '" + std::string{value} + "'");
      has_created = true;
    } else if (key == "source") {
      info.source = value;
    }
    // Unknown keys are skipped: a newer dsec may add fields.
  }
  if (!has_kind)
    return corrupt("no kind");
  if (info.digest.empty())
    return corrupt("no digest");
  if (!has_size)
    return corrupt("no size");
  if (!has_created)
    return corrupt("no created");
  info.blob_path = blob_path_of(dir, info.digest);
  return info;
}

// Reads refs/NAME@VERSION; not_found if there is no such layer.
expected<layer_info> read_ref(const std::string& dir, const layer_ref& ref) {
  auto path = ref_path(dir, ref);
  unique_fd fd{sys::retry([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); })};
  if (!fd)
    return errno == ENOENT ? unknown_layer(ref) : sys_error("cannot open", path);
  DSEC_TRY(text, read_all(fd.get(), path));
  return parse_ref(text, ref, path, dir);
}

// Compares with digit runs as numbers: "9" < "10", "1.9" < "1.10".
int natural_compare(std::string_view a, std::string_view b) {
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      while (i < a.size() && a[i] == '0')
        ++i;
      while (j < b.size() && b[j] == '0')
        ++j;
      size_t si = i, sj = j;
      while (i < a.size() && digit(a[i]))
        ++i;
      while (j < b.size() && digit(b[j]))
        ++j;
      if (i - si != j - sj)
        return i - si < j - sj ? -1 : 1;
      if (int c = a.substr(si, i - si).compare(b.substr(sj, j - sj)); c != 0)
        return c < 0 ? -1 : 1;
      continue;
    }
    if (a[i] != b[j])
      return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]) ? -1 : 1;
    ++i;
    ++j;
  }
  if (i < a.size())
    return 1;
  if (j < b.size())
    return -1;
  // "01" and "1" are equal as numbers; plain order keeps the sort total.
  int c = a.compare(b);
  return c < 0 ? -1 : (c > 0 ? 1 : 0);
}

// Every ref in refs/ (names that are not NAME@VERSION are not ours and skipped).
// The caller holds the store lock.
expected<std::vector<layer_info>> read_all_refs(const std::string& dir) {
  auto refs = refs_dir(dir);
  DIR* d = ::opendir(refs.c_str());
  if (d == nullptr)
    return sys_error("cannot open", refs);
  std::vector<layer_ref> names;
  while (auto* ent = ::readdir(d)) {
    std::string_view name = ent->d_name;
    if (name.empty() || name.front() == '.')
      continue;
    if (auto ref = parse_layer_ref(name))
      names.push_back(std::move(*ref));
  }
  ::closedir(d);
  std::vector<layer_info> out;
  out.reserve(names.size());
  for (auto& ref : names) {
    auto info = read_ref(dir, ref);
    if (!info)
      return std::move(info).error_value();
    out.push_back(std::move(*info));
  }
  return out;
}

// ---------------------------------------------------------------------------
// The system layer

// One entry of the system layer tree.
struct system_entry {
  enum kind_t { dir, chardev, symlink } kind;
  const char* path;
  mode_t mode;         // permission bits (dir, chardev)
  unsigned major = 0;  // chardev
  unsigned minor = 0;
  const char* target = nullptr; // symlink
};

// Mount points the sandbox fills at start (dev/pts, dev/shm, proc, sys, tmp, run)
// and the device nodes and /dev symlinks every program expects. Change this list
// => bump store::system_layer_version.
const system_entry system_entries[] = {
  {system_entry::dir, "dev", 0755},
  {system_entry::dir, "dev/pts", 0755},
  {system_entry::dir, "dev/shm", 01777},
  {system_entry::dir, "proc", 0555},
  {system_entry::dir, "sys", 0555},
  {system_entry::dir, "tmp", 01777},
  {system_entry::dir, "run", 0755},
  // dsec's own files (docs/chronus.md): bin/chronus, and agent/, where a pristine
  // command sees the agent's root. Mounted read-only over /.dsec in Chronus sandboxes.
  {system_entry::dir, ".dsec", 0755},
  {system_entry::dir, ".dsec/bin", 0755},
  {system_entry::dir, ".dsec/agent", 0755},
  {system_entry::chardev, "dev/null", 0666, 1, 3},
  {system_entry::chardev, "dev/zero", 0666, 1, 5},
  {system_entry::chardev, "dev/full", 0666, 1, 7},
  {system_entry::chardev, "dev/random", 0666, 1, 8},
  {system_entry::chardev, "dev/urandom", 0666, 1, 9},
  {system_entry::chardev, "dev/tty", 0666, 5, 0},
  {system_entry::symlink, "dev/ptmx", 0, 0, 0, "pts/ptmx"},
  {system_entry::symlink, "dev/fd", 0, 0, 0, "/proc/self/fd"},
  {system_entry::symlink, "dev/stdin", 0, 0, 0, "/proc/self/fd/0"},
  {system_entry::symlink, "dev/stdout", 0, 0, 0, "/proc/self/fd/1"},
  {system_entry::symlink, "dev/stderr", 0, 0, 0, "/proc/self/fd/2"},
};

// Copies the chronus client (from `fd`) to .dsec/bin/chronus, mode 0755, with a
// hard link at usr/local/bin/chronus (one file in the image).
expected<void> add_chronus(const std::string& root, int fd) {
  for (auto d : {"usr", "usr/local", "usr/local/bin"}) {
    auto path = join(root, d);
    if (::mkdir(path.c_str(), 0755) != 0 || ::chmod(path.c_str(), 0755) != 0)
      return sys_error("cannot create directory", path);
  }
  auto path = join(root, ".dsec/bin/chronus");
  unique_fd out{::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755)};
  if (!out)
    return sys_error("cannot create", path);
  char buf[65536];
  off_t at = 0;
  for (;;) {
    auto n = ::pread(fd, buf, sizeof buf, at);
    if (n < 0)
      return sys_error("cannot read the chronus client for", path);
    if (n == 0)
      break;
    if (::write(out.get(), buf, static_cast<size_t>(n)) != n)
      return sys_error("cannot write", path);
    at += n;
  }
  if (::fchmod(out.get(), 0755) != 0)
    return sys_error("cannot set the mode of", path);
  auto link = join(root, "usr/local/bin/chronus");
  if (::link(path.c_str(), link.c_str()) != 0)
    return sys_error("cannot link", link);
  return {};
}

expected<void> make_system_tree(const std::string& root, int chronus_fd) {
  if (::mkdir(root.c_str(), 0755) != 0 || ::chmod(root.c_str(), 0755) != 0)
    return sys_error("cannot create", root);
  for (const auto& e : system_entries) {
    auto path = join(root, e.path);
    switch (e.kind) {
      case system_entry::dir:
        if (::mkdir(path.c_str(), 0700) != 0)
          return sys_error("cannot create directory", path);
        break;
      case system_entry::chardev:
        if (::mknod(path.c_str(), S_IFCHR | 0600, makedev(e.major, e.minor)) != 0) {
          auto err = sys_error("cannot create device node", path);
          if (err.sys_errno == EPERM)
            err.message += " (building the system layer needs root: CAP_MKNOD)";
          return err;
        }
        break;
      case system_entry::symlink:
        if (::symlink(e.target, path.c_str()) != 0)
          return sys_error("cannot create symlink", path);
        break;
    }
    // Set the mode explicitly: mkdir and mknod apply the umask.
    if (e.kind != system_entry::symlink && ::chmod(path.c_str(), e.mode) != 0)
      return sys_error("cannot set the mode of", path);
  }
  // None of these entries has a meaningful mtime; one fixed time (the epoch) keeps
  // the image identical wherever and whenever it is built. Done last: creating an
  // entry changes its directory's mtime. (mkfs.erofs -T0 would do it, but erofs-utils
  // 1.5 lets SOURCE_DATE_EPOCH override -T.)
  DSEC_TRY_VOID(add_chronus(root, chronus_fd));
  const struct timespec epoch[2] = {{0, 0}, {0, 0}};
  for (const auto& e : system_entries) {
    auto path = join(root, e.path);
    if (::utimensat(AT_FDCWD, path.c_str(), epoch, AT_SYMLINK_NOFOLLOW) != 0)
      return sys_error("cannot set the mtime of", path);
  }
  for (auto e : {".dsec/bin/chronus", "usr/local/bin", "usr/local", "usr", ".dsec/bin",
                 ".dsec"}) {
    auto path = join(root, e);
    if (::utimensat(AT_FDCWD, path.c_str(), epoch, AT_SYMLINK_NOFOLLOW) != 0)
      return sys_error("cannot set the mtime of", path);
  }
  if (::utimensat(AT_FDCWD, root.c_str(), epoch, 0) != 0)
    return sys_error("cannot set the mtime of", root);
  return {};
}


// ---------------------------------------------------------------------------
// Committing a layer

// Installs `image` as the blob of info.digest (info.blob_path) and writes the
// ref file of info (through a temp file in `staging`). The caller holds the
// store's LOCK_EX and checked that the ref does not exist. A failure leaves
// nothing new: a blob this call added is removed again. Returns true when the
// blob was already stored (then shared, and `image` left where it is).
expected<bool> commit_layer(const std::string& dir, const std::string& staging,
                            const std::string& image, const layer_info& info) {
  const auto& blob = info.blob_path;
  bool added_blob = false;
  if (rename_noreplace(image, blob) == 0) {
    added_blob = true;
    if (auto r = fsync_dir(blobs_dir(dir)); !r) {
      ::unlink(blob.c_str());
      return std::move(r).error_value();
    }
  } else if (errno != EEXIST) {
    return sys_error("cannot store blob", blob);
  }

  // From here a failure must take the new blob away again.
  auto ref_file = ref_path(dir, info.ref);
  auto commit_ref = [&]() -> expected<void> {
    auto tmp_ref = join(staging, "ref");
    unique_fd fd{sys::retry([&] {
      return ::open(tmp_ref.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    })};
    if (!fd)
      return sys_error("cannot create", tmp_ref);
    DSEC_TRY_VOID(write_all(fd.get(), format_ref(info), tmp_ref));
    if (::fsync(fd.get()) != 0)
      return sys_error("cannot sync", tmp_ref);
    fd.reset();
    if (rename_noreplace(tmp_ref, ref_file) != 0)
      return sys_error("cannot commit layer ref", ref_file);
    if (auto r = fsync_dir(refs_dir(dir)); !r) {
      ::unlink(ref_file.c_str());
      return r;
    }
    return {};
  };
  if (auto r = commit_ref(); !r) {
    if (added_blob)
      ::unlink(blob.c_str());
    return std::move(r).error_value();
  }
  return !added_blob;
}

// A value from a peer, fit for an error message: printable ASCII, at most 80
// characters.
std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 80))
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > 80)
    out += "...";
  return out;
}

error malformed_digest(std::string_view digest, std::string_view what) {
  return make_error(errc::invalid_argument,
                    "malformed digest '" + printable(digest) + "'" + std::string{what}
                      + " (expected sha256: and 64 lower-case hex digits)");
}

} // namespace

// ---------------------------------------------------------------------------
// staged_file

struct staged_file::impl {
  explicit impl(staging_dir d) : dir(std::move(d)) {}
  staging_dir dir;
  std::string path;
  unique_fd fd;
  sha256 hash;
  uint64_t size = 0;
  std::string digest; // set once finished
};

staged_file::staged_file(std::unique_ptr<impl> i) noexcept : impl_(std::move(i)) {}
staged_file::staged_file(staged_file&&) noexcept = default;
staged_file& staged_file::operator=(staged_file&&) noexcept = default;
// The impl's staging_dir removes the directory, file included; its fd closes first.
staged_file::~staged_file() = default;

expected<void> staged_file::append(const void* data, size_t size) {
  if (!impl_)
    return make_error(errc::invalid_argument, "append to a moved-from staged file");
  if (!impl_->digest.empty())
    return make_error(errc::invalid_argument,
                      "append to " + impl_->path + " after its digest was taken");
  DSEC_TRY_VOID(write_all(impl_->fd.get(),
                          std::string_view{static_cast<const char*>(data), size}, impl_->path));
  impl_->hash.update(data, size);
  impl_->size += size;
  return {};
}

uint64_t staged_file::size() const noexcept { return impl_ ? impl_->size : 0; }

const std::string& staged_file::digest() {
  static const std::string none;
  if (!impl_)
    return none;
  if (impl_->digest.empty())
    impl_->digest = "sha256:" + to_hex(impl_->hash.finish());
  return impl_->digest;
}

const std::string& staged_file::path() const noexcept {
  static const std::string none;
  return impl_ ? impl_->path : none;
}

namespace {
} // namespace

// ---------------------------------------------------------------------------

expected<store> store::open(std::string state_dir) {
  if (state_dir.empty())
    return make_error(errc::invalid_argument, "the state directory is empty");
  std::error_code ec;
  fs::path p = fs::absolute(state_dir, ec);
  if (ec)
    return sys_error("cannot resolve state directory", state_dir, ec.value());
  std::string dir = p.lexically_normal().string();
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();

  for (auto sub : {std::string{}, join(dir, "blobs/sha256"), refs_dir(dir), tmp_dir(dir),
                   system_dir(dir)}) {
    auto path = sub.empty() ? dir : sub;
    fs::create_directories(path, ec);
    if (ec)
      return sys_error("cannot create state directory", path, ec.value());
  }
  DSEC_TRY(lock, lock_store(dir, LOCK_EX));
  DSEC_TRY_VOID(clean_tmp(dir));
  return store{std::move(dir)};
}

expected<build_result> store::build(layer_kind kind, const layer_ref& ref,
                                    const std::string& src, const build_options& options) {
  auto started = std::chrono::steady_clock::now();
  DSEC_TRY_VOID(check_ref(ref));
  if (!options.compress.empty() && options.compress != "lz4" && options.compress != "lz4hc")
    return make_error(errc::invalid_argument,
                      "unknown compression '" + options.compress
                        + "' (expected lz4 or lz4hc, or none)");

  // The source: checked first, so a typo is reported before any work is done.
  struct stat st{};
  if (src.empty())
    return make_error(errc::invalid_argument, "the layer source path is empty");
  if (::stat(src.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      auto e = make_error(errc::not_found, "layer source " + src + " does not exist");
      e.path = src;
      return e;
    }
    return sys_error("cannot access layer source", src);
  }
  if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
    auto e = make_error(errc::invalid_argument,
                        "layer source " + src
                          + " is neither a directory nor a tar archive (a regular file)");
    e.path = src;
    return e;
  }
  std::string source;
  {
    char* resolved = ::realpath(src.c_str(), nullptr);
    if (resolved == nullptr)
      return sys_error("cannot resolve layer source", src);
    source = resolved;
    std::free(resolved);
  }
  if (source.find('\n') != std::string::npos)
    return make_error(errc::invalid_argument,
                      "layer source path '" + src + "' contains a newline");

  // Fail early on a taken name; checked again under the lock before committing.
  if (::access(ref_path(dir_, ref).c_str(), F_OK) == 0)
    return make_error(errc::already_exists,
                      "layer " + ref.to_string()
                        + " already exists (versions are immutable: rm it first or "
                          "pick a new version)");

  DSEC_TRY(staging, staging_dir::create(dir_, "build"));
  std::string tree = source;
  if (S_ISREG(st.st_mode)) {
    tree = join(staging.path(), "root");
    if (::mkdir(tree.c_str(), 0755) != 0 || ::chmod(tree.c_str(), 0755) != 0)
      return sys_error("cannot create", tree);
    // The coarse clock: file times come from it (or from a finer one), so a
    // directory tar touches never looks older than `before`.
    struct timespec before{};
    ::clock_gettime(CLOCK_REALTIME_COARSE, &before);
    // GNU tar detects compression itself, refuses member names with "..", and
    // creates symlinks that could lead outside the tree only after every other
    // member, so a hostile archive cannot write outside `tree`.
    // The archive is opened here, once, and tar reads that open file (its
    // descriptor 3): never waits on a fifo put in its place, and reads
    // exactly the regular file checked.
    unique_fd archive{
      sys::retry([&] { return ::open(source.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC); })};
    if (!archive)
      return sys_error("cannot open layer source", source);
    struct stat ast{};
    if (::fstat(archive.get(), &ast) != 0)
      return sys_error("cannot stat layer source", source);
    if (!S_ISREG(ast.st_mode)) {
      auto e = make_error(errc::invalid_argument,
                          "layer source " + src + " is no longer a regular file (it changed)");
      e.path = src;
      return e;
    }
    DSEC_TRY_VOID(run_tool({"tar", "--numeric-owner", "--same-owner", "--same-permissions",
                            "--xattrs", "--xattrs-include=*", "-xf", "/proc/self/fd/3", "-C",
                            tree},
                           source, archive.get()));
    // An archive without a "./" member (docker export has none) leaves the root's
    // mtime at extraction time, which would make every build of it a new digest.
    // Such a root is pinned to the epoch; a "./" member's own mtime is kept.
    struct stat root_st{};
    if (::stat(tree.c_str(), &root_st) != 0)
      return sys_error("cannot stat", tree);
    if (root_st.st_mtim.tv_sec > before.tv_sec
        || (root_st.st_mtim.tv_sec == before.tv_sec
            && root_st.st_mtim.tv_nsec >= before.tv_nsec)) {
      struct timespec epoch[2] = {{0, 0}, {0, 0}};
      if (::utimensat(AT_FDCWD, tree.c_str(), epoch, AT_SYMLINK_NOFOLLOW) != 0)
        return sys_error("cannot set the mtime of", tree);
    }
  }

  std::vector<std::string> skipped;
  DSEC_TRY(exclude, left_out(tree, skipped));
  auto image = join(staging.path(), "image.erofs");
  DSEC_TRY_VOID(run_tool(mkfs_argv(options.compress, image, tree, exclude), source));

  unique_fd image_fd{sys::retry([&] { return ::open(image.c_str(), O_RDONLY | O_CLOEXEC); })};
  if (!image_fd)
    return sys_error("cannot open the new image", image);
  DSEC_TRY(hex, sha256_hex_of_file(image_fd.get()));
  struct stat image_st{};
  if (::fstat(image_fd.get(), &image_st) != 0)
    return sys_error("cannot stat", image);
  // Blobs are shared by every layer with the same bytes and mounted read-only:
  // nobody may write them. fsync before the rename so a crash cannot leave a
  // committed blob with missing data.
  if (::fchmod(image_fd.get(), 0444) != 0 || ::fsync(image_fd.get()) != 0)
    return sys_error("cannot seal the new image", image);

  build_result result;
  result.info.ref = ref;
  result.info.kind = kind;
  result.info.digest = "sha256:" + hex;
  result.info.size = static_cast<uint64_t>(image_st.st_size);
  result.info.source = source;
  result.info.blob_path = blob_path_of(dir_, result.info.digest);
  result.skipped = std::move(skipped);

  // Commit: blob, then ref, under LOCK_EX.
  DSEC_TRY(lock, lock_store(dir_, LOCK_EX));
  if (::access(ref_path(dir_, ref).c_str(), F_OK) == 0)
    return make_error(errc::already_exists,
                      "layer " + ref.to_string()
                        + " already exists (versions are immutable: rm it first or "
                          "pick a new version)");
  result.info.created = static_cast<int64_t>(::time(nullptr));
  DSEC_TRY(shared, commit_layer(dir_, staging.path(), image, result.info));
  result.deduplicated = shared; // the staging dir's removal drops our copy

  result.seconds =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

expected<std::vector<layer_info>> store::list() const {
  DSEC_TRY(lock, lock_store(dir_, LOCK_SH));
  DSEC_TRY(all, read_all_refs(dir_));
  std::sort(all.begin(), all.end(), [](const layer_info& a, const layer_info& b) {
    if (int c = natural_compare(a.ref.name, b.ref.name); c != 0)
      return c < 0;
    return natural_compare(a.ref.version, b.ref.version) < 0;
  });
  return all;
}

expected<layer_info> store::find(const layer_ref& ref) const {
  DSEC_TRY_VOID(check_ref(ref));
  DSEC_TRY(lock, lock_store(dir_, LOCK_SH));
  return read_ref(dir_, ref);
}

expected<layer_lease> store::lease(const layer_ref& ref) const {
  DSEC_TRY_VOID(check_ref(ref));
  // LOCK_SH on the store: remove() takes LOCK_EX before it tests the ref's lock,
  // so it either finished before us (not_found) or sees our lease (in_use).
  DSEC_TRY(lock, lock_store(dir_, LOCK_SH));
  auto path = ref_path(dir_, ref);
  unique_fd fd{sys::retry([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); })};
  if (!fd)
    return errno == ENOENT ? unknown_layer(ref) : sys_error("cannot open", path);
  // Never waits: only remove() takes LOCK_EX on a ref, and only under the store's
  // LOCK_EX, which our LOCK_SH excludes.
  if (sys::retry([&] { return ::flock(fd.get(), LOCK_SH); }) != 0)
    return sys_error("cannot lock", path);
  DSEC_TRY(text, read_all(fd.get(), path));
  DSEC_TRY(info, parse_ref(text, ref, path, dir_));
  // A lease is a promise that the image can be mounted; check it is there.
  if (::access(info.blob_path.c_str(), R_OK) != 0) {
    auto e = make_error(errc::system_error, "the image of layer " + ref.to_string()
                                              + " is missing (" + info.blob_path + ")");
    e.path = info.blob_path;
    e.sys_errno = errno;
    return e;
  }
  return layer_lease{std::move(fd), std::move(info)};
}

expected<void> store::remove(const layer_ref& ref) {
  DSEC_TRY_VOID(check_ref(ref));
  DSEC_TRY(lock, lock_store(dir_, LOCK_EX));
  auto path = ref_path(dir_, ref);
  unique_fd fd{sys::retry([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); })};
  if (!fd)
    return errno == ENOENT ? unknown_layer(ref) : sys_error("cannot open", path);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK)
      return make_error(errc::in_use, "layer " + ref.to_string()
                                        + " is in use by a sandbox; remove the "
                                          "sandboxes that use it first");
    return sys_error("cannot lock", path);
  }
  DSEC_TRY(text, read_all(fd.get(), path));
  // A corrupt ref is still removed (rm is how one gets rid of it); only its blob
  // stays, since we cannot tell which one it is.
  auto info = parse_ref(text, ref, path, dir_);

  if (::unlink(path.c_str()) != 0)
    return sys_error("cannot remove", path);
  DSEC_TRY_VOID(fsync_dir(refs_dir(dir_)));
  if (!info)
    return {};

  // Delete the blob only when no other ref names it. If any other ref cannot be
  // read we cannot prove that, and keep it.
  auto others = read_all_refs(dir_);
  if (!others)
    return {};
  for (const auto& other : *others)
    if (other.digest == info->digest)
      return {};
  if (::unlink(info->blob_path.c_str()) != 0 && errno != ENOENT)
    return sys_error("removed " + ref.to_string() + " but cannot remove its image",
                     info->blob_path);
  DSEC_TRY_VOID(fsync_dir(blobs_dir(dir_)));
  return {};
}

bool store::is_digest(std::string_view digest) noexcept { return valid_digest(digest); }

expected<staged_file> store::stage(std::string_view prefix) const {
  if (prefix.empty() || prefix.size() > 32
      || !std::all_of(prefix.begin(), prefix.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
         }))
    return make_error(errc::invalid_argument,
                      "bad staging prefix '" + printable(prefix)
                        + "' (1 to 32 letters, digits, '-' or '_')");
  DSEC_TRY(dir, staging_dir::create(dir_, prefix));
  auto im = std::make_unique<staged_file::impl>(std::move(dir));
  im->path = join(im->dir.path(), "image");
  im->fd.reset(sys::retry([&] {
    return ::open(im->path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  }));
  if (!im->fd)
    return sys_error("cannot create", im->path);
  return staged_file{std::move(im)};
}

expected<import_result> store::import(layer_kind kind, const layer_ref& ref,
                                      const std::string& digest, uint64_t size,
                                      int64_t created, const std::string& source,
                                      staged_file file) {
  // `file` is ours now: whatever happens below, its directory goes with it.
  DSEC_TRY_VOID(check_ref(ref));
  const auto name = ref.to_string();
  if (!file)
    return make_error(errc::invalid_argument, "no image to import for layer " + name);
  if (!valid_digest(digest))
    return malformed_digest(digest, " for layer " + name);
  if (source.find('\n') != std::string::npos)
    return make_error(errc::invalid_argument,
                      "the source of layer " + name + " contains a newline");
  auto& im = *file.impl_;
  struct stat st{};
  if (::fstat(im.fd.get(), &st) != 0)
    return sys_error("cannot stat", im.path);
  if (im.size != size || static_cast<uint64_t>(st.st_size) != size) {
    auto e = make_error(errc::invalid_argument,
                        "size mismatch for layer " + name + ": the image has "
                          + std::to_string(st.st_size) + " bytes, expected "
                          + std::to_string(size));
    e.path = im.path;
    return e;
  }
  const auto& got = file.digest();
  if (got != digest) {
    auto e = make_error(errc::invalid_argument, "digest mismatch for layer " + name
                                                  + ": the image's sha256 is " + got
                                                  + ", expected " + digest);
    e.path = im.path;
    return e;
  }
  // Sealed and durable before it can become a blob, as in build().
  if (::fchmod(im.fd.get(), 0444) != 0 || ::fsync(im.fd.get()) != 0)
    return sys_error("cannot seal the imported image", im.path);

  import_result result;
  DSEC_TRY(lock, lock_store(dir_, LOCK_EX));
  if (auto existing = read_ref(dir_, ref)) {
    if (existing->digest != digest)
      return make_error(errc::already_exists,
                        "layer " + name + " already exists with another image ("
                          + existing->digest + ", not " + digest
                          + "; versions are immutable)");
    result.info = std::move(*existing);
    result.existed = true;
    return result;
  } else if (existing.error_value().code != errc::not_found) {
    return std::move(existing).error_value();
  }
  result.info.ref = ref;
  result.info.kind = kind;
  result.info.digest = digest;
  result.info.size = size;
  result.info.created = created;
  result.info.source = source;
  result.info.blob_path = blob_path_of(dir_, digest);
  DSEC_TRY(shared, commit_layer(dir_, im.dir.path(), im.path, result.info));
  result.deduplicated = shared;
  return result;
}

expected<unique_fd> store::open_blob(std::string_view digest) const {
  if (!valid_digest(digest))
    return malformed_digest(digest, "");
  auto path = blob_path_of(dir_, digest);
  unique_fd fd{sys::retry([&] {
    return ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  })};
  if (!fd) {
    if (errno != ENOENT)
      return sys_error("cannot open blob", path);
    auto e = make_error(errc::not_found, "no image " + std::string{digest} + " in the store "
                                           + dir_);
    e.path = path;
    return e;
  }
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0)
    return sys_error("cannot stat blob", path);
  if (!S_ISREG(st.st_mode))
    return make_error(errc::system_error, "blob " + path + " is not a regular file");
  return fd;
}

expected<std::string> store::find_chronus() {
  return sys::find_program("DSEC_CHRONUS", "chronus",
                           "the chronus client for the system layer");
}

expected<std::string> store::system_layer() {
  // The image carries the chronus client: its name says which one, so a new
  // chronus makes a new image beside the old.
  DSEC_TRY(chronus, find_chronus());
  unique_fd cfd{::open(chronus.c_str(), O_RDONLY | O_CLOEXEC)};
  if (!cfd)
    return sys_error("cannot open the chronus client", chronus);
  DSEC_TRY(chronus_digest, sha256_hex_of_file(cfd.get()));
  auto path = join(system_dir(dir_), "system-v" + std::to_string(system_layer_version) + "-" +
                                       chronus_digest.substr(0, 16) + ".erofs");
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode))
    return path;

  DSEC_TRY(staging, staging_dir::create(dir_, "system"));
  auto tree = join(staging.path(), "root");
  DSEC_TRY_VOID(make_system_tree(tree, cfd.get()));
  auto image = join(staging.path(), "system.erofs");
  // --all-root: the nodes must be root's whoever built them.
  auto argv = mkfs_argv("", image, tree);
  argv.insert(argv.begin() + 1, "--all-root");
  DSEC_TRY_VOID(run_tool(argv, tree));
  if (::chmod(image.c_str(), 0444) != 0)
    return sys_error("cannot seal", image);
  {
    unique_fd fd{::open(image.c_str(), O_RDONLY | O_CLOEXEC)};
    if (!fd || ::fsync(fd.get()) != 0)
      return sys_error("cannot sync", image);
  }
  DSEC_TRY(lock, lock_store(dir_, LOCK_EX));
  // EEXIST: another process built the same image meanwhile; use theirs.
  if (rename_noreplace(image, path) != 0 && errno != EEXIST)
    return sys_error("cannot store the system layer", path);
  DSEC_TRY_VOID(fsync_dir(system_dir(dir_)));
  return path;
}

} // namespace dsec

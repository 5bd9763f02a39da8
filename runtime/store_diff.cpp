// store::pack_diff (see store.hpp and runtime/snapshot.hpp): a sandbox's
// writable layer into a diff layer. The upper dir is the sandbox's, so nothing
// here reads it but mkfs.erofs, in a child process of its own that:
//   - lives in a private mount namespace, where a read-only, nosuid, nodev,
//     idmapped clone of the upper's mount is attached on an empty directory
//     of the build's staging dir (mkfs.erofs wants a real path);
//   - sees the owners shifted back by the sandbox's uid base through the
//     idmap (host uid base + n reads as n), as `layer build` records a tree;
//   - has RLIMIT_FSIZE (a sparse file cannot make a huge image) and a deadline
//     after which it is killed.
// mkfs.erofs never opens a fifo, socket or device: it records them (lstat,
// mknod-style), and it does not follow symbolic links.
#include "runtime/store_detail.hpp"

#include <fcntl.h>
#include <linux/mount.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>

#include "runtime/sys.hpp"
#include "runtime/userns.hpp"

extern char** environ;

namespace dsec {

using namespace store_detail;

namespace {

// mkfs.erofs's absolute path, looked up once before the fork.
std::string find_in_path(const std::string& tool) {
  const char* path = ::getenv("PATH");
  std::string p = path ? path : "/usr/sbin:/usr/bin:/sbin:/bin";
  size_t at = 0;
  while (at <= p.size()) {
    auto colon = p.find(':', at);
    auto dir = p.substr(at, colon == std::string::npos ? std::string::npos : colon - at);
    if (!dir.empty()) {
      auto full = dir + "/" + tool;
      if (::access(full.c_str(), X_OK) == 0)
        return full;
    }
    if (colon == std::string::npos)
      break;
    at = colon + 1;
  }
  return {};
}

} // namespace

expected<import_result> store::pack_diff(const layer_ref& ref, int mount_fd,
                                         const diff_options& o) {
  DSEC_TRY_VOID(check_ref(ref));
  const auto name = ref.to_string();
  if (auto existing = read_ref(dir_, ref))
    return make_error(errc::already_exists,
                      "layer " + name + " already exists (versions are immutable)");
  else if (existing.error_value().code != errc::not_found)
    return std::move(existing).error_value();
  auto mkfs = find_in_path("mkfs.erofs");
  if (mkfs.empty())
    return make_error(errc::tool_failed, "mkfs.erofs not found in PATH (install erofs-utils)");

  // The idmapped, read-only clone of the upper: host base+n reads as n.
  DSEC_TRY(userns, make_userns(id_range{0, o.id_count, o.uid_base}));
  if (o.upper_subdir.empty() || o.upper_subdir.find('/') != std::string::npos
      || o.upper_subdir == "." || o.upper_subdir == "..")
    return make_error(errc::invalid_argument, "pack_diff: bad upper dir '" + o.upper_subdir + "'");
  unique_fd tree{sys::open_tree(mount_fd, o.upper_subdir.c_str(),
                                OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW)};
  if (!tree)
    return sys_error("pack_diff: cloning the mount of the writable layer");
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
                  | MOUNT_ATTR_NOEXEC;
  attr.userns_fd = static_cast<uint64_t>(userns.get());
  if (sys::mount_setattr(tree.get(), "", AT_EMPTY_PATH, &attr) < 0)
    return sys_error("pack_diff: idmapping the clone of the writable layer");

  DSEC_TRY(staged, stage("diff"));
  auto image = staged.path();
  auto staging = image.substr(0, image.rfind('/'));
  auto mnt = staging + "/tree";
  if (::mkdir(mnt.c_str(), 0700) < 0)
    return sys_error("pack_diff: mkdir", mnt);

  std::vector<std::string> argv{"mkfs.erofs", "--quiet", "-U00000000-0000-0000-0000-000000000000"};
  for (const auto& rel : o.exclude)
    argv.push_back("--exclude-path=" + rel);
  argv.push_back(image);
  argv.push_back(mnt);
  std::vector<char*> cargv;
  for (auto& a : argv)
    cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::vector<char*> envp;
  std::string epoch = "SOURCE_DATE_EPOCH=4102444800";
  for (char** e = environ; e != nullptr && *e != nullptr; ++e)
    if (std::strncmp(*e, "SOURCE_DATE_EPOCH=", 18) != 0)
      envp.push_back(*e);
  envp.push_back(epoch.data());
  envp.push_back(nullptr);

  int p[2];
  if (::pipe2(p, O_CLOEXEC) < 0)
    return sys_error("pack_diff: a pipe for mkfs.erofs");
  unique_fd rd{p[0]}, wr{p[1]};
  rlimit fsize{};
  fsize.rlim_cur = fsize.rlim_max = o.max_bytes ? o.max_bytes : (64ull << 30);
  int tree_fd = tree.get(), wr_fd = wr.get();
  const char* mnt_c = mnt.c_str();
  const char* mkfs_c = mkfs.c_str();
  pid_t pid = ::fork();
  if (pid < 0)
    return sys_error("pack_diff: fork for mkfs.erofs");
  if (pid == 0) {
    // Only system calls from here: the parent has other threads.
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0 || ::dup2(devnull, 0) < 0 || ::dup2(wr_fd, 1) < 0 || ::dup2(wr_fd, 2) < 0)
      ::_exit(120);
    if (::unshare(CLONE_NEWNS) < 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0)
      ::_exit(121);
    if (sys::move_mount(tree_fd, "", AT_FDCWD, mnt_c, MOVE_MOUNT_F_EMPTY_PATH) < 0)
      ::_exit(122);
    ::setrlimit(RLIMIT_FSIZE, &fsize);
    ::signal(SIGXFSZ, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(mkfs_c, cargv.data(), envp.data());
    ::_exit(127);
  }
  wr.reset();
  tree.reset();
  auto deadline = std::chrono::steady_clock::now()
                  + std::chrono::milliseconds(o.timeout_ms ? o.timeout_ms : 5 * 60 * 1000);
  std::string output;
  bool timed_out = false;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd pf{rd.get(), POLLIN, 0};
    int r = ::poll(&pf, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (r < 0 && errno == EINTR)
      continue;
    if (r == 0)
      continue;
    char buf[4096];
    auto n = sys::retry([&] { return ::read(rd.get(), buf, sizeof buf); });
    if (n <= 0)
      break;
    if (output.size() < 64 * 1024)
      output.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    return make_error(errc::timeout, "pack_diff of layer " + name + ": mkfs.erofs did not finish in "
                                       + std::to_string((o.timeout_ms ? o.timeout_ms : 300000) / 1000)
                                       + " s; killed");
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ)
    return make_error(errc::too_large, "pack_diff of layer " + name + ": the image would exceed "
                                         + std::to_string(fsize.rlim_cur) + " bytes");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string why = WIFEXITED(status)
                        ? "exited with " + std::to_string(WEXITSTATUS(status))
                        : "was killed by signal " + std::to_string(WTERMSIG(status));
    if (WIFEXITED(status) && WEXITSTATUS(status) >= 120 && WEXITSTATUS(status) <= 122)
      why += " (setting up its private mount of the writable layer failed)";
    auto line = output.substr(0, output.find('\n'));
    auto e = make_error(errc::tool_failed, "pack_diff of layer " + name + ": mkfs.erofs " + why
                                             + (line.empty() ? "" : ": " + line));
    return e;
  }
  DSEC_TRY_VOID(staged.rehash());
  auto digest = staged.digest();
  auto size = staged.size();
  return import(layer_kind::diff, ref, digest, size, static_cast<int64_t>(::time(nullptr)),
                o.source, std::move(staged), o.on);
}

} // namespace dsec

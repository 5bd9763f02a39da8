#include "runtime/host_mount.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "runtime/sys.hpp"

namespace dsec {

namespace {

constexpr size_t max_path = 1023;

// Absolute, no empty, "." or ".." component; a trailing slash is dropped.
expected<std::string> normal_path(std::string_view p, std::string_view what) {
  auto bad = [&](const char* why) {
    return make_error(errc::invalid_argument,
                      std::string{what} + " '" + std::string{p} + "' " + why);
  };
  if (p.empty() || p.front() != '/')
    return bad("is not an absolute path");
  if (p.size() > max_path)
    return bad("is longer than 1023 bytes");
  if (p.find('\0') != std::string_view::npos)
    return bad("holds a NUL byte");
  std::string out;
  size_t i = 1;
  while (i <= p.size()) {
    size_t j = p.find('/', i);
    if (j == std::string_view::npos)
      j = p.size();
    auto part = p.substr(i, j - i);
    if (part.empty() && j != p.size())
      return bad("has an empty component ('//')");
    if (part == "." || part == "..")
      return bad("has a '.' or '..' component");
    if (!part.empty())
      out += "/" + std::string{part};
    i = j + 1;
  }
  return out.empty() ? std::string{"/"} : out;
}

// Whether `path` is `dir` or lies beneath it (both normal).
bool beneath(const std::string& path, const std::string& dir) {
  if (dir == "/")
    return true;
  return path.size() >= dir.size() && path.compare(0, dir.size(), dir) == 0
         && (path.size() == dir.size() || path[dir.size()] == '/');
}

} // namespace

std::string host_mount::to_string() const {
  return host + ":" + target + (read_only ? ":ro" : ":rw") + (recursive ? ",rbind" : "")
         + (idmap ? "" : ",noidmap");
}

expected<host_mount> parse_host_mount(std::string_view text, bool read_only_default) {
  host_mount m;
  m.read_only = read_only_default;
  auto rest = text;
  auto colon = rest.find(':');
  m.host = std::string{rest.substr(0, colon)};
  if (colon == std::string_view::npos) {
    m.target = m.host;
  } else {
    rest.remove_prefix(colon + 1);
    colon = rest.find(':');
    m.target = std::string{rest.substr(0, colon)};
    if (colon != std::string_view::npos) {
      auto opts = rest.substr(colon + 1);
      bool mode_seen = false;
      while (true) {
        auto comma = opts.find(',');
        auto mode = opts.substr(0, comma);
        auto bad = [&](const std::string& why) {
          return make_error(errc::invalid_argument,
                            "host mount '" + std::string{text} + "': " + why);
        };
        if (mode == "ro" || mode == "rw") {
          if (mode_seen)
            return bad("give one of ro and rw");
          mode_seen = true;
          m.read_only = mode == "ro";
        } else if (mode == "rbind") {
          m.recursive = true;
        } else if (mode == "noidmap") {
          m.idmap = false;
        } else {
          return bad("the option '" + std::string{mode}
                     + "' is none of ro, rw, rbind and noidmap");
        }
        if (comma == std::string_view::npos)
          break;
        opts.remove_prefix(comma + 1);
      }
    }
  }
  if (m.host.empty() || m.target.empty())
    return make_error(errc::invalid_argument,
                      "host mount '" + std::string{text}
                        + "' is not HOST:SANDBOX[:ro|:rw][,rbind][,noidmap] (both absolute "
                          "paths)");
  DSEC_TRY_VOID(check_host_mount(m));
  return m;
}

expected<void> check_host_mount(const host_mount& m) {
  auto name = "host mount " + m.host + ":" + m.target + ": the";
  auto host = normal_path(m.host, name + " host path");
  if (!host)
    return std::move(host).error_value();
  auto target = normal_path(m.target, name + " sandbox path");
  if (!target)
    return std::move(target).error_value();
  if (*target == "/")
    return make_error(errc::invalid_argument,
                      "host mount " + m.to_string() + " would cover the sandbox's root");
  for (const char* dir : {"/proc", "/dev", "/sys", "/.dsec"})
    if (beneath(*target, dir))
      return make_error(errc::invalid_argument, "host mount " + m.to_string() + ": " + dir
                                                  + " in the sandbox belongs to dsec");
  return {};
}

expected<host_mount_policy> host_mount_policy::open(const std::vector<std::string>& dirs) {
  host_mount_policy p;
  for (const auto& spec : dirs) {
    std::string_view text = spec;
    bool writable = false;
    if (text.size() > 3 && text.substr(text.size() - 3) == ":rw") {
      writable = true;
      text.remove_suffix(3);
    } else if (text.size() > 3 && text.substr(text.size() - 3) == ":ro") {
      text.remove_suffix(3);
    }
    DSEC_TRY(path, normal_path(text, "--allow-host-mount"));
    root r;
    r.path = path;
    r.writable = writable;
    r.fd.reset(::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!r.fd) {
      auto e = sys_error("--allow-host-mount: opening the directory", path);
      if (errno == ENOENT || errno == ENOTDIR)
        e.code = errc::not_found;
      return e;
    }
    if (writable) {
      struct statvfs vfs{};
      if (::fstatvfs(r.fd.get(), &vfs) < 0)
        return sys_error("--allow-host-mount: statvfs", path);
      if (!(vfs.f_flag & ST_NOSUID))
        return make_error(errc::invalid_argument,
                          "--allow-host-mount " + spec + ": " + path
                            + " is not on a nosuid mount, so a sandbox's root could leave a "
                              "set-user-ID program there for the host to run; mount it "
                              "nosuid (mount --bind " + path + " " + path
                            + " && mount -o remount,bind,nosuid " + path
                            + ") or allow it read-only");
    }
    p.roots_.push_back(std::move(r));
  }
  return p;
}

expected<host_mount_policy> host_mount_policy::anything() {
  host_mount_policy p;
  root r;
  r.path = "/";
  r.writable = true;
  r.fd.reset(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!r.fd)
    return sys_error("opening", "/");
  p.roots_.push_back(std::move(r));
  p.anything_ = true;
  return p;
}

std::string host_mount_policy::describe() const {
  std::string out;
  for (const auto& r : roots_)
    out += (out.empty() ? "" : ", ") + r.path + (r.writable ? ":rw" : "");
  return out;
}

expected<std::vector<prepared_mount>>
host_mount_policy::prepare(const std::vector<host_mount>& mounts, int userns_fd) const {
  // environment::validate checked them (where the environment came in): the
  // paths are only normalised here, for the policy's prefix test.
  std::vector<prepared_mount> out;
  out.reserve(mounts.size());
  for (const auto& m : mounts) {
    DSEC_TRY(host, normal_path(m.host, "host path"));
    DSEC_TRY(target, normal_path(m.target, "sandbox path"));
    if (roots_.empty())
      return make_error(errc::invalid_argument,
                        "host mount " + m.to_string()
                          + ": this node lets no sandbox mount host paths (its dsecd takes "
                            "--allow-host-mount DIR[:rw] for that)");
    // The deepest allowed directory the path lies in; a writable one wins a tie.
    const root* in = nullptr;
    for (const auto& r : roots_)
      if (beneath(host, r.path)
          && (!in || r.path.size() > in->path.size()
              || (r.path.size() == in->path.size() && r.writable)))
        in = &r;
    if (!in)
      return make_error(errc::invalid_argument,
                        "host mount " + m.to_string()
                          + ": the host path is outside the directories this node lets "
                            "sandboxes mount ("
                          + describe() + ")");
    if (!m.read_only) {
      const root* w = nullptr;
      for (const auto& r : roots_)
        if (r.writable && beneath(host, r.path) && (!w || r.path.size() > w->path.size()))
          w = &r;
      if (!w)
        return make_error(errc::invalid_argument,
                          "host mount " + m.to_string() + ": " + in->path
                            + " may be mounted read-only only on this node (:ro, or its "
                              "dsecd takes --allow-host-mount " + in->path + ":rw)");
      in = w;
    }
    // Beneath the allowed directory's descriptor: a symlink or ".." that
    // leaves it fails (EXDEV) instead of being followed out.
    std::string rel = host.size() > in->path.size()
                        ? host.substr(in->path == "/" ? 1 : in->path.size() + 1)
                        : ".";
    open_how how{};
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_NO_MAGICLINKS | (anything_ ? 0 : RESOLVE_BENEATH);
    unique_fd fd{static_cast<int>(
      ::syscall(SYS_openat2, in->fd.get(), rel.c_str(), &how, sizeof how))};
    if (!fd) {
      int err = errno;
      if (err == ENOENT || err == ENOTDIR)
        return make_error(errc::not_found,
                          "host mount " + m.to_string() + ": " + host + " does not exist");
      if (err == EXDEV)
        return make_error(errc::invalid_argument,
                          "host mount " + m.to_string() + ": " + host + " leads out of "
                            + in->path + " through a symlink");
      return sys_error("host mount " + m.to_string() + ": opening", host, err);
    }
    struct stat st{};
    if (::fstat(fd.get(), &st) < 0)
      return sys_error("host mount " + m.to_string() + ": stat", host);
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
      return make_error(errc::wrong_kind, "host mount " + m.to_string() + ": " + host
                                            + " is neither a directory nor a regular file");
    // The one mount it is on, from it down, or (rbind) with the mounts
    // beneath it; the attributes go on each of them.
    const unsigned rec = m.recursive ? AT_RECURSIVE : 0;
    unique_fd tree{sys::open_tree(fd.get(), "",
                                  OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | rec)};
    if (!tree)
      return sys_error("host mount " + m.to_string() + ": open_tree", host);
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (m.read_only ? MOUNT_ATTR_RDONLY : 0);
    attr.propagation = MS_PRIVATE;
    if (sys::mount_setattr(tree.get(), "", AT_EMPTY_PATH | rec, &attr) < 0)
      return sys_error("host mount " + m.to_string() + ": setting nosuid, nodev, ro", host);
    // Its own step: a filesystem that cannot be idmapped says so by name.
    mount_attr idmap{};
    idmap.attr_set = MOUNT_ATTR_IDMAP;
    idmap.userns_fd = static_cast<uint64_t>(userns_fd);
    if (m.idmap && sys::mount_setattr(tree.get(), "", AT_EMPTY_PATH | rec, &idmap) < 0) {
      auto e = sys_error("host mount " + m.to_string() + ": idmapping the mount of", host);
      if (errno == EINVAL)
        e.message = "host mount " + m.to_string() + ": the filesystem of " + host
                    + (m.recursive ? " (or of a mount beneath it)" : "")
                    + " cannot be idmapped (ext4, xfs, btrfs and tmpfs can), so its owners "
                      "could not be kept; ',noidmap' mounts it as it is (owners the sandbox "
                      "does not map show as nobody)";
      e.code = errc::unsupported;
      return e;
    }
    prepared_mount p;
    p.tree = std::move(tree);
    p.target = target;
    p.directory = S_ISDIR(st.st_mode);
    out.push_back(std::move(p));
  }
  return out;
}

} // namespace dsec

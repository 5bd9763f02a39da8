#include "runtime/freezer.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <mutex>
#include <thread>

#include "runtime/fd.hpp"
#include "runtime/sys.hpp"

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

namespace dsec {

namespace {

using namespace std::chrono_literals;

int read_file(const std::string& path, std::string& out) {
  unique_fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (!fd)
    return errno;
  out.clear();
  char buf[4096];
  for (;;) {
    auto n = sys::retry([&] { return ::read(fd.get(), buf, sizeof buf); });
    if (n < 0)
      return errno;
    if (n == 0)
      return 0;
    out.append(buf, static_cast<size_t>(n));
  }
}

int write_file(const std::string& path, std::string_view data) {
  unique_fd fd{::open(path.c_str(), O_WRONLY | O_CLOEXEC)};
  if (!fd)
    return errno;
  if (::write(fd.get(), data.data(), data.size()) < 0)
    return errno;
  return 0;
}

std::vector<pid_t> procs_of(const std::string& dir) {
  std::vector<pid_t> out;
  std::string s;
  if (read_file(dir + "/cgroup.procs", s) != 0)
    return out;
  size_t at = 0;
  while (at < s.size()) {
    auto nl = s.find('\n', at);
    if (nl == std::string::npos)
      nl = s.size();
    int v = 0;
    auto r = std::from_chars(s.data() + at, s.data() + nl, v);
    if (r.ec == std::errc{} && v > 0)
      out.push_back(v);
    at = nl + 1;
  }
  return out;
}

bool is_v2(const std::string& dir) {
  struct statfs st{};
  return ::statfs(dir.c_str(), &st) == 0 && static_cast<long>(st.f_type) == CGROUP2_SUPER_MAGIC;
}

// The v1 freezer hierarchy's directory of our own cgroup, or empty.
std::string own_freezer_dir() {
  std::string self, mounts;
  if (read_file("/proc/self/cgroup", self) != 0 || read_file("/proc/self/mountinfo", mounts) != 0)
    return {};
  std::string path;
  size_t at = 0;
  while (at < self.size()) {
    auto nl = self.find('\n', at);
    auto line = self.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    at = nl == std::string::npos ? self.size() : nl + 1;
    auto a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos)
      continue;
    auto ctl = "," + line.substr(a + 1, b - a - 1) + ",";
    if (ctl.find(",freezer,") != std::string::npos)
      path = line.substr(b + 1);
  }
  if (path.empty())
    return {};
  at = 0;
  while (at < mounts.size()) {
    auto nl = mounts.find('\n', at);
    auto line = mounts.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    at = nl == std::string::npos ? mounts.size() : nl + 1;
    std::vector<std::string> f;
    size_t p = 0;
    while (p <= line.size()) {
      auto sp = line.find(' ', p);
      f.push_back(line.substr(p, sp == std::string::npos ? std::string::npos : sp - p));
      if (sp == std::string::npos)
        break;
      p = sp + 1;
    }
    auto sep = std::find(f.begin(), f.end(), std::string("-"));
    if (sep == f.end() || f.end() - sep < 4 || f.size() < 6 || sep[1] != "cgroup")
      continue;
    if (("," + sep[3] + ",").find(",freezer,") == std::string::npos)
      continue;
    const auto& root = f[3];
    const auto& mp = f[4];
    std::string rel;
    if (root == "/")
      rel = path;
    else if (path.compare(0, root.size(), root) == 0)
      rel = path.substr(root.size());
    else
      continue;
    if (rel == "/")
      rel.clear();
    return mp + rel;
  }
  return {};
}

const std::string& freezer_own() {
  static const std::string dir = own_freezer_dir();
  return dir;
}

// Serializes making and removing the shared <own>/dsec/<owner> dirs.
std::mutex& dirs_mutex() {
  static std::mutex m;
  return m;
}

// Waits until `pred` holds, at most `limit`; true if it did.
template <class F>
bool wait_until(F&& pred, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  auto pause = 50us;
  for (;;) {
    if (pred())
      return true;
    if (std::chrono::steady_clock::now() >= deadline)
      return false;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, 5ms);
  }
}

bool v1_state_is(const std::string& dir, std::string_view want) {
  std::string s;
  if (read_file(dir + "/freezer.state", s) != 0)
    return false;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' '))
    s.pop_back();
  return s == want;
}

bool v2_frozen(const std::string& dir) {
  std::string s;
  return read_file(dir + "/cgroup.events", s) == 0 && s.find("frozen 1") != std::string::npos;
}

void kill_all(const std::string& dir) {
  for (auto pid : procs_of(dir)) {
    unique_fd fd(sys::pidfd_open(pid, 0));
    if (!fd)
      continue;
    auto still = procs_of(dir);
    if (std::find(still.begin(), still.end(), pid) != still.end())
      sys::pidfd_send_signal(fd.get(), SIGKILL);
  }
}

int rmdir_retry(const std::string& dir) {
  int err = 0;
  wait_until([&] {
    if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) {
      err = 0;
      return true;
    }
    err = errno;
    return err != EBUSY;
  }, 1000ms);
  return err;
}

} // namespace

sandbox_freezer::sandbox_freezer(sandbox_freezer&& o) noexcept
  : v2_(o.v2_), made_(std::exchange(o.made_, false)), frozen_(std::exchange(o.frozen_, false)),
    dir_(std::move(o.dir_)), procs_(std::move(o.procs_)), owner_dir_(std::move(o.owner_dir_)) {
  o.dir_.clear();
}

sandbox_freezer& sandbox_freezer::operator=(sandbox_freezer&& o) noexcept {
  if (this != &o) {
    (void) destroy();
    v2_ = o.v2_;
    made_ = std::exchange(o.made_, false);
    frozen_ = std::exchange(o.frozen_, false);
    dir_ = std::move(o.dir_);
    procs_ = std::move(o.procs_);
    owner_dir_ = std::move(o.owner_dir_);
    o.dir_.clear();
  }
  return *this;
}

sandbox_freezer::~sandbox_freezer() { (void) destroy(); }

expected<sandbox_freezer> sandbox_freezer::open(const std::vector<std::string>& cgroup_dirs,
                                                std::string_view name,
                                                const std::string& owner) {
  if (cgroup_dirs.empty())
    return make_error(errc::unsupported,
                      "pause needs the sandbox's cgroup, and this one has none (it was made"
                      " without limits)");
  if (name.empty() || name.find('/') != std::string_view::npos || name == "." || name == "..")
    return make_error(errc::invalid_argument, "bad freezer cgroup name '" + std::string{name} + "'");
  sandbox_freezer f;
  for (const auto& d : cgroup_dirs)
    if (is_v2(d)) {
      f.v2_ = true;
      f.dir_ = d;
      return f;
    }
  if (freezer_own().empty())
    return make_error(errc::unsupported,
                      "pause needs a cgroup freezer: the sandbox's cgroups are v1 and no v1 "
                      "freezer hierarchy holds this process");
  f.procs_ = cgroup_dirs.front();
  f.owner_dir_ = freezer_own() + "/dsec/" + owner;
  f.dir_ = f.owner_dir_ + "/" + std::string{name};
  return f;
}

expected<void> sandbox_freezer::freeze() {
  if (dir_.empty())
    return make_error(errc::invalid_argument, "freeze of a moved-from freezer");
  if (v2_) {
    if (int err = write_file(dir_ + "/cgroup.freeze", "1"))
      return sys_error("pause: writing cgroup.freeze of", dir_, err);
    frozen_ = true;
    if (!wait_until([&] { return v2_frozen(dir_); }, 200ms)) {
      (void) thaw();
      return make_error(errc::timeout, "pause: the kernel did not freeze " + dir_ + " in 200 ms");
    }
    return {};
  }
  if (!made_) {
    std::lock_guard<std::mutex> g{dirs_mutex()};
    for (const auto& d : {freezer_own() + "/dsec", owner_dir_, dir_})
      if (::mkdir(d.c_str(), 0755) < 0 && errno != EEXIST)
        return sys_error("pause: making the freezer cgroup", d);
    made_ = true;
  }
  frozen_ = true;
  // Move, freeze, and move again whatever a fork put outside meanwhile.
  for (int round = 0; round < 16; ++round) {
    auto mine = procs_of(dir_);
    bool moved = false;
    for (auto pid : procs_of(procs_)) {
      if (std::find(mine.begin(), mine.end(), pid) != mine.end())
        continue;
      moved = true;
      int err = write_file(dir_ + "/cgroup.procs", std::to_string(pid));
      if (err != 0 && err != ESRCH) {
        (void) thaw();
        return sys_error("pause: moving a process into", dir_, err);
      }
    }
    if (int err = write_file(dir_ + "/freezer.state", "FROZEN")) {
      (void) thaw();
      return sys_error("pause: writing freezer.state of", dir_, err);
    }
    if (!wait_until([&] { return v1_state_is(dir_, "FROZEN"); }, 200ms)) {
      (void) thaw();
      return make_error(errc::timeout, "pause: the kernel did not freeze " + dir_ + " in 200 ms");
    }
    if (!moved) {
      // Frozen, and every process of the sandbox was inside before: none can fork now.
      auto inside = procs_of(dir_);
      bool all = true;
      for (auto pid : procs_of(procs_))
        all = all && std::find(inside.begin(), inside.end(), pid) != inside.end();
      if (all)
        return {};
    }
  }
  (void) thaw();
  return make_error(errc::timeout, "pause: the sandbox's processes kept forking out of " + dir_);
}

expected<void> sandbox_freezer::thaw() {
  if (dir_.empty() || !frozen_)
    return {};
  if (v2_) {
    if (int err = write_file(dir_ + "/cgroup.freeze", "0"); err && err != ENOENT)
      return sys_error("resume: writing cgroup.freeze of", dir_, err);
  } else if (made_) {
    if (int err = write_file(dir_ + "/freezer.state", "THAWED"); err && err != ENOENT)
      return sys_error("resume: writing freezer.state of", dir_, err);
  }
  frozen_ = false;
  return {};
}

expected<void> sandbox_freezer::destroy() {
  if (dir_.empty())
    return {};
  auto t = thaw();
  if (!v2_ && made_) {
    if (int err = rmdir_retry(dir_))
      return sys_error("removing the freezer cgroup", dir_, err);
    made_ = false;
    std::lock_guard<std::mutex> g{dirs_mutex()};
    // The last sandbox of this owner takes the shared dirs along (busy: others remain).
    if (::rmdir(owner_dir_.c_str()) == 0)
      (void) ::rmdir((freezer_own() + "/dsec").c_str());
  }
  dir_.clear();
  return t;
}

void collect_freezer_garbage(const std::string& self_owner, std::vector<std::string>& removed) {
  if (freezer_own().empty())
    return;
  auto dsec_dir = freezer_own() + "/dsec";
  DIR* d = ::opendir(dsec_dir.c_str());
  if (!d)
    return;
  std::vector<std::string> dead;
  while (auto* ent = ::readdir(d)) {
    std::string n = ent->d_name;
    if (ent->d_type != DT_DIR || n == "." || n == ".." || n == self_owner)
      continue;
    auto dash = n.find('-');
    if (dash == std::string::npos)
      continue;
    int pid = 0;
    uint64_t start = 0;
    auto a = std::from_chars(n.data(), n.data() + dash, pid);
    auto b = std::from_chars(n.data() + dash + 1, n.data() + n.size(), start);
    if (a.ec != std::errc{} || b.ec != std::errc{} || pid <= 0)
      continue;
    // Alive with the same start time (field 22 of its stat): not garbage.
    std::string stat;
    if (read_file("/proc/" + std::to_string(pid) + "/stat", stat) == 0) {
      auto close = stat.rfind(')');
      uint64_t st = 0;
      char state = close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
      int field = 2;
      size_t p = close == std::string::npos ? stat.size() : close + 1;
      while (p < stat.size()) {
        while (p < stat.size() && stat[p] == ' ')
          ++p;
        auto e = stat.find(' ', p);
        if (e == std::string::npos)
          e = stat.size();
        if (++field == 22)
          std::from_chars(stat.data() + p, stat.data() + e, st);
        p = e;
      }
      if (st == start && state != 'Z' && state != 'X')
        continue;
    }
    dead.push_back(dsec_dir + "/" + n);
  }
  ::closedir(d);
  for (const auto& owner : dead) {
    if (DIR* od = ::opendir(owner.c_str())) {
      std::vector<std::string> kids;
      while (auto* ent = ::readdir(od)) {
        std::string n = ent->d_name;
        if (ent->d_type == DT_DIR && n != "." && n != "..")
          kids.push_back(owner + "/" + n);
      }
      ::closedir(od);
      for (const auto& k : kids) {
        kill_all(k);
        (void) write_file(k + "/freezer.state", "THAWED");
        if (rmdir_retry(k) == 0)
          removed.push_back(k);
      }
    }
    if (::rmdir(owner.c_str()) == 0)
      removed.push_back(owner);
  }
}

} // namespace dsec

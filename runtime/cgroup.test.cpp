// Tests of runtime/cgroup: parsing with fake /proc contents everywhere, and the
// real thing (root needed) on this machine's hierarchies. Every test removes the
// cgroups it made and kills the processes it started, in every outcome.
#include "runtime/cgroup.hpp"

#include <dirent.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace {

using dsec::cgroup_controller;
using dsec::cgroup_layout;
using dsec::cgroup_root;
using dsec::cgroup_version;
using dsec::errc;
using dsec::limits;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' '))
    s.pop_back();
  return s;
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// This process's own v1 cgroup dir for a controller, computed independently of
// the code under test (this machine mounts v1 at /sys/fs/cgroup/<controller>).
std::string own_v1(const std::string& controller) {
  std::istringstream in(slurp("/proc/self/cgroup"));
  for (std::string line; std::getline(in, line);) {
    auto a = line.find(':');
    auto b = line.find(':', a + 1);
    std::string ctl = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    std::istringstream cs(ctl);
    for (std::string c; std::getline(cs, c, ',');)
      if (c == controller)
        return "/sys/fs/cgroup/" + controller + (path == "/" ? "" : path);
  }
  return {};
}

// "<pid>-<starttime>" of a process, from /proc/<pid>/stat field 22.
std::string owner_of(pid_t pid) {
  auto stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  std::istringstream in(stat.substr(stat.rfind(')') + 2));
  std::string f;
  for (int i = 3; i <= 22; ++i)
    in >> f;
  return std::to_string(pid) + '-' + f;
}

const std::vector<std::string> controllers = {"memory", "pids", "cpu"};

// Removes a cgroup tree depth-first (only used to clean up after a failure).
void rm_tree(const std::string& dir) {
  if (!exists(dir))
    return;
  std::vector<std::string> subs;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (auto* e = ::readdir(d))
      if (e->d_type == DT_DIR && std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, ".."))
        subs.push_back(dir + '/' + e->d_name);
    ::closedir(d);
  }
  for (auto& s : subs)
    rm_tree(s);
  ::rmdir(dir.c_str());
}

// Our owner dirs that exist in any hierarchy.
std::vector<std::string> leftovers() {
  std::vector<std::string> out;
  auto me = owner_of(::getpid());
  for (auto& c : controllers) {
    auto dir = own_v1(c) + "/dsec/" + me;
    if (exists(dir))
      out.push_back(dir);
  }
  return out;
}

// Declared first in every test that touches cgroups: whatever happens, our
// owner dirs (and an empty <own>/dsec) are gone afterwards, and the test checks
// that the code under test removed them itself.
struct cleanup_guard {
  cleanup_guard() = default;
  cleanup_guard(const cleanup_guard&) = delete;
  cleanup_guard& operator=(const cleanup_guard&) = delete;
  ~cleanup_guard() {
    for (auto& dir : leftovers())
      rm_tree(dir);
    for (auto& c : controllers)
      ::rmdir((own_v1(c) + "/dsec").c_str()); // only when empty
  }
};

// rmdir()s extra directories a test made, innermost last in the list.
struct dir_guard {
  std::vector<std::string> dirs;
  ~dir_guard() {
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it)
      rm_tree(*it);
  }
};

// A forked child that is killed and reaped (by pid) unless the test reaped it.
struct child {
  pid_t pid = -1;
  ~child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  int wait() {
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    return status;
  }
};

// In a forked child: joins every cgroup of the sandbox as the sandbox's first
// process does.
void join(const std::vector<int>& fds) {
  for (int fd : fds)
    if (::write(fd, "0", 1) != 1)
      ::_exit(100);
}

std::string read_value(const std::string& dir, const char* file) {
  return trim(slurp(dir + '/' + file));
}

// Forks a child that joins the cgroups, reports on a pipe and waits to be killed.
void start_joined(child& c, const dsec::sandbox_cgroup& cg) {
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  auto fds = cg.join_fds();
  c.pid = ::fork();
  REQUIRE(c.pid >= 0);
  if (c.pid == 0) {
    join(fds);
    char x = 1;
    (void)!::write(p[1], &x, 1);
    for (;;)
      ::pause();
  }
  ::close(p[1]);
  char x = 0;
  CHECK(::read(p[0], &x, 1) == 1);
  ::close(p[0]);
}

// The real files of this machine, for layouts derived from them.
cgroup_layout real_layout(std::string_view v2_controllers = {}) {
  auto l = cgroup_layout::parse(slurp("/proc/self/cgroup"), slurp("/proc/self/mountinfo"),
                                v2_controllers);
  REQUIRE(l);
  return *l;
}

} // namespace

// --- limits -------------------------------------------------------------------

TEST_CASE("limits: any() and validate() name the option and the bad value") {
  limits none;
  CHECK_FALSE(none.any());
  CHECK(none.validate());

  limits ok;
  ok.memory_bytes = 4u << 20;
  ok.pids = 1;
  ok.cpus = 0.01;
  CHECK(ok.any());
  CHECK(ok.validate());
  ok.cpus = 1024;
  CHECK(ok.validate());

  auto bad = [](limits l, const char* option, const char* value) {
    auto r = l.validate();
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == errc::invalid_argument);
    CHECK_MESSAGE(has(r.error_value().message, option), r.error_value().message);
    CHECK_MESSAGE(has(r.error_value().message, value), r.error_value().message);
  };
  limits l;
  l.memory_bytes = 1u << 20;
  bad(l, "--memory", "1048576");
  l = {};
  l.pids = 0;
  bad(l, "--pids", "0");
  l = {};
  l.pids = 5000000;
  bad(l, "--pids", "5000000");
  l = {};
  l.cpus = 0.001;
  bad(l, "--cpus", "0.001");
  l = {};
  l.cpus = 2000;
  bad(l, "--cpus", "2000");
  l = {};
  l.cpus = std::nan("");
  bad(l, "--cpus", "nan");
}

// --- parsing ------------------------------------------------------------------

TEST_CASE("layout: pure cgroup v2 with delegated controllers") {
  auto self = "0::/system.slice/dsecd.service\n";
  auto mi =
    "22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"
    "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 "
    "cgroup2 rw,nsdelegate,memory_recursiveprot\n";
  auto l = cgroup_layout::parse(self, mi, "cpuset cpu io memory hugetlb pids rdma misc\n");
  REQUIRE(l);
  CHECK(l->v2_dir == "/sys/fs/cgroup/system.slice/dsecd.service");
  for (auto c : {cgroup_controller::memory, cgroup_controller::pids, cgroup_controller::cpu}) {
    CHECK(l->preferred(c) == cgroup_version::v2);
    CHECK(l->own_dir(c) == "/sys/fs/cgroup/system.slice/dsecd.service");
  }

  // Only what our cgroup.controllers lists is usable; nothing else offers pids.
  auto partial = cgroup_layout::parse(self, mi, "cpu io memory");
  REQUIRE(partial);
  CHECK(partial->preferred(cgroup_controller::memory) == cgroup_version::v2);
  CHECK(partial->preferred(cgroup_controller::cpu) == cgroup_version::v2);
  CHECK(partial->preferred(cgroup_controller::pids) == cgroup_version::absent);
  CHECK(partial->own_dir(cgroup_controller::pids).empty());

  // Inside a container with a cgroup namespace: our cgroup is "/" of the mount.
  auto ns = cgroup_layout::parse(
    "0::/\n", "100 90 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "memory pids");
  REQUIRE(ns);
  CHECK(ns->v2_dir == "/sys/fs/cgroup");
  CHECK(ns->preferred(cgroup_controller::pids) == cgroup_version::v2);
}

TEST_CASE("layout: pure cgroup v1 with co-mounted cpu,cpuacct") {
  auto self =
    "12:pids:/user.slice/user-0.slice\n"
    "11:memory:/user.slice/user-0.slice/session-1.scope\n"
    "5:cpuset:/\n"
    "4:cpu,cpuacct:/user.slice\n"
    "1:name=systemd:/user.slice/user-0.slice/session-1.scope\n";
  auto mi =
    "25 18 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n"
    "26 25 0:23 / /sys/fs/cgroup/systemd rw,nosuid shared:10 - cgroup cgroup "
    "rw,xattr,name=systemd\n"
    "29 25 0:26 / /sys/fs/cgroup/cpuset rw,nosuid shared:13 - cgroup cgroup rw,cpuset\n"
    "30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:14 - cgroup cgroup "
    "rw,cpu,cpuacct\n"
    "31 25 0:28 / /sys/fs/cgroup/memory rw,nosuid shared:15 - cgroup cgroup rw,memory\n"
    "32 25 0:29 / /sys/fs/cgroup/pids rw,nosuid shared:16 - cgroup cgroup rw,pids\n";
  auto l = cgroup_layout::parse(self, mi, "");
  REQUIRE(l);
  CHECK(l->v2_dir.empty());
  CHECK(l->preferred(cgroup_controller::memory) == cgroup_version::v1);
  CHECK(l->own_dir(cgroup_controller::memory) ==
        "/sys/fs/cgroup/memory/user.slice/user-0.slice/session-1.scope");
  CHECK(l->own_dir(cgroup_controller::pids) == "/sys/fs/cgroup/pids/user.slice/user-0.slice");
  CHECK(l->own_dir(cgroup_controller::cpu) == "/sys/fs/cgroup/cpu,cpuacct/user.slice");
}

TEST_CASE("layout: hybrid like this machine picks v1 for memory, pids and cpu") {
  auto self =
    "9:name=systemd:/\n8:pids:/\n7:blkio:/\n6:freezer:/\n5:devices:/\n"
    "4:memory:/process_api/60b9f82d13881465d27ac9e5e1143568\n3:cpuset:/\n2:cpuacct:/\n"
    "1:cpu:/\n0::/\n";
  auto mi =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
  auto l = cgroup_layout::parse(self, mi, "hugetlb\n");
  REQUIRE(l);
  CHECK(l->v2_dir == "/sys/fs/cgroup/unified");
  CHECK(l->v2_listed == std::array<bool, 3>{false, false, false});
  CHECK(l->preferred(cgroup_controller::memory) == cgroup_version::v1);
  CHECK(l->own_dir(cgroup_controller::memory) ==
        "/sys/fs/cgroup/memory/process_api/60b9f82d13881465d27ac9e5e1143568");
  CHECK(l->own_dir(cgroup_controller::pids) == "/sys/fs/cgroup/pids");
  CHECK(l->own_dir(cgroup_controller::cpu) == "/sys/fs/cgroup/cpu");

  // Hybrid where v2 does have memory: memory goes to v2, the rest stays on v1.
  auto mixed = cgroup_layout::parse(
    "8:pids:/a\n1:cpu:/a\n0::/a/b\n",
    "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
    "memory hugetlb");
  REQUIRE(mixed);
  CHECK(mixed->preferred(cgroup_controller::memory) == cgroup_version::v2);
  CHECK(mixed->own_dir(cgroup_controller::memory) == "/sys/fs/cgroup/unified/a/b");
  CHECK(mixed->own_dir(cgroup_controller::pids) == "/sys/fs/cgroup/pids/a");
  CHECK(mixed->preferred(cgroup_controller::cpu) == cgroup_version::v1);
}

TEST_CASE("layout: mount roots, escaped mount points and malformed input") {
  // A bind mount of a subtree: the path is relative to the mount's root.
  auto self = "4:memory:/docker/abc/sub\n8:pids:/elsewhere\n";
  auto mi =
    "35 31 0:32 /docker/abc /sys/fs/cgroup/my\\040memory rw - cgroup cgroup rw,memory\n"
    "39 31 0:36 /docker/abc /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";
  auto l = cgroup_layout::parse(self, mi, "");
  REQUIRE(l);
  CHECK(l->own_dir(cgroup_controller::memory) == "/sys/fs/cgroup/my memory/sub");
  // Our pids cgroup is not below that mount's root: not visible, so absent.
  CHECK(l->preferred(cgroup_controller::pids) == cgroup_version::absent);
  // "/docker/abcdef" is not below "/docker/abc".
  auto prefix = cgroup_layout::parse("4:memory:/docker/abcdef\n", mi, "");
  REQUIRE(prefix);
  CHECK(prefix->preferred(cgroup_controller::memory) == cgroup_version::absent);

  auto bad = cgroup_layout::parse("garbage\n", mi, "");
  REQUIRE_FALSE(bad);
  CHECK(bad.error_value().code == errc::invalid_argument);
  CHECK(has(bad.error_value().message, "garbage"));

  auto empty = cgroup_layout::parse("", "", "");
  REQUIRE(empty);
  CHECK(empty->preferred(cgroup_controller::cpu) == cgroup_version::absent);
}

// --- this machine -------------------------------------------------------------

TEST_CASE("detect() on this machine finds memory, pids and cpu in v1") {
  cleanup_guard guard;
  {
    auto root = cgroup_root::detect();
    REQUIRE_MESSAGE(root, root.error_value().to_string());
    auto d = root->describe();
    MESSAGE(d);
    CHECK(has(d, "memory: v1 " + own_v1("memory") + "/dsec"));
    CHECK(has(d, "pids: v1 " + own_v1("pids") + "/dsec"));
    CHECK(has(d, "cpu: v1 " + own_v1("cpu") + "/dsec"));
    CHECK(root->owner() == owner_of(::getpid()));
    for (auto c : {cgroup_controller::memory, cgroup_controller::pids, cgroup_controller::cpu}) {
      CHECK(root->version(c) == cgroup_version::v1);
      CHECK(exists(root->owner_dir(c)));
    }
    // A second root of the same process shares the owner dirs; they stay until
    // the last root goes.
    {
      auto again = cgroup_root::detect();
      REQUIRE(again);
    }
    CHECK(exists(root->owner_dir(cgroup_controller::memory)));
    auto moved = std::move(*root);
    CHECK(exists(moved.owner_dir(cgroup_controller::pids)));
  }
  CHECK(leftovers().empty());
}

TEST_CASE("create() writes each limit") {
  cleanup_guard guard;
  {
    auto root = cgroup_root::detect();
    REQUIRE(root);

    limits none;
    auto empty = root->create("none", none);
    REQUIRE(empty);
    CHECK(empty->empty());
    CHECK(empty->join_fds().empty());

    limits mem;
    mem.memory_bytes = 32u << 20;
    auto m = root->create("mem", mem);
    REQUIRE_MESSAGE(m, m.error_value().to_string());
    REQUIRE(m->paths().size() == 1);
    auto mdir = m->paths()[0];
    CHECK(mdir == root->owner_dir(cgroup_controller::memory) + "/mem");
    CHECK(read_value(mdir, "memory.limit_in_bytes") == "33554432");
    CHECK(read_value(mdir, "memory.memsw.limit_in_bytes") == "33554432");
    CHECK_FALSE(m->oom_killed());

    limits pids;
    pids.pids = 7;
    auto p = root->create("pids", pids);
    REQUIRE(p);
    REQUIRE(p->paths().size() == 1);
    CHECK(read_value(p->paths()[0], "pids.max") == "7");

    limits cpu;
    cpu.cpus = 1.5;
    auto c = root->create("cpu", cpu);
    REQUIRE(c);
    REQUIRE(c->paths().size() == 1);
    CHECK(read_value(c->paths()[0], "cpu.cfs_period_us") == "100000");
    CHECK(read_value(c->paths()[0], "cpu.cfs_quota_us") == "150000");

    limits all;
    all.memory_bytes = 64u << 20;
    all.pids = 100;
    all.cpus = 0.01;
    auto a = root->create("all", all);
    REQUIRE(a);
    CHECK(a->paths().size() == 3);
    auto fds = a->join_fds();
    CHECK(fds.size() == 3);
    for (int fd : fds)
      CHECK((::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
    CHECK(read_value(root->owner_dir(cgroup_controller::cpu) + "/all", "cpu.cfs_quota_us") ==
          "1000");
    a->close_join_fds();
    CHECK(a->join_fds().empty());

    auto dup = root->create("mem", mem);
    REQUIRE_FALSE(dup);
    CHECK(dup.error_value().code == errc::already_exists);

    for (auto name : {"", ".", "..", "a/b"}) {
      auto r = root->create(name, mem);
      REQUIRE_FALSE(r);
      CHECK(r.error_value().code == errc::invalid_argument);
    }
    limits tiny;
    tiny.memory_bytes = 1;
    auto t = root->create("tiny", tiny);
    REQUIRE_FALSE(t);
    CHECK(has(t.error_value().message, "--memory"));
    CHECK_FALSE(exists(root->owner_dir(cgroup_controller::memory) + "/tiny"));

    // destroy() removes the dirs and is idempotent.
    CHECK(m->destroy());
    CHECK_FALSE(exists(mdir));
    CHECK(m->destroy());
    CHECK(m->paths().empty());
  }
  CHECK(leftovers().empty());
}

TEST_CASE("a child joins through join_fds()") {
  cleanup_guard guard;
  {
    auto root = cgroup_root::detect();
    REQUIRE(root);
    limits all;
    all.memory_bytes = 64u << 20;
    all.pids = 16;
    all.cpus = 1;
    auto cg = root->create("join", all);
    REQUIRE(cg);
    child c;
    start_joined(c, *cg);
    auto self_cgroup = slurp("/proc/" + std::to_string(c.pid) + "/cgroup");
    for (auto& dir : cg->paths()) {
      std::istringstream procs(slurp(dir + "/cgroup.procs"));
      std::vector<std::string> pids{std::istream_iterator<std::string>(procs),
                                    std::istream_iterator<std::string>()};
      CHECK(std::find(pids.begin(), pids.end(), std::to_string(c.pid)) != pids.end());
      // /sys/fs/cgroup/<controller>/<path> shows as "N:<controller>:/<path>".
      auto rest = dir.substr(std::strlen("/sys/fs/cgroup/"));
      auto slash = rest.find('/');
      auto line = ':' + rest.substr(0, slash) + ':' + rest.substr(slash) + '\n';
      CHECK_MESSAGE(has(self_cgroup, line), self_cgroup);
    }
    ::kill(c.pid, SIGKILL);
    c.wait();
    CHECK(cg->destroy());
  }
  CHECK(leftovers().empty());
}

TEST_CASE("a child over a 16 MiB memory limit is OOM-killed") {
  cleanup_guard guard;
  {
    auto root = cgroup_root::detect();
    REQUIRE(root);
    limits lim;
    lim.memory_bytes = 16u << 20;
    auto cg = root->create("oom", lim);
    REQUIRE(cg);
    auto fds = cg->join_fds();
    child c;
    c.pid = ::fork();
    REQUIRE(c.pid >= 0);
    if (c.pid == 0) {
      join(fds);
      constexpr size_t size = 64u << 20;
      auto* p = static_cast<char*>(
        ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      if (p == MAP_FAILED)
        ::_exit(101);
      for (size_t i = 0; i < size; i += 4096)
        p[i] = 1;
      ::_exit(0);
    }
    int status = c.wait();
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);
    CHECK(cg->oom_killed());
    CHECK(cg->destroy());
  }
  CHECK(leftovers().empty());
}

TEST_CASE("pids.max=5 stops the 6th process") {
  cleanup_guard guard;
  {
    auto root = cgroup_root::detect();
    REQUIRE(root);
    limits lim;
    lim.pids = 5;
    auto cg = root->create("pids", lim);
    REQUIRE(cg);
    auto fds = cg->join_fds();
    child c;
    c.pid = ::fork();
    REQUIRE(c.pid >= 0);
    if (c.pid == 0) {
      join(fds);
      // We are process 1 of 5; 4 more fit, the next fork must fail with EAGAIN.
      std::vector<pid_t> kids;
      int err = 0;
      for (int i = 0; i < 6 && err == 0; ++i) {
        pid_t k = ::fork();
        if (k == 0) {
          ::pause();
          ::_exit(0);
        }
        if (k < 0)
          err = errno;
        else
          kids.push_back(k);
      }
      for (auto k : kids)
        ::kill(k, SIGKILL);
      for (auto k : kids)
        ::waitpid(k, nullptr, 0);
      ::_exit(static_cast<int>(kids.size()) * 10 + (err == EAGAIN ? 1 : 0));
    }
    int status = c.wait();
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 41); // 4 forks succeeded, the 5th got EAGAIN
    CHECK(cg->destroy());
  }
  CHECK(leftovers().empty());
}

TEST_CASE("destroy() fails while a process is inside and succeeds once it is reaped") {
  cleanup_guard guard;
  {
    auto root = cgroup_root::detect();
    REQUIRE(root);
    limits lim;
    lim.memory_bytes = 32u << 20;
    lim.pids = 10;
    auto cg = root->create("busy", lim);
    REQUIRE(cg);
    child c;
    start_joined(c, *cg);
    auto t0 = std::chrono::steady_clock::now();
    auto r = cg->destroy();
    auto waited = std::chrono::steady_clock::now() - t0;
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == errc::in_use);
    CHECK(r.error_value().sys_errno == EBUSY);
    CHECK_MESSAGE(has(r.error_value().message, "/busy"), r.error_value().message);
    CHECK_MESSAGE(has(r.error_value().message, "processes are still in it"),
                  r.error_value().message);
    CHECK(waited >= std::chrono::milliseconds(900));
    CHECK(waited < std::chrono::seconds(3));
    CHECK(cg->paths().size() == 2); // kept for the next attempt
    ::kill(c.pid, SIGKILL);
    c.wait();
    auto again = cg->destroy();
    CHECK_MESSAGE(again, again.error_value().to_string());
    CHECK(cg->empty());
  }
  CHECK(leftovers().empty());
}

TEST_CASE("collect_garbage() removes a dead owner's cgroups and nothing else") {
  cleanup_guard guard;
  {
    auto root = cgroup_root::detect();
    REQUIRE(root);
    auto mem_dsec = own_v1("memory") + "/dsec";
    auto pids_dsec = own_v1("pids") + "/dsec";
    auto dead_mem = mem_dsec + "/999999999-1";
    auto dead_pids = pids_dsec + "/999999999-1";
    // Our parent is alive: its dirs must stay.
    auto live = pids_dsec + "/" + owner_of(::getppid());
    // Not an owner name at all: never touched.
    auto other = pids_dsec + "/not-an-owner";
    dir_guard dirs{{dead_mem, dead_mem + "/x", dead_pids, dead_pids + "/x", dead_pids + "/y",
                    live, live + "/z", other}};
    for (auto& d : dirs.dirs)
      REQUIRE_MESSAGE(::mkdir(d.c_str(), 0755) == 0, d, ": ", std::strerror(errno));

    // A leftover process of the dead owner (a child we start and move there).
    child c;
    c.pid = ::fork();
    REQUIRE(c.pid >= 0);
    if (c.pid == 0) {
      for (;;)
        ::pause();
    }
    {
      std::ofstream procs(dead_mem + "/x/cgroup.procs");
      procs << c.pid << std::flush;
      REQUIRE(procs.good());
    }
    auto removed = root->collect_garbage();
    REQUIRE_MESSAGE(removed, removed.error_value().to_string());
    std::sort(removed->begin(), removed->end());
    std::vector<std::string> expected{dead_mem, dead_mem + "/x", dead_pids, dead_pids + "/x",
                                      dead_pids + "/y"};
    std::sort(expected.begin(), expected.end());
    // Other dead owners' leftovers on this machine (a daemon killed earlier,
    // another run) are garbage too and may be collected alongside ours; the
    // live owner's and the non-owner's dirs never are.
    std::string got;
    for (auto& r : *removed)
      got += "\n  " + r;
    for (auto& d : expected)
      CHECK_MESSAGE(std::binary_search(removed->begin(), removed->end(), d),
                    d, " was not collected; collected:", got);
    for (auto& r : *removed) {
      CHECK_MESSAGE(r.rfind(live, 0) != 0, "collected the live owner's ", r);
      CHECK_MESSAGE(r.rfind(other, 0) != 0, "collected the non-owner ", r);
      CHECK_MESSAGE(r.find("/dsec/" + owner_of(::getpid())) == std::string::npos,
                    "collected our own ", r);
    }
    for (auto& d : expected)
      CHECK_FALSE(exists(d));
    int status = c.wait();
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);
    CHECK(exists(live + "/z"));
    CHECK(exists(other));
    for (auto ctl : {cgroup_controller::memory, cgroup_controller::pids, cgroup_controller::cpu})
      CHECK(exists(root->owner_dir(ctl)));
  }
  CHECK(leftovers().empty());
}

TEST_CASE("collect_garbage() takes a killed owner's cgroups while it is still a zombie") {
  cleanup_guard guard;
  {
    auto root = cgroup_root::detect();
    REQUIRE(root);
    // A child that has ended but that we have not reaped: what a dsecd killed
    // with -9 is until its parent reaps it.
    pid_t z = ::fork();
    REQUIRE(z >= 0);
    if (z == 0)
      ::_exit(0);
    std::string stat;
    for (int i = 0; i < 2000; ++i) { // until it shows as a zombie (a bound against a hang)
      std::ifstream in("/proc/" + std::to_string(z) + "/stat");
      std::getline(in, stat);
      if (stat.find(") Z ") != std::string::npos)
        break;
      ::usleep(1000);
    }
    REQUIRE_MESSAGE(stat.find(") Z ") != std::string::npos, stat);
    auto dead = own_v1("pids") + "/dsec/" + owner_of(z);
    dir_guard dirs{{dead, dead + "/pool-1"}};
    for (auto& d : dirs.dirs)
      REQUIRE_MESSAGE(::mkdir(d.c_str(), 0755) == 0, d, ": ", std::strerror(errno));
    auto removed = root->collect_garbage();
    REQUIRE_MESSAGE(removed, removed.error_value().to_string());
    CHECK(std::find(removed->begin(), removed->end(), dead) != removed->end());
    CHECK_FALSE(exists(dead));
    int status = 0;
    CHECK(::waitpid(z, &status, 0) == z);
  }
  CHECK(leftovers().empty());
}

TEST_CASE("open(): a controller that v2 lists but cannot enable falls back to v1") {
  cleanup_guard guard;
  {
    // Pretend our v2 cgroup (/sys/fs/cgroup/unified, the v2 root here) lists the
    // controllers: enabling them is refused (ENOENT), so v1 serves them. Nothing
    // is created in the v2 hierarchy.
    auto root = cgroup_root::open(real_layout("hugetlb memory pids cpu"));
    REQUIRE(root);
    for (auto c : {cgroup_controller::memory, cgroup_controller::pids, cgroup_controller::cpu})
      CHECK(root->version(c) == cgroup_version::v1);
    CHECK_FALSE(exists("/sys/fs/cgroup/unified/dsec/" + root->owner()));

    // Without a v1 hierarchy for cpu, cpu is absent and create() says why.
    auto layout = real_layout("hugetlb cpu");
    layout.v1_dirs[static_cast<size_t>(cgroup_controller::cpu)].clear();
    auto partial = cgroup_root::open(layout);
    REQUIRE(partial);
    CHECK(partial->version(cgroup_controller::cpu) == cgroup_version::absent);
    CHECK(partial->version(cgroup_controller::memory) == cgroup_version::v1);
    limits cpu;
    cpu.cpus = 1;
    auto r = partial->create("cpu", cpu);
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == errc::unsupported);
    CHECK_MESSAGE(has(r.error_value().message, "cpu controller"), r.error_value().message);
    CHECK_MESSAGE(has(r.error_value().message, "cgroup v2 cannot enable cpu"),
                  r.error_value().message);
    CHECK(has(partial->describe(), "cpu: absent ("));
  }
  CHECK(leftovers().empty());
}

TEST_CASE("create() names the absent controller") {
  cleanup_guard guard;
  {
    auto layout = real_layout();
    layout.v1_dirs[static_cast<size_t>(cgroup_controller::pids)].clear();
    auto root = cgroup_root::open(layout);
    REQUIRE(root);
    limits lim;
    lim.memory_bytes = 32u << 20;
    lim.pids = 5;
    auto r = root->create("x", lim);
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == errc::unsupported);
    CHECK_MESSAGE(has(r.error_value().message, "pids controller"), r.error_value().message);
    CHECK_MESSAGE(has(r.error_value().message, "--pids"), r.error_value().message);
    // Nothing half-made stays behind.
    CHECK_FALSE(exists(root->owner_dir(cgroup_controller::memory) + "/x"));
    limits mem;
    mem.memory_bytes = 32u << 20;
    CHECK(root->create("y", mem));
  }
  CHECK(leftovers().empty());
}

// --- the pool ---------------------------------------------------------------------

namespace {

// Runs `f` in a child that joined `cg`, and reaps it: its exit status.
template <class F>
int run_joined(const dsec::sandbox_cgroup& cg, F f) {
  auto fds = cg.join_fds();
  child c;
  c.pid = ::fork();
  REQUIRE(c.pid >= 0);
  if (c.pid == 0) {
    join(fds);
    ::_exit(f());
  }
  return c.wait();
}

} // namespace

TEST_CASE("a pool reuses released cgroups and rewrites only the limits that differ") {
  cleanup_guard guard;
  {
    auto root = cgroup_root::detect();
    REQUIRE(root);
    root->enable_pool(4);
    limits lim;
    lim.memory_bytes = 32u << 20;
    lim.pids = 10;
    auto a = root->create("sandbox-a", lim);
    REQUIRE_MESSAGE(a, a.error_value().to_string());
    auto dirs = a->paths();
    REQUIRE(dirs.size() == 2);
    // Named by the pool, not by the sandbox: it outlives it.
    CHECK(dirs[0] == root->owner_dir(cgroup_controller::memory) + "/pool-0");
    CHECK(run_joined(*a, [] { return 7; }) == 7 << 8);
    CHECK(a->destroy());
    CHECK(a->empty());
    for (auto& d : dirs)
      CHECK(exists(d)); // kept
    auto st = root->pool_stats();
    CHECK(st.made == 1);
    CHECK(st.idle == 1);
    CHECK(st.reused == 0);

    // The next one with the same controllers gets it, with working join fds.
    auto b = root->create("sandbox-b", lim);
    REQUIRE(b);
    CHECK(b->paths() == dirs);
    CHECK(root->pool_stats().reused == 1);
    CHECK(root->pool_stats().idle == 0);
    CHECK(b->join_fds().size() == 2);
    CHECK(run_joined(*b, [] { return 0; }) == 0);
    CHECK(b->destroy());

    // Other limits: rewritten; memory up (memsw first) and down again.
    limits more = lim;
    more.memory_bytes = 64u << 20;
    more.pids = 20;
    auto c = root->create("sandbox-c", more);
    REQUIRE_MESSAGE(c, c.error_value().to_string());
    CHECK(c->paths() == dirs);
    CHECK(read_value(dirs[0], "memory.limit_in_bytes") == "67108864");
    CHECK(read_value(dirs[0], "memory.memsw.limit_in_bytes") == "67108864");
    CHECK(read_value(dirs[1], "pids.max") == "20");
    CHECK(c->destroy());
    limits less = lim;
    less.memory_bytes = 16u << 20;
    auto d = root->create("sandbox-d", less);
    REQUIRE_MESSAGE(d, d.error_value().to_string());
    CHECK(read_value(dirs[0], "memory.limit_in_bytes") == "16777216");
    CHECK(read_value(dirs[0], "memory.memsw.limit_in_bytes") == "16777216");
    CHECK(read_value(dirs[1], "pids.max") == "10");

    // A sandbox that was OOM-killed says so; the next one in the same cgroup
    // starts with a clean slate.
    int status = run_joined(*d, [] {
      constexpr size_t size = 64u << 20;
      auto* p = static_cast<char*>(
        ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      for (size_t i = 0; p != MAP_FAILED && i < size; i += 4096)
        p[i] = 1;
      return 0;
    });
    CHECK(WIFSIGNALED(status));
    CHECK(d->oom_killed());
    CHECK(d->destroy());
    auto e = root->create("sandbox-e", less);
    REQUIRE(e);
    CHECK(e->paths() == dirs);
    CHECK_FALSE(e->oom_killed());

    // Other controllers: another cgroup.
    limits only_pids;
    only_pids.pids = 5;
    auto f = root->create("sandbox-f", only_pids);
    REQUIRE(f);
    CHECK(f->paths().size() == 1);
    CHECK(f->paths()[0] == root->owner_dir(cgroup_controller::pids) + "/pool-1");
    CHECK(e->destroy());
    CHECK(f->destroy());
    CHECK(root->pool_stats().idle == 2);
    CHECK(root->pool_stats().discarded == 0);
  }
  // The root took its idle cgroups along.
  CHECK(leftovers().empty());
}

TEST_CASE("a pool does not keep a cgroup still charged with a writable layer's pages") {
  cleanup_guard guard;
  // /dev/shm is a tmpfs: pages written there are charged to the writer's
  // memory cgroup and stay charged while the file lives.
  std::string file = "/dev/shm/dsec-cgroup-test-" + std::to_string(::getpid());
  struct unlink_at_exit {
    std::string path;
    ~unlink_at_exit() { ::unlink(path.c_str()); }
  } unlink{file};
  {
    auto root = cgroup_root::detect();
    REQUIRE(root);
    root->enable_pool(4);
    limits lim;
    lim.memory_bytes = 64u << 20;
    auto a = root->create("writer", lim);
    REQUIRE(a);
    auto dir = a->paths()[0];
    CHECK(run_joined(*a, [&] {
      int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
      static char block[1 << 20];
      std::memset(block, 1, sizeof block);
      return fd >= 0 && ::write(fd, block, sizeof block) == static_cast<ssize_t>(sizeof block)
               ? 0
               : 1;
    }) == 0);
    // The control: the pages are charged to the cgroup.
    auto stat = slurp(dir + "/memory.stat");
    CHECK_MESSAGE(has(stat, "\nshmem 1048576\n"), stat);
    CHECK(a->destroy());
    CHECK_FALSE(exists(dir));
    CHECK(root->pool_stats().discarded == 1);
    CHECK(root->pool_stats().idle == 0);

    // A pool that is full removes what comes back.
    root->enable_pool(1);
    auto b = root->create("b", lim);
    auto c = root->create("c", lim);
    REQUIRE(b);
    REQUIRE(c);
    CHECK(b->destroy());
    CHECK(c->destroy());
    CHECK(root->pool_stats().idle == 1);
    CHECK(root->pool_stats().discarded == 2);

    // prewarm fills it up to max_idle.
    root->enable_pool(3);
    CHECK(root->prewarm(lim, 5));
    CHECK(root->pool_stats().idle == 3);
  }
  CHECK(leftovers().empty());
}

TEST_CASE("a pooled cgroup with a process still inside stays with the sandbox until it is empty") {
  cleanup_guard guard;
  {
    auto root = cgroup_root::detect();
    REQUIRE(root);
    root->enable_pool(2);
    limits lim;
    lim.pids = 10;
    auto cg = root->create("busy", lim);
    REQUIRE(cg);
    child c;
    start_joined(c, *cg);
    auto r = cg->destroy();
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == errc::in_use);
    CHECK_FALSE(cg->empty());
    CHECK(root->pool_stats().idle == 0);
    ::kill(c.pid, SIGKILL);
    c.wait();
    CHECK(cg->destroy());
    CHECK(cg->empty());
    CHECK(root->pool_stats().idle == 1);
  }
  CHECK(leftovers().empty());
}

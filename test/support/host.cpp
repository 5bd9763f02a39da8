#include "test/support/host.hpp"

#include <doctest/doctest.h>

#include "test/support/fixture.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "test/support/process.hpp"

namespace dsec::test {

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::vector<std::string> lines(const std::string& s) {
  auto v = split(s, '\n');
  if (!v.empty() && v.back().empty())
    v.pop_back();
  return v;
}

std::vector<std::string> dir_entries(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = ::opendir(path.c_str());
  if (!d)
    return out;
  while (auto* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
      out.emplace_back(e->d_name);
  }
  ::closedir(d);
  return out;
}

bool is_dir(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      int v = (s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0');
      out += static_cast<char>(v);
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

struct mount_line {
  std::string root, at, type, source, super_opts;
};

std::vector<mount_line> mountinfo() {
  std::vector<mount_line> out;
  for (const auto& l : lines(slurp("/proc/self/mountinfo"))) {
    auto f = split(l, ' ');
    size_t dash = 0;
    while (dash < f.size() && f[dash] != "-")
      ++dash;
    if (f.size() < 5 || dash + 2 >= f.size())
      continue;
    mount_line m;
    m.root = unescape(f[3]);
    m.at = unescape(f[4]);
    m.type = f[dash + 1];
    m.source = unescape(f[dash + 2]);
    m.super_opts = dash + 3 < f.size() ? f[dash + 3] : "";
    out.push_back(std::move(m));
  }
  return out;
}

// Processes that belong to another dsec on this machine: descendants of a
// process (not us) that has a dsec-spawner child. Their sandboxes come and go
// as they please.
std::set<pid_t> foreign(const std::map<pid_t, proc_entry>& table) {
  pid_t self = ::getpid();
  std::set<pid_t> out;
  for (const auto& [pid, e] : table) {
    if (e.comm != "dsec-spawner" || e.ppid == self || e.ppid <= 1)
      continue;
    auto owner = table.find(e.ppid);
    if (owner == table.end())
      continue;
    // The owner itself lives in the host's namespaces; only what it started counts.
    auto below = descendants(table, e.ppid);
    below.erase(e.ppid);
    out.insert(below.begin(), below.end());
  }
  // Never hide what we started ourselves.
  for (pid_t p : descendants(table, self))
    out.erase(p);
  return out;
}

// Is <own>/dsec/<name> the owner dir of a live process other than us and ours?
bool live_foreign_owner(const std::string& name, const std::map<pid_t, proc_entry>& table,
                        const std::set<pid_t>& ours) {
  auto dash = name.find('-');
  if (dash == std::string::npos)
    return false;
  pid_t pid = std::atoi(name.substr(0, dash).c_str());
  uint64_t start = std::strtoull(name.c_str() + dash + 1, nullptr, 10);
  auto it = table.find(pid);
  if (it == table.end() || it->second.starttime != start)
    return false; // dead: its leftovers count
  return !ours.count(pid);
}

void walk_dirs(const std::string& dir, std::set<std::string>& out) {
  for (const auto& e : dir_entries(dir)) {
    auto p = dir + "/" + e;
    if (is_dir(p)) {
      out.insert(p);
      walk_dirs(p, out);
    }
  }
}

} // namespace

std::map<pid_t, proc_entry> process_table() {
  std::map<pid_t, proc_entry> out;
  for (const auto& name : dir_entries("/proc")) {
    if (name.empty() || name[0] < '0' || name[0] > '9')
      continue;
    auto stat = slurp("/proc/" + name + "/stat");
    auto open = stat.find('(');
    auto close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos)
      continue; // gone meanwhile
    proc_entry e;
    e.pid = std::atoi(name.c_str());
    e.comm = stat.substr(open + 1, close - open - 1);
    // Fields after the comm: state(3) ppid(4) ... starttime(22).
    auto rest = split(stat.substr(close + 2), ' ');
    if (rest.size() < 20)
      continue;
    e.ppid = std::atoi(rest[1].c_str());
    e.starttime = std::strtoull(rest[19].c_str(), nullptr, 10);
    out[e.pid] = e;
  }
  return out;
}

std::set<pid_t> descendants(const std::map<pid_t, proc_entry>& table, pid_t root) {
  std::set<pid_t> out{root};
  bool grew = true;
  while (grew) {
    grew = false;
    for (const auto& [pid, e] : table)
      if (!out.count(pid) && out.count(e.ppid)) {
        out.insert(pid);
        grew = true;
      }
  }
  return out;
}

std::vector<std::string> own_cgroup_dirs() {
  std::vector<std::string> out;
  auto mounts = mountinfo();
  for (const auto& l : lines(slurp("/proc/self/cgroup"))) {
    // ID:CONTROLLERS:PATH
    auto c1 = l.find(':');
    auto c2 = l.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos)
      continue;
    auto controllers = l.substr(c1 + 1, c2 - c1 - 1);
    auto path = l.substr(c2 + 1);
    for (const auto& m : mounts) {
      bool match = false;
      if (controllers.empty()) {
        match = m.type == "cgroup2";
      } else if (m.type == "cgroup") {
        match = true;
        for (const auto& c : split(controllers, ','))
          if (("," + m.super_opts + ",").find("," + c + ",") == std::string::npos)
            match = false;
      }
      if (!match)
        continue;
      // The mount shows the hierarchy from m.root down.
      if (path.compare(0, m.root.size(), m.root) != 0)
        continue;
      auto rel = path.substr(m.root == "/" ? 0 : m.root.size());
      out.push_back(m.at + (rel == "/" ? "" : rel));
      break;
    }
  }
  return out;
}

host_snapshot host_snapshot::take() {
  host_snapshot s;
  auto mounts = mountinfo();
  s.mount_count = mounts.size();
  for (const auto& m : mounts)
    if (m.type == "erofs" || m.type == "overlay" || m.type == "tmpfs" || m.type == "nsfs")
      s.fs_mounts.insert(m.type + " " + m.source + " " + m.at);

  auto table = process_table();
  pid_t self = ::getpid();
  auto ours = descendants(table, self);
  auto others = foreign(table);
  for (const auto& dir : own_cgroup_dirs()) {
    auto base = dir + "/dsec";
    for (const auto& owner : dir_entries(base)) {
      auto p = base + "/" + owner;
      if (!is_dir(p) || live_foreign_owner(owner, table, ours))
        continue;
      s.cgroup_dirs.insert(p);
      walk_dirs(p, s.cgroup_dirs);
    }
  }
  for (const auto& [pid, e] : table) {
    if (others.count(pid))
      continue;
    char link[256];
    auto n = ::readlink(("/proc/" + std::to_string(pid) + "/ns/net").c_str(), link,
                        sizeof link - 1);
    if (n > 0)
      s.net_namespaces.insert(std::string(link, static_cast<size_t>(n)));
    if (e.ppid == self)
      s.children.insert(pid);
    if (e.comm == "dsec-init")
      s.dsec_inits.insert(pid);
  }
  s.fd_count = dir_entries("/proc/self/fd").size();
  return s;
}

std::string diff(const host_snapshot& a, const host_snapshot& b) {
  std::string out;
  auto sets = [&](const char* what, const auto& x, const auto& y) {
    for (const auto& v : x)
      if (!y.count(v)) {
        std::ostringstream ss;
        ss << v;
        out += std::string{"  gone: "} + what + " " + ss.str() + "\n";
      }
    for (const auto& v : y)
      if (!x.count(v)) {
        std::ostringstream ss;
        ss << v;
        out += std::string{"  new: "} + what + " " + ss.str() + "\n";
      }
  };
  if (a.mount_count != b.mount_count)
    out += "  mount count " + std::to_string(a.mount_count) + " -> "
           + std::to_string(b.mount_count) + "\n";
  if (a.fs_mounts != b.fs_mounts)
    sets("mount", std::set<std::string>(a.fs_mounts.begin(), a.fs_mounts.end()),
         std::set<std::string>(b.fs_mounts.begin(), b.fs_mounts.end()));
  if (a.fs_mounts.size() != b.fs_mounts.size())
    out += "  erofs/overlay/tmpfs/nsfs mounts " + std::to_string(a.fs_mounts.size()) + " -> "
           + std::to_string(b.fs_mounts.size()) + "\n";
  sets("cgroup", a.cgroup_dirs, b.cgroup_dirs);
  sets("netns", a.net_namespaces, b.net_namespaces);
  sets("child", a.children, b.children);
  sets("dsec-init", a.dsec_inits, b.dsec_inits);
  if (a.fd_count != b.fd_count)
    out += "  open fds " + std::to_string(a.fd_count) + " -> " + std::to_string(b.fd_count)
           + "\n";
  return out;
}

std::string lasting_diff(const host_snapshot& before, std::chrono::seconds safety) {
  std::string d;
  eventually([&] {
    d = diff(before, host_snapshot::take());
    return d.empty();
  }, safety);
  return d;
}

bool eventually(const std::function<bool()>& cond, std::chrono::seconds safety) {
  auto deadline = std::chrono::steady_clock::now() + safety;
  for (;;) {
    if (cond())
      return true;
    if (std::chrono::steady_clock::now() >= deadline)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

host_snapshot settled_snapshot() {
  auto r = suite::get().run({"--pids", "64"}, {"true"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  return host_snapshot::take();
}

void check_nothing_left(const host_snapshot& before) {
  auto d = lasting_diff(before);
  CHECK_MESSAGE(d.empty(), "left behind:\n" << d);
}

} // namespace dsec::test

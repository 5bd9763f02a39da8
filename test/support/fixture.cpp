#include "test/support/fixture.hpp"

#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <doctest/doctest.h>

#include "runtime/sha256.hpp"
#include "runtime/sys.hpp"

namespace dsec::test {

namespace fs = std::filesystem;

namespace {

int remove_one(const char* path, const struct stat*, int, struct FTW*) {
  ::remove(path);
  return 0;
}

// Busybox applets the base layer links to /bin/busybox.
const char* const applets[] = {
  "sh",   "ls",   "cat",   "echo", "sleep", "grep",  "true",     "false", "env",  "id",
  "kill", "ps",   "printf", "test", "mkdir", "rm",   "wc",       "head",  "tr",   "hostname",
  "pwd",  "seq",  "touch", "stat", "sha256sum", "chmod", "readlink", "uname", "whoami", "tee",
};

} // namespace

void remove_tree(const std::string& path) {
  if (path.empty() || path == "/")
    return;
  ::nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

void write_file(const std::string& path, std::string_view content, unsigned mode) {
  fs::create_directories(fs::path(path).parent_path());
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  REQUIRE_MESSAGE(fd >= 0, "cannot create " << path << ": " << std::strerror(errno));
  REQUIRE(::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()));
  ::fchmod(fd, mode);
  ::close(fd);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string sha256_of(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE_MESSAGE(fd >= 0, "cannot open " << path);
  auto hex = sha256_hex_of_file(fd);
  ::close(fd);
  REQUIRE_MESSAGE(hex, hex.error_value().to_string());
  return *hex;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == '\n') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty())
    out.push_back(cur);
  return out;
}

std::string env_path(const char* name) {
  const char* v = std::getenv(name);
  REQUIRE_MESSAGE((v && *v), "$" << std::string{name} << " is not set (run the suites with meson test)");
  return v;
}

temp_dir::temp_dir(const std::string& parent, const std::string& prefix) {
  std::string templ = parent + "/" + prefix + "-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr)
    throw std::runtime_error("mkdtemp " + templ + ": " + std::strerror(errno));
  path_ = templ;
}

temp_dir::~temp_dir() {
  remove_tree(path_);
}

// ---- the suite fixture ------------------------------------------------------

suite& suite::get() {
  static suite s;
  return s;
}

suite::suite() {
  dsec_ = env_path("DSEC_BIN");
  probe_ = env_path("DSEC_PROBE");
  env_path("DSEC_SPAWNER");
  char templ[] = "/tmp/dsec-suite-XXXXXX";
  if (::mkdtemp(templ) == nullptr)
    throw std::runtime_error(std::string{"mkdtemp: "} + std::strerror(errno));
  root_ = templ;
  state_ = root_ + "/state";

  // The janitor: removes root_ once this process is gone, however it ended.
  // It holds the read end of a pipe whose write end only we have (CLOEXEC, so
  // programs we start do not keep it open); EOF means we died or are done.
  int p[2];
  if (::pipe2(p, O_CLOEXEC) < 0)
    throw std::runtime_error("pipe2");
  janitor_ = ::fork();
  if (janitor_ == 0) {
    ::setsid(); // out of our process group: a group kill does not take it along
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT})
      ::signal(sig, SIG_IGN);
    ::dup2(p[0], 3);
    sys::close_range(4, ~0U, 0);
    for (int fd = 0; fd < 3; ++fd)
      ::close(fd);
    for (;;) {
      char c;
      auto n = ::read(3, &c, 1);
      if (n == 0 || (n < 0 && errno != EINTR))
        break;
    }
    remove_tree(root_);
    ::_exit(0);
  }
  ::close(p[0]);
  janitor_pipe_ = p[1];
  build_layers();
}

suite::~suite() {
  remove_tree(root_);
  if (janitor_pipe_ >= 0)
    ::close(janitor_pipe_);
  if (janitor_ > 0) {
    int st;
    while (::waitpid(janitor_, &st, 0) < 0 && errno == EINTR) {
    }
  }
}

void suite::build_layers() {
  // The base: busybox and the probe.
  auto base = root_ + "/src/base";
  fs::create_directories(base + "/bin");
  fs::create_directories(base + "/usr/bin");
  fs::copy_file("/bin/busybox", base + "/bin/busybox");
  for (const char* a : applets)
    fs::create_symlink("busybox", base + "/bin/" + a);
  fs::copy_file(probe_, base + "/usr/bin/probe");
  ::chmod((base + "/usr/bin/probe").c_str(), 0755);
  write_file(base + "/etc/layer-file", "base\n");
  write_file(base + "/etc/base-only", "base only\n");
  write_file(base + "/etc/passwd",
             "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n");
  write_file(base + "/etc/group", "root:x:0:\nuser:x:1000:\ndev:x:2000:user,other\n");
  fs::create_directories(base + "/root");
  fs::create_directories(base + "/home/user");
  REQUIRE(::chown((base + "/home/user").c_str(), 1000, 1000) == 0);
  build_layer("base", base_layer, base);

  build_layer("workdir", workdir_layer,
              make_tree("workdir", {{"work/marker", "workdir marker\n"},
                                    {"work/src/main.c", "int main(void) { return 0; }\n"},
                                    {"etc/layer-file", "workdir\n"}}));
  build_layer("tool", tool_a,
              make_tree("tool-a", {{"opt/ta/bin/ta", "tool a\n"}, {"etc/layer-file", "tool-a\n"}}));
  build_layer("tool", tool_b,
              make_tree("tool-b", {{"opt/tb/marker", "tool b\n"}, {"etc/layer-file", "tool-b\n"}}));
}

namespace {

// A dsec that hangs, or whose sandbox outlives it holding its output, is a
// failure whatever the test expects of it.
proc_result checked(proc_result r) {
  CHECK_FALSE_MESSAGE(r.safety_killed, r.describe());
  CHECK_FALSE_MESSAGE(r.output_left_open, r.describe());
  return r;
}

} // namespace

proc_result suite::dsec(const std::vector<std::string>& args, const spawn_options& opts) const {
  std::vector<std::string> argv{dsec_, "--state", state_};
  argv.insert(argv.end(), args.begin(), args.end());
  return checked(run_process(argv, opts));
}

std::vector<std::string> suite::run_argv(const std::vector<std::string>& options,
                                         const std::vector<std::string>& cmd) const {
  std::vector<std::string> argv{dsec_, "--state", state_, "run"};
  if (std::find(options.begin(), options.end(), "--base") == options.end()) {
    argv.emplace_back("--base");
    argv.emplace_back(base_layer);
  }
  argv.insert(argv.end(), options.begin(), options.end());
  argv.emplace_back("--");
  argv.insert(argv.end(), cmd.begin(), cmd.end());
  return argv;
}

proc_result suite::run(const std::vector<std::string>& options,
                       const std::vector<std::string>& cmd, const spawn_options& opts) const {
  return checked(run_process(run_argv(options, cmd), opts));
}

std::string suite::make_tree(const std::string& name,
                             const std::map<std::string, std::string>& files) const {
  auto dir = root_ + "/src/" + name;
  fs::create_directories(dir);
  for (const auto& [path, content] : files)
    write_file(dir + "/" + path, content);
  return dir;
}

void suite::build_layer(const std::string& kind, const std::string& ref,
                        const std::string& src) const {
  auto r = dsec({"layer", "build", "--kind", kind, ref, src});
  REQUIRE_MESSAGE(r.status == 0, "building " << ref << ": " << r.describe());
}

std::string suite::digest_of(const std::string& ref) const {
  for (const auto& l : lines_of(read_file(state_ + "/refs/" + ref)))
    if (l.rfind("digest=", 0) == 0)
      return l.substr(7);
  FAIL("no digest in the ref file of " << ref);
  return {};
}

std::string suite::blob_of(const std::string& ref) const {
  auto d = digest_of(ref);
  REQUIRE(d.rfind("sha256:", 0) == 0);
  return state_ + "/blobs/sha256/" + d.substr(7);
}

std::string suite::store_snapshot() const {
  auto ls = dsec({"layer", "ls"});
  std::string out = "layer ls: status " + std::to_string(ls.status) + "\n" + ls.out;
  std::vector<std::string> entries;
  for (const char* sub : {"blobs", "refs", "tmp", "system"}) {
    std::error_code ec;
    for (fs::recursive_directory_iterator it(state_ + "/" + sub, ec), end; !ec && it != end;
         it.increment(ec)) {
      struct stat st;
      if (::lstat(it->path().c_str(), &st) != 0)
        continue;
      entries.push_back(it->path().string() + (S_ISDIR(st.st_mode) ? " dir" : " file ")
                        + (S_ISDIR(st.st_mode) ? "" : std::to_string(st.st_size)));
    }
  }
  std::sort(entries.begin(), entries.end());
  for (const auto& e : entries)
    out += e + "\n";
  return out;
}

} // namespace dsec::test

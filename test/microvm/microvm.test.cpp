// The microVM mechanism (runtime/microvm.hpp) with the real QEMU and the real
// guest: a kernel from Debian's package and the initramfs tools/microvm-guest
// builds (cached in the build tree by the digests of its inputs), booting the
// fixture's EROFS layers (test/support/fixture.hpp) as read-only disks.
//
// Skipped when qemu-system-x86_64 is missing or the guest cannot be built (no
// kernel package). Under TCG a boot takes seconds to tens of seconds on a
// loaded box: every wait here is a safety net, never a threshold.
#include <doctest/doctest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <thread>

#include "runtime/microvm.hpp"
#include "test/microvm/guest.hpp"
#include "test/support/fixture.hpp"
#include "test/support/process.hpp"
#include "test/support/skip.hpp"

using namespace dsec;
using namespace dsec::test;

namespace {

const std::string& guest_dir() { return microvm_guest_dir(); }
bool have_guest() { return have_microvm_guest(); }

microvm_options options_for(std::vector<std::string> layers) {
  microvm_options o;
  auto g = microvm_guest::in(guest_dir());
  REQUIRE_MESSAGE(g, (g ? "" : g.error_value().message));
  o.guest = *g;
  o.layers = std::move(layers);
  o.hostname = "vm-test";
  o.memory = 128ull << 20;
  return o;
}

// QEMU processes whose parent is this test process.
std::vector<pid_t> qemu_children() {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d)
    return out;
  while (auto* e = ::readdir(d)) {
    pid_t pid = std::atoi(e->d_name);
    if (pid <= 0)
      continue;
    std::ifstream f("/proc/" + std::string(e->d_name) + "/stat");
    std::string stat;
    std::getline(f, stat);
    auto rp = stat.rfind(')');
    if (rp == std::string::npos || stat.find("(qemu-system") == std::string::npos)
      continue;
    int ppid = std::atoi(stat.c_str() + rp + 4); // ") S PPID"
    if (ppid == ::getpid())
      out.push_back(pid);
  }
  ::closedir(d);
  return out;
}

bool process_gone(pid_t pid) {
  // Safety net: a killed QEMU is reaped by its new parent; wait for that.
  for (int i = 0; i < 600; ++i) {
    if (::kill(pid, 0) != 0 && errno == ESRCH)
      return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

} // namespace

TEST_SUITE("microvm") {

TEST_CASE("a microVM boots the layers and runs commands: status, streaming, stdin, env" *
          skip_unless(have_guest(), "needs qemu-system-x86_64 and a guest kernel (tools/microvm-guest)")) {
  auto& s = suite::get();
  // Topmost first: tool b over tool a over the base, as a container stacks them.
  auto vm = microvm::boot(options_for({s.blob_of(tool_b), s.blob_of(tool_a), s.blob_of(base_layer)}));
  REQUIRE_MESSAGE(vm, (vm ? "" : vm.error_value().message));
  auto& m = **vm;
  const auto& t = m.boot_times();
  MESSAGE("accel ", std::string(to_string(m.accel())), ", boot ", t.total_ms, " ms (kernel ", t.kernel_ms,
          ", agent ", t.agent_ms, ", qemu and channel ", t.qemu_ms, "), attempts ", t.attempts);
  CHECK(t.total_ms > 0);
  CHECK(qemu_children() == std::vector<pid_t>{m.pid()});

  std::string out, err;
  std::vector<std::string> chunks;
  auto collect = [&](int stream, std::string_view b) {
    (stream == 1 ? out : err) += b;
    chunks.emplace_back(b);
  };

  {
    out.clear(); err.clear(); chunks.clear();
    INFO("exit status, both streams, the layers' files and the hostname");
    auto st = m.exec({"sh", "-c", "cat /etc/layer-file; cat /opt/ta/bin/ta >/dev/null && echo ta; "
                                  "hostname; echo oops >&2; exit 7"},
                     {}, collect);
    REQUIRE_MESSAGE(st, (st ? "" : st.error_value().message));
    CHECK(WIFEXITED(*st));
    CHECK(WEXITSTATUS(*st) == 7);
    CHECK(out == "tool-b\nta\nvm-test\n");
    CHECK(err == "oops\n");
  }
  {
    out.clear(); err.clear(); chunks.clear();
    INFO("stdin reaches the command; env and cwd are its");
    auto st = m.exec({"sh", "-c", "read a; echo got $a $FOO; pwd; cat"}, "one\ntwo\n", collect,
                     {"FOO=bar"}, "/etc");
    REQUIRE(st);
    CHECK(*st == 0);
    CHECK(out == "got one bar\n/etc\ntwo\n");
  }
  {
    out.clear(); err.clear(); chunks.clear();
    INFO("output is streamed as the command writes it, not at its end");
    auto st = m.exec({"sh", "-c", "echo first; sleep 1; echo second"}, {}, collect);
    REQUIRE(st);
    CHECK(*st == 0);
    CHECK(out == "first\nsecond\n");
    CHECK(chunks.size() >= 2); // two writes a second apart arrive as two frames
  }
  {
    out.clear(); err.clear(); chunks.clear();
    INFO("a signal ends the command's process group; its status says so");
    auto st = m.exec({"sh", "-c", "kill -TERM $$"}, {}, collect);
    REQUIRE(st);
    CHECK(WIFSIGNALED(*st));
    CHECK(WTERMSIG(*st) == SIGTERM);
  }
  {
    out.clear(); err.clear(); chunks.clear();
    INFO("a command that does not exist");
    auto st = m.exec({"/no/such/binary"}, {}, collect);
    REQUIRE_FALSE(st);
    CHECK(st.error_value().code == errc::not_found);
  }
  {
    out.clear(); err.clear(); chunks.clear();
    INFO("files in and out; the writable layer keeps them; a missing one is not_found");
    std::string big(300000, 'x');
    for (size_t i = 0; i < big.size(); i += 997)
      big[i] = static_cast<char>('a' + i % 26);
    REQUIRE(m.put_file("/tmp/big", big, 0600));
    auto st = m.exec({"sh", "-c", "wc -c < /tmp/big; stat -c %a /tmp/big"}, {}, collect);
    REQUIRE(st);
    CHECK(out == "300000\n600\n");
    auto back = m.get_file("/tmp/big");
    REQUIRE(back);
    CHECK(*back == big);
    auto base = m.get_file("/etc/base-only");
    REQUIRE(base);
    auto missing = m.get_file("/no/such/file");
    REQUIRE_FALSE(missing);
    CHECK(missing.error_value().code == errc::not_found);
    // Writing over a file of a read-only layer copies it up; the layer is unchanged.
    REQUIRE(m.put_file("/etc/layer-file", "changed\n"));
    auto changed = m.get_file("/etc/layer-file");
    REQUIRE(changed);
    CHECK(*changed == "changed\n");
  }

  pid_t pid = m.pid();
  vm->reset(); // destroy
  CHECK(process_gone(pid));
  CHECK(qemu_children().empty());
}

TEST_CASE("a bad kernel fails the boot with QEMU's reason; nothing is left" *
          skip_unless(have_guest(), "needs qemu-system-x86_64 and a guest kernel (tools/microvm-guest)")) {
  auto& s = suite::get();
  auto dir = s.scratch();
  write_file(dir / "vmlinux", std::string(4096, 'Z'));
  auto o = options_for({s.blob_of(base_layer)});
  o.guest.kernel = dir / "vmlinux";
  auto vm = microvm::boot(o);
  REQUIRE_FALSE(vm);
  CHECK(vm.error_value().code == errc::sandbox_failed);
  CHECK(vm.error_value().message.find("QEMU exited") != std::string::npos);
  CHECK(qemu_children().empty());
}

TEST_CASE("a layer that is not EROFS: the guest says which mount failed; nothing is left" *
          skip_unless(have_guest(), "needs qemu-system-x86_64 and a guest kernel (tools/microvm-guest)")) {
  auto& s = suite::get();
  auto dir = s.scratch();
  write_file(dir / "junk.img", std::string(1 << 20, '\0'));
  auto vm = microvm::boot(options_for({dir / "junk.img"}));
  REQUIRE_FALSE(vm);
  CHECK(vm.error_value().code == errc::sandbox_failed);
  CHECK_MESSAGE(vm.error_value().message.find("erofs") != std::string::npos,
                vm.error_value().message);
  CHECK(qemu_children().empty());
}

TEST_CASE("bad options are refused before QEMU starts, naming what is wrong") {
  microvm_options o;
  CHECK(microvm::boot(o).error_value().message.find("no layers") != std::string::npos);
  o.layers.assign(8, "/nonexistent");
  CHECK(microvm::boot(o).error_value().message.find("at most 7") != std::string::npos);
  o.layers = {"/nonexistent"};
  o.memory = 1 << 20;
  CHECK(microvm::boot(o).error_value().message.find("below 64 MiB") != std::string::npos);
  o.memory = 128 << 20;
  o.hostname = "a b";
  CHECK(microvm::boot(o).error_value().message.find("hostname") != std::string::npos);
  o.hostname = "ok";
  auto e = microvm::boot(o);
  CHECK(e.error_value().code == errc::not_found);
  CHECK(e.error_value().message.find("/nonexistent") != std::string::npos);
}

TEST_CASE("kill -9 of the process that owns a microVM: QEMU dies with it" *
          skip_unless(have_guest(), "needs qemu-system-x86_64 and a guest kernel (tools/microvm-guest)")) {
  auto& s = suite::get();
  auto opts = options_for({s.blob_of(base_layer)});
  int p[2];
  REQUIRE(::pipe(p) == 0);
  pid_t owner = ::fork();
  REQUIRE(owner >= 0);
  if (owner == 0) {
    ::close(p[0]);
    auto vm = microvm::boot(opts);
    pid_t qpid = vm ? (*vm)->pid() : -1;
    (void)!::write(p[1], &qpid, sizeof qpid);
    for (;;)
      ::pause(); // until SIGKILL
  }
  ::close(p[1]);
  pid_t qpid = -1;
  REQUIRE(::read(p[0], &qpid, sizeof qpid) == sizeof qpid);
  ::close(p[0]);
  REQUIRE(qpid > 0);
  ::kill(owner, SIGKILL);
  int st;
  ::waitpid(owner, &st, 0);
  CHECK(process_gone(qpid));
}

TEST_CASE("QEMU runs in a cgroup of its own, bounded by the guest's size; it goes with the VM" *
          skip_unless(have_guest(), "needs qemu-system-x86_64 and a guest kernel (tools/microvm-guest)")) {
  auto& s = suite::get();
  auto root = cgroup_root::detect();
  REQUIRE_MESSAGE(root, (root ? "" : root.error_value().message));
  auto o = options_for({s.blob_of(base_layer)});
  o.cgroups = &*root;
  o.cgroup_name = "vm-cgroup-test-" + std::to_string(::getpid());
  auto vm = microvm::boot(o);
  REQUIRE_MESSAGE(vm, (vm ? "" : vm.error_value().message));
  auto paths = (*vm)->cgroup_paths();
  REQUIRE(!paths.empty());
  auto read = [](const std::string& path) {
    std::ifstream f(path);
    std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return all;
  };
  bool memory_seen = false;
  for (const auto& p : paths) {
    INFO(p);
    // QEMU is in it, with every thread of it.
    auto procs = read(p + "/cgroup.procs");
    CHECK(procs == std::to_string((*vm)->pid()) + "\n");
    for (const char* f : {"/memory.max", "/memory.limit_in_bytes"})
      if (std::ifstream(p + f)) {
        memory_seen = true;
        CHECK(std::stoull(read(p + f)) == o.memory + microvm_options::qemu_overhead);
      }
  }
  CHECK(memory_seen);
  // The VM runs in it.
  std::string out;
  auto st = (*vm)->exec({"echo", "bounded"}, {}, [&](int, std::string_view b) { out += b; });
  REQUIRE_MESSAGE(st, (st ? "" : st.error_value().message));
  CHECK(out == "bounded\n");
  vm->reset();
  for (const auto& p : paths)
    CHECK_MESSAGE(::access(p.c_str(), F_OK) != 0, p << " is left");
}

} // TEST_SUITE

// The tools agents use on their own programs keep working in a sandbox: strace
// and gdb, run and attached to a process of the same sandbox. They come from
// the host (tools/setup installs them) in a tool layer with their libraries.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <string>

#include "runtime/security.hpp"
#include "test/support/fixture.hpp"
#include "test/support/sandbox.hpp"
#include "test/support/skip.hpp"

using namespace dsec::test;

namespace {

// Builds tool layer dbg@1 from the host's strace and gdb, their shared
// libraries and what gdb loads at start (its Python and data files).
void build_debugger_layer() {
  static bool built = false;
  if (built)
    return;
  auto& s = suite::get();
  auto dir = s.root() + "/src/dbg";
  auto r = run_process({"/bin/sh", "-c",
                        R"sh(set -e
dir=$1
mkdir -p "$dir"
for bin in /usr/bin/strace /usr/bin/gdb; do
  [ -x "$bin" ] || { echo "$bin is missing (tools/setup installs it)"; exit 1; }
  cp --parents "$bin" "$dir"
  for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do cp -L --parents "$lib" "$dir"; done
done
py=$(ldd /usr/bin/gdb | grep -o 'libpython[0-9.]*' | head -1 | sed 's/^lib//; s/\.$//')
mkdir -p "$dir/usr/lib" "$dir/usr/share"
[ -n "$py" ] && cp -a "/usr/lib/$py" "$dir/usr/lib/"
[ -d /usr/share/gdb ] && cp -a /usr/share/gdb "$dir/usr/share/"
true)sh",
                        "sh", dir});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  s.build_layer("tool", "dbg@1", dir);
  built = true;
}

} // namespace

TEST_CASE("strace runs a command and attaches to a running process") {
  build_debugger_layer();
  auto& s = suite::get();
  auto r = s.run({"--tool", "dbg@1"},
                 {"sh", "-c",
                  "strace -f -o /tmp/trace probe exit 0 && grep -c execve /tmp/trace; "
                  "sleep 30 & sleep 0.2; "
                  "strace -p $! -e trace=none -o /tmp/attach & s=$!; sleep 0.5; kill $s; wait $s; "
                  "echo strace-detached"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out.rfind("1\n", 0) == 0);
  CHECK(r.err.find("attached") != std::string::npos);
  CHECK(r.out.find("strace-detached") != std::string::npos);
}

TEST_CASE("gdb runs a program to a breakpoint and attaches to a running process") {
  build_debugger_layer();
  auto& s = suite::get();
  auto r = s.run({"--tool", "dbg@1"},
                 {"sh", "-c",
                  "gdb -q -batch -ex 'break main' -ex run -ex bt -ex continue "
                  "--args /usr/bin/probe exit 0 2>&1; "
                  "sleep 30 & sleep 0.2; gdb -q -batch -p $! -ex 'info proc' 2>&1; "
                  "gdb -q -batch -p 1 2>&1 | grep -c 'ptrace: Operation not permitted'"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK_MESSAGE(r.out.find("Breakpoint 1, ") != std::string::npos, r.out);
  CHECK_MESSAGE(r.out.find("#0  main") != std::string::npos, r.out);
  CHECK_MESSAGE(r.out.find("exited normally") != std::string::npos, r.out);
  CHECK_MESSAGE(r.out.find("exe = '/bin/busybox'") != std::string::npos, r.out);
  // The sandbox's init stays out of reach (not dumpable).
  CHECK_MESSAGE(r.out.substr(r.out.size() - 2) == "1\n", r.out);
}

TEST_CASE("in a Chronus sandbox gdb attaches to the agent's processes, not to trusted ones"
          * skip_unless(landlock_scoping(),
                        "gdb in a Chronus sandbox: no Landlock ABI 6, so no Chronus sandbox")) {
  build_debugger_layer();
  api_env env({"dbg@1", base_layer});
  dsec::container_options opts;
  opts.chronus = true;
  auto c = env.create(opts);
  // A trusted command that prints its pid and sleeps.
  dsec::command t;
  t.argv = {"sh", "-c", "echo $$; exec sleep 1000"};
  t.env = dsec::command::default_env();
  t.trusted = true;
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  auto id = c->exec(t, dsec::stdio{-1, out[1], -1});
  ::close(out[1]);
  REQUIRE_MESSAGE(id, id.error_value().to_string());
  std::string pid;
  char ch;
  pollfd p{out[0], POLLIN, 0};
  while (::poll(&p, 1, 60'000) == 1 && ::read(out[0], &ch, 1) == 1 && ch != '\n') // safety only
    pid += ch;
  ::close(out[0]);
  REQUIRE_FALSE(pid.empty());

  auto r = exec_capture(*c, {"sh", "-c",
                             "sleep 1000 & gdb -q -batch -p $! -ex 'info proc' 2>&1; "
                             "gdb -q -batch -p " + pid
                               + " 2>&1 | grep -c 'ptrace: Operation not permitted'"});
  CHECK_MESSAGE(r.out.find("cmdline = ") != std::string::npos, r.out);
  CHECK_MESSAGE(r.out.substr(r.out.size() - 2) == "1\n", r.out);
}

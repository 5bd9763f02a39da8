// What a sandbox can see: not the host's files or processes, not other
// sandboxes, and its layers only through its own private upper layer.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/proc_mask.hpp"
#include "runtime/security.hpp"
#include "test/support/fixture.hpp"
#include "test/support/sandbox.hpp"
#include "test/support/skip.hpp"

using namespace dsec::test;

TEST_CASE("the host's files are invisible") {
  auto& s = suite::get();
  // A marker on the host, in a place a sandbox has too.
  temp_dir marker_dir{"/tmp", "dsec-host-marker"};
  write_file(marker_dir / "secret", "host secret\n");
  REQUIRE(std::filesystem::exists("/etc/hostname"));
  auto marker_name = marker_dir.path().substr(5); // below /tmp/

  auto r = s.run({}, {"sh", "-c",
                      "probe cat " + marker_dir.path() + "/secret; probe ls " + marker_dir.path()
                        + "; probe ls /tmp; probe cat /etc/hostname; probe ls " + s.state()
                        + "; probe ls " + s.root() + "; probe cat /etc/base-only"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  // /tmp is there but empty; the base layer's own files are the control.
  CHECK(r.out == "ENOENT\nENOENT\nENOENT\nENOENT\nENOENT\nbase only\n");
  CHECK(r.out.find(marker_name) == std::string::npos);

  // Not through /proc either: the mount table names no host path, and the
  // root directory's parent is the root itself.
  r = s.run({}, {"sh", "-c", "probe cat /proc/self/mountinfo; probe ls /proc/1/root; probe ls /.."});
  REQUIRE(r.status == 0);
  CHECK(r.out.find(s.root()) == std::string::npos);
  CHECK(r.out.find("/tmp/") == std::string::npos);
  auto root_ls = s.run({}, {"probe", "ls", "/"});
  CHECK(r.out.find(root_ls.out) != std::string::npos);
}

TEST_CASE("host processes are invisible") {
  auto& s = suite::get();
  auto r = s.run({}, {"probe", "pids"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  // Only its own init and itself.
  CHECK(r.out == "1 dsec-init\n2 probe\n");

  auto me = std::to_string(::getpid());
  r = s.run({}, {"sh", "-c", "probe alive " + me + "; probe kill " + me + " TERM; probe ptrace " + me});
  CHECK(r.out == "ESRCH\nESRCH\nESRCH\n");
}

TEST_CASE("two sandboxes of two dsec runs cannot see or reach each other") {
  auto& s = suite::get();
  for (bool net : {false, true}) {
    CAPTURE(net);
    std::vector<std::string> opts;
    if (net)
      opts.emplace_back("--net");
    background a(s.run_argv(
      opts, {"sh", "-c",
             "probe write /tmp/a-secret s >/dev/null && probe abstract-listen dsec-a >/dev/null "
             "&& probe tcp-listen 7000 >/dev/null && echo ready && exec sleep 1000"}));
    REQUIRE_MESSAGE(a.wait_for_output("ready\n"), a.err());

    auto b = s.run(opts, {"sh", "-c",
                          "probe ls /tmp; probe pids; probe abstract-connect dsec-a; "
                          "probe tcp-connect 7000"});
    REQUIRE_MESSAGE(b.status == 0, b.describe());
    auto l = lines_of(b.out);
    REQUIRE(l.size() == 5);
    CHECK(l[0] == "1 dsec-init"); // /tmp is empty: no a-secret line
    CHECK(l[1] == "2 sh");
    CHECK(l[2] == "4 probe"); // after the probe that listed /tmp
    CHECK(l[3] == "ECONNREFUSED"); // another network namespace, its own abstract sockets
    CHECK(l[4] == (net ? "ECONNREFUSED" : "ENETUNREACH"));

    a.kill(SIGTERM);
    CHECK(a.wait().status == 143);
  }
}

TEST_CASE("sandboxes of one zygote have separate empty networks and cannot reach each other") {
  // Without --net each sandbox gets a network namespace of its own from the
  // zygote's pool, with nothing up: abstract socket names are private to it
  // (Landlock's scoping of abstract sockets stays as a second wall).
  api_env env({base_layer});
  auto a = env.create();
  auto b = env.create();

  auto r = exec_capture(*a, {"probe", "abstract-listen", "dsec-shared"});
  REQUIRE_MESSAGE(r.status.code == 0, r.out);
  CHECK(r.out == "listening\n");
  // The control: from inside A, the socket works.
  r = exec_capture(*a, {"probe", "abstract-connect", "dsec-shared"});
  CHECK(r.out == "ok hello\n");
  // From B, the name is not there at all.
  r = exec_capture(*b, {"probe", "abstract-connect", "dsec-no-such-name"});
  CHECK(r.out == "ECONNREFUSED\n");
  r = exec_capture(*b, {"probe", "abstract-connect", "dsec-shared"});
  CHECK(r.out == "ECONNREFUSED\n");

  // TCP: the loopback is down, for everyone.
  r = exec_capture(*a, {"probe", "tcp-listen", "7001"});
  CHECK(r.out == "listening\n");
  r = exec_capture(*b, {"probe", "tcp-connect", "7001"});
  CHECK(r.out == "ENETUNREACH\n");
  r = exec_capture(*a, {"probe", "tcp-connect", "7001"});
  CHECK(r.out == "ENETUNREACH\n");

  // B sees none of A's processes (A's listeners are still running) and none of
  // its files; nor can it signal them.
  r = exec_capture(*a, {"probe", "write", "/tmp/a-file", "x"});
  CHECK(r.out == "ok\n");
  r = exec_capture(*b, {"probe", "pids"});
  auto b_pids = lines_of(r.out);
  REQUIRE(b_pids.size() == 2); // init and itself
  CHECK(b_pids[0] == "1 dsec-init");
  CHECK(b_pids[1].find(" probe") != std::string::npos);
  r = exec_capture(*a, {"probe", "pids"});
  CHECK(lines_of(r.out).size() == 4); // init, two listeners, itself
  r = exec_capture(*b, {"probe", "cat", "/tmp/a-file"});
  CHECK(r.out == "ENOENT\n");

  SUBCASE("with --net each has its own loopback") {
    dsec::container_options net;
    net.net = true;
    auto c = env.create(net);
    auto d = env.create(net);
    r = exec_capture(*c, {"probe", "tcp-listen", "7002"});
    CHECK(r.out == "listening\n");
    r = exec_capture(*c, {"probe", "tcp-connect", "7002"});
    CHECK(r.out == "ok hello\n");
    r = exec_capture(*d, {"probe", "tcp-connect", "7002"});
    CHECK(r.out == "ECONNREFUSED\n");
    r = exec_capture(*d, {"probe", "abstract-connect", "dsec-shared"});
    CHECK(r.out == "ECONNREFUSED\n");
  }
}

TEST_CASE("layers cannot be written") {
  auto& s = suite::get();
  std::vector<std::string> blobs;
  for (const char* ref : {base_layer, workdir_layer, tool_a})
    blobs.push_back(s.blob_of(ref));
  std::vector<std::string> before;
  for (const auto& b : blobs)
    before.push_back(sha256_of(b));
  CHECK("sha256:" + before[0] == s.digest_of(base_layer));

  auto r = s.run({"--workdir", workdir_layer, "--tool", tool_a},
                 {"sh", "-c",
                  "probe write /etc/base-only overwritten; probe cat /etc/base-only; echo; "
                  "probe write /work/marker overwritten; probe write /opt/ta/bin/ta overwritten; "
                  "probe remount /; probe umount /; probe mount"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto l = lines_of(r.out);
  REQUIRE(l.size() == 7);
  CHECK(l[0] == "ok"); // into the upper layer
  CHECK(l[1] == "overwritten");
  CHECK(l[2] == "ok");
  CHECK(l[3] == "ok");
  CHECK(l[4] == "EPERM"); // no remount read-write
  CHECK(l[5] == "EPERM");
  CHECK(l[6] == "EPERM");

  // The images are untouched, and the next sandbox sees the originals.
  for (size_t i = 0; i < blobs.size(); ++i)
    CHECK(sha256_of(blobs[i]) == before[i]);
  r = s.run({"--workdir", workdir_layer, "--tool", tool_a},
            {"sh", "-c", "probe cat /etc/base-only; probe cat /work/marker; probe cat /opt/ta/bin/ta"});
  CHECK(r.out == "base only\nworkdir marker\ntool a\n");
}

TEST_CASE("kernel-wide files and devices are out of reach") {
  auto& s = suite::get();
  auto r = s.run({}, {"sh", "-c",
                      "probe write /proc/sys/kernel/core_pattern x; "
                      "probe write /proc/sys/vm/drop_caches 3; "
                      "probe write /proc/sys/kernel/hostname other; "
                      "probe write /proc/self/oom_score_adj -1000; "
                      "probe write /proc/1/oom_score_adj 1000; "
                      "probe cat /proc/1/environ; probe cat /proc/kmsg; "
                      "probe write /proc/sysrq-trigger h | grep -v '^ok$' >/dev/null && echo denied"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  // /proc/sys is mounted read-only (EROFS); the rest is not ours (EACCES).
  CHECK(r.out == "EROFS\nEROFS\nEROFS\nEACCES\nEACCES\nEACCES\nEACCES\ndenied\n");
  // No sysfs at all, and only the harmless devices.
  r = s.run({}, {"sh", "-c", "probe ls /sys; echo --; probe ls /dev; probe cat /dev/mem"});
  CHECK(r.out == "--\nfd\nfull\nnull\nptmx\npts\nrandom\nshm\nstderr\nstdin\nstdout\ntty\n"
                 "urandom\nzero\nENOENT\n");
}

// Sandboxes without --net each get a network namespace of their own from the
// zygote's pool (recycled after the sandbox ends), so two sandboxes of one
// zygote can bind the same TCP port and the same abstract socket name.
TEST_CASE("sandboxes of one zygote do not share port and socket names") {
  api_env env({base_layer});
  auto a = env.create();
  auto b = env.create();
  CHECK(exec_capture(*a, {"probe", "tcp-listen", "7003"}).out == "listening\n");
  CHECK(exec_capture(*b, {"probe", "tcp-listen", "7003"}).out == "listening\n");
  CHECK(exec_capture(*a, {"probe", "abstract-listen", "dsec-squat"}).out == "listening\n");
  CHECK(exec_capture(*b, {"probe", "abstract-listen", "dsec-squat"}).out == "listening\n");
}

// ---- Chronus: trusted commands --------------------------------------------------

namespace {

// A deadline for waits that should end: a safety net against a hung suite,
// never a pass/fail threshold.
std::chrono::steady_clock::time_point safety() {
  return std::chrono::steady_clock::now() + std::chrono::seconds(120);
}

// A command that prints its pid and then sleeps, started in `c`; its stdout
// stays open until it ends.
struct holder {
  uint64_t id = 0;
  std::string pid;
};

holder start_holder(dsec::container& c, bool trusted, const std::string& secret) {
  dsec::command cmd;
  cmd.argv = {"sh", "-c", "echo $$; exec probe sleep"};
  cmd.env = dsec::command::default_env();
  cmd.env.push_back(secret);
  cmd.trusted = trusted;
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  auto id = c.exec(cmd, dsec::stdio{-1, out[1], -1});
  ::close(out[1]);
  if (!id)
    ::close(out[0]);
  REQUIRE_MESSAGE(id, id.error_value().to_string());
  std::string line;
  char ch;
  pollfd p{out[0], POLLIN, 0};
  while (::poll(&p, 1, 60'000) == 1 && ::read(out[0], &ch, 1) == 1 && ch != '\n') // safety only
    line += ch;
  ::close(out[0]);
  REQUIRE(!line.empty());
  return {*id, line};
}

// Runs a shell line in `c`, as a trusted command or not; its stdout and stderr.
std::string shell(dsec::container& c, const std::string& script, bool trusted = false) {
  dsec::command cmd;
  cmd.argv = {"sh", "-c", script};
  cmd.env = dsec::command::default_env();
  cmd.trusted = trusted;
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  auto id = c.exec(cmd, dsec::stdio{-1, out[1], out[1]});
  ::close(out[1]);
  if (!id)
    ::close(out[0]);
  REQUIRE_MESSAGE(id, id.error_value().to_string());
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof buf)) > 0) // until every writer is gone
    text.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  auto st = c.wait(*id, safety());
  REQUIRE_MESSAGE(st, st.error_value().to_string());
  return text;
}

// What another process of the sandbox can do to `pid`, one line each: read its
// environment (the secret's line, or the errno), open its stdin through
// /proc/PID/fd ("opened" or the errno), read its memory (EIO once open: there
// is nothing at address 0), ptrace attach, kill -0, pidfd_getfd of its stdout,
// and send it `sig`.
std::string reach(const std::string& pid, const char* sig) {
  return "probe cat /proc/" + pid + "/environ | tr '\\0' '\\n' | grep -e '^DSEC_TEST_SECRET=' "
         "-e '^E[A-Z]*$'; "
         "probe cat /proc/" + pid + "/fd/0 && echo opened; probe cat /proc/" + pid + "/mem; "
         "probe ptrace " + pid + "; probe alive " + pid + "; probe getfd " + pid + " 1; "
         "probe kill " + pid + " " + sig;
}

} // namespace

TEST_CASE("Chronus: without Landlock ABI 6 a Chronus sandbox is refused, not weakened"
          * skip_unless(!landlock_scoping(), "the refusal of Chronus without Landlock ABI 6: "
                                             "this kernel has it")) {
  // Without Landlock's scoping there would be no wall between the agent and
  // trusted commands: refused.
  api_env env({base_layer});
  dsec::container_options opts;
  opts.chronus = true;
  auto c = dsec::container::create(env.sp(), env.lowers(), opts, nullptr);
  REQUIRE_FALSE(c);
  CHECK(c.error_value().code == dsec::errc::unsupported);
}

TEST_CASE("Chronus: the agent's commands cannot ptrace, read or signal trusted ones"
          * skip_unless(landlock_scoping(), "the Chronus wall between agent and trusted "
                                            "commands: no Landlock ABI 6 on this kernel")) {
  api_env env({base_layer});
  dsec::container_options opts;
  opts.chronus = true;
  auto c = env.create(opts);
  const std::string secret = "DSEC_TEST_SECRET=s3cr3t-" + std::to_string(::getpid());
  auto trusted = start_holder(*c, true, secret);
  auto agent = start_holder(*c, false, secret); // the control: the agent's own

  // From an untrusted command, as the same uid (root): nothing works on the
  // trusted one. The signal would kill it; it is still there below.
  auto out = shell(*c, reach(trusted.pid, "KILL"));
  CHECK(out == "EACCES\nEACCES\nEACCES\nEPERM\nEPERM\nEPERM\nEPERM\n");
  // Nor on the helper that starts them (pid 2).
  auto ps = shell(*c, "probe pids");
  CHECK(ps.find("\n2 dsec-trusted\n") != std::string::npos);
  out = shell(*c, "probe ptrace 2; probe alive 2; probe cat /proc/2/environ");
  CHECK(out == "EPERM\nEPERM\nEACCES\n");

  // The control: the same on another untrusted command all works, as gdb and
  // strace need.
  out = shell(*c, reach(agent.pid, "CONT"));
  CHECK(out == secret + "\nopened\nEIO\nok\nok\nok\nok\n");

  // A trusted command sees into the agent's (but not the other way round).
  out = shell(*c, reach(agent.pid, "CONT"), true);
  CHECK(out == secret + "\nopened\nEIO\nok\nok\nok\nok\n");
  out = shell(*c, reach(trusted.pid, "CONT"), true);
  CHECK(out == secret + "\nopened\nEIO\nok\nok\nok\nok\n");

  // The agent's KILL did not land: the host's TERM ends it.
  REQUIRE(c->signal(trusted.id, SIGTERM));
  auto st = c->wait(trusted.id, safety());
  REQUIRE_MESSAGE(st, st.error_value().to_string());
  CHECK(st->signal == SIGTERM);
  // The agent's own KILL does land on its own command.
  shell(*c, "probe kill " + agent.pid + " KILL");
  st = c->wait(agent.id, safety());
  REQUIRE_MESSAGE(st, st.error_value().to_string());
  CHECK(st->signal == SIGKILL);
}

TEST_CASE("Chronus: a sandbox without it is unchanged (no helper, no nested domain)") {
  // The agent's commands and everything else: as in the tests above. Here only
  // what a Chronus sandbox would change.
  api_env env({base_layer});
  auto c = env.create();
  const std::string secret = "DSEC_TEST_SECRET=plain-" + std::to_string(::getpid());
  auto a = start_holder(*c, false, secret);
  auto ps = shell(*c, "probe pids");
  CHECK(ps.find("1 dsec-init\n2 probe\n") == 0);
  CHECK(ps.find("dsec-trusted") == std::string::npos);
  CHECK(shell(*c, reach(a.pid, "CONT")) == secret + "\nopened\nEIO\nok\nok\nok\nok\n");
}

TEST_CASE("the host's /proc files are masked and its kernel knobs read-only") {
  auto& s = suite::get();
  // The host's kernel command line names its boot setup (here the VM's vsock
  // ports, for one): the control that there is something to hide.
  auto host_cmdline = read_file("/proc/cmdline");
  REQUIRE_FALSE(host_cmdline.empty());
  auto r = s.run({}, {"sh", "-c",
                      "probe cat /proc/cmdline; echo \"cmdline $?\"; probe cat /proc/keys; "
                      "echo \"keys $?\"; probe ls /proc/acpi; echo \"acpi $?\"; "
                      "probe write /proc/cmdline x; probe write /proc/irq/default_smp_affinity 1; "
                      "probe write /proc/sys/kernel/hostname x; probe write /proc/keys x; "
                      "probe umount /proc/cmdline; probe umount /proc/sys"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out.find(host_cmdline.substr(0, host_cmdline.find(' '))) == std::string::npos);
  auto l = lines_of(r.out);
  REQUIRE(l.size() == 9);
  CHECK(l[0] == "cmdline 0"); // readable, and empty
  CHECK(l[1] == "keys 0");
  CHECK(l[2] == "acpi 0");
  CHECK(l[3] == "EROFS"); // the shared empty file cannot carry anything across sandboxes
  CHECK(l[4] == "EROFS");
  CHECK(l[5] == "EROFS");
  CHECK(l[6] == "EROFS");
  CHECK(l[7] == "EPERM");
  CHECK(l[8] == "EPERM");

  // Each path of the list that this kernel has is a mount of its own: the
  // masks from dsec's read-only tmpfs, the rest read-only binds of /proc.
  auto mi = s.run({}, {"probe", "cat", "/proc/self/mountinfo"});
  REQUIRE(mi.status == 0);
  auto mounts = lines_of(mi.out);
  auto mount_at = [&](const std::string& where) -> std::string {
    for (const auto& m : mounts)
      if (m.find(" " + where + " ") != std::string::npos)
        return m;
    return {};
  };
  for (const auto& m : dsec::proc_masks) {
    std::string name = m.name;
    CAPTURE(name);
    auto line = mount_at("/proc/" + name);
    if (!std::filesystem::exists("/proc/" + name)) {
      CHECK(line.empty());
      continue;
    }
    REQUIRE_FALSE(line.empty());
    CHECK(line.find(" ro,") != std::string::npos);
    if (m.kind == dsec::proc_mask_kind::read_only)
      CHECK(line.find(" - proc ") != std::string::npos);
    else
      CHECK(line.find(" - tmpfs dsec-mask ro,") != std::string::npos);
  }
  CHECK_FALSE(mount_at("/proc/cmdline").empty());
  CHECK_FALSE(mount_at("/proc/sys").empty());
  // What a sandbox needs from /proc still works.
  r = s.run({}, {"sh", "-c", "probe write /proc/self/comm renamed && head -1 /proc/meminfo"});
  CHECK_MESSAGE(r.out.rfind("ok\nMemTotal:", 0) == 0, r.describe());
}

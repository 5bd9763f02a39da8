// The microvm backend through the actors (actors/microvm_sandbox.hpp): an
// embedded daemon whose node offers "microvm" (daemon_options::microvm), driven
// through dsec::client like a trainer: create, exec (status, streaming, stdin),
// TTL, destroy, a failing boot; the node's stats advertise the backend and its
// own capacity. Nothing is left: no QEMU process after any of them.
//
// The cases that are not about a VM as such (exec, process handles, files,
// TTL) are written once and registered for each backend (BACKEND_CASE): the
// container backend's behaviour is what the microVM must match.
//
// Skipped without qemu or a guest (test/microvm/guest.hpp). Waits are safety
// nets with generous caps, never thresholds.
#include <doctest/doctest.h>

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "test/actors/common.hpp"
#include "test/microvm/guest.hpp"
#include "test/support/fixture.hpp"
#include "test/support/host.hpp"
#include "test/support/tar_builder.hpp"
#include "test/support/skip.hpp"

using namespace dsec;
using namespace dsec::test;
using namespace std::chrono_literals;

namespace {

// QEMU processes that are descendants' children of this process (its worker
// threads fork them: their parent is this process).
size_t qemu_processes() {
  size_t n = 0;
  DIR* d = ::opendir("/proc");
  if (!d)
    return 0;
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
    if (std::atoi(stat.c_str() + rp + 4) == ::getpid())
      ++n;
  }
  ::closedir(d);
  return n;
}

// The cgroup lines of the QEMU children of this process (/proc/PID/cgroup).
std::vector<std::string> qemu_cgroups() {
  std::vector<std::string> out;
  DIR* d = ::opendir("/proc");
  if (!d)
    return out;
  while (auto* e = ::readdir(d)) {
    if (std::atoi(e->d_name) <= 0)
      continue;
    std::ifstream f("/proc/" + std::string(e->d_name) + "/stat");
    std::string stat;
    std::getline(f, stat);
    auto rp = stat.rfind(')');
    if (rp == std::string::npos || stat.find("(qemu-system") == std::string::npos
        || std::atoi(stat.c_str() + rp + 4) != ::getpid())
      continue;
    std::ifstream c("/proc/" + std::string(e->d_name) + "/cgroup");
    for (std::string line; std::getline(c, line);)
      out.push_back(line);
  }
  ::closedir(d);
  return out;
}

// Whether the QEMU child of this process is frozen, by the cgroup its freezer
// put it in: v1's freezer.state, or v2's cgroup.events. nullopt: no QEMU, or
// no freezer line.
std::optional<bool> qemu_frozen() {
  for (const auto& line : qemu_cgroups()) {
    auto at = line.find(":freezer:");
    if (at != std::string::npos) {
      std::ifstream f("/sys/fs/cgroup/freezer" + line.substr(at + 9) + "/freezer.state");
      std::string st;
      std::getline(f, st);
      if (!st.empty())
        return st == "FROZEN";
    }
  }
  for (const auto& line : qemu_cgroups())
    if (line.rfind("0::", 0) == 0 && line.size() > 3) {
      std::ifstream f("/sys/fs/cgroup" + line.substr(3) + "/cgroup.events");
      for (std::string l; std::getline(f, l);)
        if (l.rfind("frozen ", 0) == 0)
          return l == "frozen 1";
    }
  return std::nullopt;
}

// The contents of file `name` in tar archive `tar`; nullopt if it has none.
std::optional<std::string> file_in_tar(const std::string& tar, const std::string& name) {
  std::unique_ptr<struct archive, int (*)(struct archive*)> a{archive_read_new(),
                                                              archive_read_free};
  archive_read_support_format_tar(a.get());
  if (archive_read_open_memory(a.get(), tar.data(), tar.size()) != ARCHIVE_OK)
    return std::nullopt;
  struct archive_entry* e = nullptr;
  while (archive_read_next_header(a.get(), &e) == ARCHIVE_OK) {
    if (name != archive_entry_pathname(e))
      continue;
    std::string out;
    char buf[65536];
    for (la_ssize_t n; (n = archive_read_data(a.get(), buf, sizeof buf)) > 0;)
      out.append(buf, static_cast<size_t>(n));
    return out;
  }
  return std::nullopt;
}

bool eventually_no_qemu() {
  for (int i = 0; i < 600; ++i) {
    if (qemu_processes() == 0)
      return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

daemon_options vm_daemon(const std::string& guest) {
  daemon_options o;
  o.state_dir = actor_layers();
  if (!guest.empty()) {
    microvm_node_config m;
    m.slots = 2;
    m.guest_dir = guest;
    o.microvm = m;
  }
  return o;
}

environment vm_env(const std::string& backend = "microvm") {
  environment env;
  env.base = base_layer; // bb@1 (busybox)
  env.tools = {tool_a};
  env.backend = backend;
  env.memory = 128ull << 20;
  return env;
}

// Nothing of the backend's is left: for a microVM, no QEMU.
bool eventually_nothing_left(const std::string& backend) {
  return backend != "microvm" || eventually_no_qemu();
}

// A case written once, registered for the container backend and (when this
// machine can boot one) the microVM backend: `fn(backend)`.
#define BACKEND_CASE(title, fn)                                                                  \
  TEST_CASE("container: " title) { fn("container"); }                                           \
  TEST_CASE("microvm: " title * skip_unless(have_microvm_guest(), "needs qemu-system-x86_64 "   \
                                                                   "and a guest kernel "        \
                                                                   "(tools/microvm-guest)")) {  \
    fn("microvm");                                                                              \
  }

std::unique_ptr<session> open(client& c) {
  auto s = c.open_session();
  REQUIRE_MESSAGE(s, "open_session: " << describe(s.error_value()));
  return std::move(*s);
}

} // namespace

TEST_SUITE("microvm") {

void exec_basics(const std::string& backend) {
  embedded n(vm_daemon(backend == "microvm" ? microvm_guest_dir() : std::string()));
  auto s = open(*n.c);
  auto ids = s->create(vm_env(backend), 1);
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  REQUIRE(ids->size() == 1);
  auto id = ids->front();

  auto r = s->exec(id, cmd({"sh", "-c", "cat /etc/layer-file; hostname; echo e >&2; exit 5"}));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->exit_code == 5);
  CHECK(r->out == "tool-a\n" + id + "\n");
  CHECK(r->err == "e\n");

  auto in = cmd({"sh", "-c", "read x; echo got $x"});
  in.input = "hello\n";
  r = s->exec(id, in);
  REQUIRE(r);
  CHECK(r->out == "got hello\n");

  std::string streamed;
  int chunks = 0;
  r = s->exec(id, cmd({"sh", "-c", "echo one; sleep 1; echo two"}),
              [&](uint8_t, std::string_view data) {
                streamed += data;
                ++chunks;
              });
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(streamed == "one\ntwo\n");
  CHECK(chunks >= 2);

  auto missing = s->exec(id, cmd({"/no/such/command"}));
  check_error(missing, errc::not_found, "cannot execute '/no/such/command' in the sandbox");

  auto l = s->list();
  REQUIRE(l);
  REQUIRE(l->size() == 1);
  CHECK(l->front().env.backend == backend);

  // The environment and directory given, over the defaults.
  auto where = cmd({"sh", "-c", "echo $FOO; pwd; echo $HOME"});
  where.env = {"FOO=given"};
  where.cwd = "/etc";
  r = s->exec(id, where);
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->out == "given\n/etc\n/root\n");
  // A timeout kills the command and says so.
  auto slow = cmd({"sleep", "60"});
  slow.timeout_ms = 500;
  r = s->exec(id, slow);
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->timed_out);
  CHECK(r->signal == SIGKILL);

  REQUIRE(s->destroy(id));
  CHECK(eventually_gone(*n.c, {id}));
  CHECK(eventually_nothing_left(backend));
  // A destroyed sandbox's id is refused, naming it.
  auto after = s->exec(id, cmd({"true"}));
  CHECK_FALSE(after);
}
BACKEND_CASE("exec: status, stdout and stderr, stdin, streaming, env and cwd, a timeout, a missing "
             "command named; list shows the backend; destroyed, its id is refused",
             exec_basics)

TEST_CASE("the microvm backend: create, QEMU in dsec's cgroup, usage as the host sees it, destroy; stats offer it" *
          skip_unless(have_microvm_guest(), "needs qemu-system-x86_64 and a guest kernel (tools/microvm-guest)")) {
  embedded n(vm_daemon(microvm_guest_dir()));
  auto st = n.c->stats();
  REQUIRE(st);
  bool offered = false;
  for (const auto& b : st->backends)
    if (b.name == "microvm") {
      offered = true;
      CHECK(b.slots == 2);
      CHECK(b.live == 0);
    }
  CHECK(offered);

  auto s = open(*n.c);
  std::vector<std::string> failures;
  auto ids = s->create(vm_env(), 1, {}, [&](const error& e) { failures.push_back(describe(e)); });
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  REQUIRE_MESSAGE(ids->size() == 1, (failures.empty() ? std::string("no failure told") : failures.front()));
  auto id = ids->front();
  CHECK(qemu_processes() == 1);
  // QEMU runs in a memory cgroup below dsec's own (v2's single line, or v1's memory line).
  bool bounded = false;
  for (const auto& line : qemu_cgroups())
    if ((line.rfind("0::", 0) == 0 || line.find(":memory:") != std::string::npos)
        && line.find("/dsec/") != std::string::npos)
      bounded = true;
  CHECK_MESSAGE(bounded, "QEMU's cgroups: " << [&] {
    std::string all;
    for (const auto& l : qemu_cgroups())
      all += l + "; ";
    return all;
  }());

  // (exec itself: the "exec" case, for both backends)
  auto on_tty = cmd({"sh"});
  on_tty.tty = true;
  auto t = s->exec(id, on_tty);
  check_error(t, errc::unsupported, "terminals");

  // stats: its QEMU's figures as the host sees them; top is the guest's, not seen.
  auto u = n.c->usage(id);
  REQUIRE_MESSAGE(u, describe(u.error_value()));
  CHECK(u->id == id);
  CHECK(u->usage.memory_from_cgroup);
  CHECK(u->usage.memory_bytes > (16ull << 20)); // the guest's RAM it touched, and QEMU
  CHECK(u->usage.memory_limit >= (128ull << 20));
  CHECK(u->usage.cpu_ms > 0); // a TCG boot costs CPU seconds
  CHECK(u->usage.tasks >= 1);  // QEMU's threads
  CHECK(u->usage.disk_bytes == 0);
  CHECK(u->usage.processes == 0);
  auto top = n.c->usage(id, true);
  check_error(top, errc::unsupported, "the guest's processes are not seen from the host");

  st = n.c->stats();
  REQUIRE(st);
  for (const auto& b : st->backends)
    if (b.name == "microvm")
      CHECK(b.live == 1);

  REQUIRE(s->destroy(id));
  CHECK(eventually_gone(*n.c, {id}));
  CHECK(eventually_no_qemu());
}

TEST_CASE("a microVM pauses and resumes: QEMU frozen, commands refused, its TTL kept; destroyed while paused, nothing is left" *
          skip_unless(have_microvm_guest(), "needs qemu-system-x86_64 and a guest kernel (tools/microvm-guest)")) {
  embedded n(vm_daemon(microvm_guest_dir()));
  auto s = open(*n.c);
  auto env = vm_env();
  env.ttl_ms = 600'000;
  auto ids = s->create(env, 1);
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  REQUIRE(ids->size() == 1);
  auto id = ids->front();
  auto r = s->exec(id, cmd({"sh", "-c", "echo before > /tmp/mark"}));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(qemu_frozen() != std::optional<bool>{true});

  auto p = s->pause(id);
  REQUIRE_MESSAGE(p, describe(p.error_value()));
  CHECK(*p == true);
  CHECK(qemu_frozen() == std::optional<bool>{true});
  auto again = s->pause(id);
  REQUIRE(again);
  CHECK(*again == false); // paused already
  auto refused = s->exec(id, cmd({"true"}));
  check_error(refused, errc::paused, "is paused: resume it first");
  // The TTL clock stands still: two reads apart give the same time left.
  auto l1 = s->list();
  REQUIRE(l1);
  REQUIRE(l1->size() == 1);
  CHECK(l1->front().state == "paused");
  std::this_thread::sleep_for(200ms);
  auto l2 = s->list();
  REQUIRE(l2);
  CHECK(l2->front().ttl_left_ms == l1->front().ttl_left_ms);
  CHECK(l1->front().ttl_left_ms > 0);

  auto res = s->resume(id);
  REQUIRE_MESSAGE(res, describe(res.error_value()));
  CHECK(*res == true);
  CHECK(qemu_frozen() == std::optional<bool>{false});
  r = s->exec(id, cmd({"cat", "/tmp/mark"}));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->out == "before\n"); // the same guest, its memory kept
  auto l3 = s->list();
  REQUIRE(l3);
  CHECK(l3->front().state != "paused");

  // Destroyed while paused: QEMU is thawed to die, nothing is left.
  REQUIRE(s->pause(id));
  REQUIRE(s->destroy(id));
  CHECK(eventually_gone(*n.c, {id}));
  CHECK(eventually_no_qemu());
}

// (until_stats: test/actors/common.hpp; TCG boots get a 240 s cap)
constexpr auto boot_cap = std::chrono::seconds(240);

TEST_CASE("a warm pool of microVMs: booted before the create, which claims one; refilled; a container create does not take it; a microVM create of another environment evicts it; nothing left" *
          skip_unless(have_microvm_guest(), "needs qemu-system-x86_64 and a guest kernel (tools/microvm-guest)")) {
  embedded n(vm_daemon(microvm_guest_dir())); // 2 microVM slots
  auto s = open(*n.c);
  auto env = vm_env();
  auto ready_vms = [](const node_stats& st) {
    return st.pools.size() == 1 ? st.pools[0].ready : 0u;
  };

  // More than the node's microVM slots: refused, naming them.
  auto big = s->pool(env, 3);
  check_error(big, errc::invalid_argument, "2 microVM slots");

  auto took = s->pool(env, 1);
  REQUIRE_MESSAGE(took, describe(took.error_value()));
  CHECK(*took == 1);
  REQUIRE(until_stats(*n.c, [&](const node_stats& st) { return ready_vms(st) == 1; }, boot_cap));
  // Booted, and nobody's: not in the node's list, its QEMU running.
  CHECK(node_list(*n.c).empty());
  CHECK(qemu_processes() == 1);
  for (const auto& b : node_stats_of(*n.c).backends)
    if (b.name == "microvm")
      CHECK(b.live == 1);

  // A container of the same layers is not one of the pool's.
  auto c = s->create(vm_env("container"), 1);
  REQUIRE_MESSAGE(c, describe(c.error_value()));
  REQUIRE(c->size() == 1);
  auto st = node_stats_of(*n.c);
  REQUIRE(st.pools.size() == 1);
  CHECK(st.pools[0].claimed == 0);
  CHECK(st.pools[0].ready == 1);
  REQUIRE(s->destroy(c->front()));

  // A microVM create of its environment claims it: the guest booted for the
  // pool, under the id it booted with, and it is the caller's from now on.
  auto claimed_env = env;
  claimed_env.ttl_ms = 600'000;
  auto ids = s->create(claimed_env, 1);
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  REQUIRE(ids->size() == 1);
  auto id = ids->front();
  st = node_stats_of(*n.c);
  REQUIRE(st.pools.size() == 1);
  CHECK(st.pools[0].claimed == 1);
  auto r = s->exec(id, cmd({"sh", "-c", "cat /etc/layer-file; hostname; ls /tmp | wc -l"}));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->out == "tool-a\n" + id + "\n0\n");
  auto l = s->list();
  REQUIRE(l);
  REQUIRE(l->size() == 1);
  CHECK(l->front().id == id);
  CHECK(l->front().env.backend == "microvm");
  CHECK(l->front().ttl_left_ms > 0); // the claim's TTL runs
  CHECK(l->front().ttl_left_ms <= 600'000);
  // The pool boots another into the slot left.
  REQUIRE(until_stats(*n.c, [&](const node_stats& st) { return ready_vms(st) == 1; }, boot_cap));
  CHECK(qemu_processes() == 2);

  // Both microVM slots are taken (the claimed one, the pooled one): a microVM
  // of another environment gets the pooled one's slot.
  auto other = vm_env();
  other.memory = 112ull << 20;
  auto o = s->create(other, 1);
  REQUIRE_MESSAGE(o, describe(o.error_value()));
  REQUIRE(o->size() == 1);
  st = node_stats_of(*n.c);
  REQUIRE(st.pools.size() == 1);
  CHECK(st.pools[0].evicted == 1);
  r = s->exec(o->front(), cmd({"cat", "/etc/layer-file"}));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->out == "tool-a\n");
  // A slot freed, the pool fills it again.
  REQUIRE(s->destroy(o->front()));
  REQUIRE(until_stats(*n.c, [&](const node_stats& st) { return ready_vms(st) == 1; }, boot_cap));

  // The session ends: its microVMs and its pool's go, and no QEMU is left.
  REQUIRE(s->close());
  REQUIRE(until_stats(*n.c, [](const node_stats& st) { return st.pools.empty() && st.live == 0; }, boot_cap));
  CHECK(eventually_no_qemu());
}

void process_handles(const std::string& backend) {
  embedded n(vm_daemon(backend == "microvm" ? microvm_guest_dir() : std::string()));
  auto s = open(*n.c);
  auto ids = s->create(vm_env(backend), 1);
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  REQUIRE(ids->size() == 1);
  auto id = ids->front();

  // cat with an open stdin: what is written comes back, the end ends it.
  exec_request cat = cmd({"sh", "-c", "cat; echo done"});
  cat.handle = true;
  cat.open_stdin = true;
  auto p = s->start(id, cat);
  REQUIRE(p);
  auto pid = p->id();
  REQUIRE_MESSAGE(pid, describe(pid.error_value()));
  std::string sent;
  for (int i = 0; i < 40; ++i) { // 40 x 64 KiB: more than the channel holds at once
    std::string piece(64 * 1024, static_cast<char>('a' + i % 26));
    REQUIRE(p->write(piece));
    sent += piece;
  }
  REQUIRE(p->close_stdin());
  auto r = p->wait();
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->exit_code == 0);
  CHECK(r->out.size() == sent.size() + 5);
  CHECK(r->out == sent + "done\n");
  // After its end: its stdin is refused.
  auto late = p->write("x");
  CHECK_FALSE(late);

  // A signal to one command only: the other goes on.
  exec_request sleeper = cmd({"sh", "-c", "trap 'echo got TERM; exit 7' TERM; echo ready; "
                                          "while :; do sleep 0.1; done"});
  sleeper.handle = true;
  std::string seen;
  std::mutex mu;
  auto a = s->start(id, sleeper, [&](uint8_t, std::string_view d) {
    std::lock_guard<std::mutex> g{mu};
    seen += d;
  });
  exec_request other = cmd({"sh", "-c", "sleep 2; echo other"});
  other.handle = true;
  auto b = s->start(id, other);
  REQUIRE(a->id());
  REQUIRE(b->id());
  CHECK(eventually([&] {
    std::lock_guard<std::mutex> g{mu};
    return seen == "ready\n";
  }, 60s));
  REQUIRE(a->signal(SIGTERM));
  auto ra = a->wait();
  REQUIRE_MESSAGE(ra, describe(ra.error_value()));
  CHECK(ra->exit_code == 7);
  {
    std::lock_guard<std::mutex> g{mu};
    // (to its process group: the sh's sleep child is told too, and sh may say so)
    CHECK(seen.rfind("ready\n", 0) == 0);
    CHECK_MESSAGE(seen.find("got TERM\n") != std::string::npos, seen);
  }
  auto rb = b->wait();
  REQUIRE_MESSAGE(rb, describe(rb.error_value()));
  CHECK(rb->exit_code == 0);
  CHECK(rb->out == "other\n");

  // Refusals: an open stdin without a handle; a command's stdin that was not left open.
  exec_request bad = cmd({"cat"});
  bad.open_stdin = true;
  check_error(s->exec(id, bad), errc::invalid_argument, "an open stdin needs a process handle");
  exec_request closed = cmd({"sleep", "30"});
  closed.handle = true;
  auto c = s->start(id, closed);
  REQUIRE(c->id());
  auto w = c->write("x");
  REQUIRE_FALSE(w);
  CHECK(w.error_value().code == errc::closed);
  CHECK_MESSAGE(w.error_value().message.find("was not left open") != std::string::npos,
                w.error_value().message);
  REQUIRE(c->signal(SIGKILL));
  auto rc = c->wait();
  REQUIRE(rc);
  CHECK(rc->signal == SIGKILL);

  REQUIRE(s->destroy(id));
  CHECK(eventually_gone(*n.c, {id}));
  CHECK(eventually_nothing_left(backend));
}
BACKEND_CASE("process handles: stdin written in pieces and closed, a signal to one command's process group, streamed output; refusals name what",
             process_handles)

void files_in_and_out(const std::string& backend) {
  embedded n(vm_daemon(backend == "microvm" ? microvm_guest_dir() : std::string()));
  auto s = open(*n.c);
  auto ids = s->create(vm_env(backend), 1);
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  REQUIRE(ids->size() == 1);
  auto id = ids->front();

  tar_builder small;
  small.dir("d");
  small.file("d/note.txt", "a note for the VM\n");
  auto put = s->put(id, "/tmp", small.finish());
  REQUIRE_MESSAGE(put, describe(put.error_value()));
  auto r = s->exec(id, cmd({"cat", "/tmp/d/note.txt"}));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->out == "a note for the VM\n");

  std::string big;
  big.reserve(3u << 20);
  uint32_t x = 12345;
  while (big.size() < (3u << 20)) { // not compressible, not periodic
    x = x * 1103515245u + 12345u;
    big.push_back(static_cast<char>(x >> 24));
  }
  tar_builder large;
  large.file("big.bin", big);
  put = s->put(id, "/tmp", large.finish());
  REQUIRE_MESSAGE(put, describe(put.error_value()));
  r = s->exec(id, cmd({"sh", "-c", "wc -c < /tmp/big.bin"}));
  REQUIRE(r);
  CHECK(r->out == std::to_string(big.size()) + "\n");

  auto got = s->get(id, "/tmp/big.bin");
  REQUIRE_MESSAGE(got, describe(got.error_value()));
  auto back = file_in_tar(*got, "big.bin");
  REQUIRE(back);
  CHECK(back->size() == big.size());
  CHECK(*back == big);
  got = s->get(id, "/tmp/d");
  REQUIRE_MESSAGE(got, describe(got.error_value()));
  CHECK(file_in_tar(*got, "d/note.txt") == std::optional<std::string>{"a note for the VM\n"});

  auto missing = s->get(id, "/tmp/none");
  check_error(missing, errc::not_found, "get /tmp/none: no such file or directory in the sandbox");
  auto into_missing = s->put(id, "/no/such/dir", small.out);
  CHECK_FALSE(into_missing);

  REQUIRE(s->destroy(id));
  CHECK(eventually_gone(*n.c, {id}));
  CHECK(eventually_nothing_left(backend));
}
BACKEND_CASE("files in and out: a small put (one message) and a 3 MiB one (streamed), gets back byte-exact, a small get held back whole, a missing path named",
             files_in_and_out)

void ttl_ends_it(const std::string& backend) {
  embedded n(vm_daemon(backend == "microvm" ? microvm_guest_dir() : std::string()));
  auto s = open(*n.c);
  auto env = vm_env(backend);
  env.ttl_ms = 1500;
  auto ids = s->create(env, 1);
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  REQUIRE(ids->size() == 1);
  CHECK(eventually_gone(*n.c, *ids));
  CHECK(eventually_nothing_left(backend));
}
BACKEND_CASE("its TTL ends it, and nothing of it is left",
             ttl_ends_it)

TEST_CASE("a microVM whose kernel does not boot fails its create with QEMU's reason; nothing is left" *
          skip_unless(have_microvm_guest(), "needs qemu-system-x86_64 and a guest kernel (tools/microvm-guest)")) {
  auto& fx = suite::get();
  auto dir = fx.scratch();
  write_file(dir / "vmlinux", std::string(4096, 'Z'));
  write_file(dir / "initrd.cpio", read_file(microvm_guest_dir() + "/initrd.cpio"));
  embedded n(vm_daemon(dir.path()));
  auto s = open(*n.c);
  std::vector<error> failures;
  auto ids = s->create(vm_env(), 1, {}, [&](const error& e) { failures.push_back(e); });
  // The create fails as a whole (none was made) or reports the one failure.
  error e = ids ? (failures.empty() ? error{} : failures.front()) : ids.error_value();
  CHECK((!ids || ids->empty()));
  CHECK_MESSAGE(e.code == errc::sandbox_failed, describe(e));
  CHECK_MESSAGE(e.message.find("QEMU exited") != std::string::npos, describe(e));
  CHECK(eventually_no_qemu());
}

TEST_CASE("kill -9 of a dsecd with a microVM: its QEMU dies with it" *
          skip_unless(have_microvm_guest(), "needs qemu-system-x86_64 and a guest kernel (tools/microvm-guest)")) {
  dsecd_proc d({"--microvm-slots", "1", "--microvm-guest", microvm_guest_dir()});
  CHECK(d.bg.wait_for_output("microvm backend, 1 slots"));
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto c = connect(sys, d.port);
  auto s = open(*c);
  auto ids = s->create(vm_env(), 1);
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  REQUIRE(ids->size() == 1);
  // The QEMU processes whose parent is that dsecd.
  auto children = [&] {
    std::vector<pid_t> out;
    DIR* dir = ::opendir("/proc");
    while (auto* e = ::readdir(dir)) {
      std::ifstream f("/proc/" + std::string(e->d_name) + "/stat");
      std::string stat;
      std::getline(f, stat);
      auto rp = stat.rfind(')');
      if (rp != std::string::npos && stat.find("(qemu-system") != std::string::npos
          && std::atoi(stat.c_str() + rp + 4) == d.bg.pid())
        out.push_back(std::atoi(e->d_name));
    }
    ::closedir(dir);
    return out;
  }();
  REQUIRE(children.size() == 1);
  d.stop(SIGKILL); // with the session open: nothing but the kill ends the VM
  bool gone = false;
  for (int i = 0; i < 600 && !gone; ++i) {
    gone = ::kill(children.front(), 0) != 0 && errno == ESRCH;
    if (!gone)
      std::this_thread::sleep_for(100ms);
  }
  CHECK(gone);
}

TEST_CASE("a node without the microvm backend refuses it, naming the ones it offers") {
  embedded n;
  auto s = open(*n.c);
  std::vector<error> failures;
  auto ids = s->create(vm_env(), 1, {}, [&](const error& e) { failures.push_back(e); });
  if (ids) {
    CHECK(ids->empty());
    REQUIRE(!failures.empty());
    CHECK(failures.front().code == errc::unsupported);
    CHECK(failures.front().message.find("microvm") != std::string::npos);
  } else {
    check_error(ids, errc::unsupported, "microvm");
  }
}

} // TEST_SUITE

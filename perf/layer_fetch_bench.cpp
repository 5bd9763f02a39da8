// layer_fetch_bench: how fast a node fetches a layer it lacks from a peer
// (docs/cluster.md, layer distribution), against a plain copy of the same
// bytes.
//
//   build/perf/layer_fetch_bench [--mb N] [--runs R]
//
// Node A is a store in $TMPDIR with one base layer of N MB (default 100) of
// random, incompressible bytes, built with store::build, served by a
// layer_store in an actor system of its own, published on 127.0.0.1 with
// CAF's middleman. Node B is an embedded daemon over another, empty store in
// $TMPDIR, in a second actor system of the same process, whose layer cache
// reaches A with remote_actor: every chunk crosses CAF's network layer
// (loopback TCP, serialization both ways).
//
// Each run asks B's layer cache for the layer (acquire): describe, 1 MiB
// chunks with 4 in flight, written to B's tmp/ and hashed as they come, the
// digest and size checked, import (fsync, rename), mount. The layer is then
// released and removed from B, so the next run fetches it again. For
// comparison, in the same run: `cp` of A's blob to B's disk, `cp` + fsync, and
// sha256 of the blob alone (runtime/sha256). Needs root; leaves nothing behind.
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "actors/client.hpp"
#include "actors/daemon.hpp"
#include "actors/layer_store.hpp"
#include "actors/types.hpp"
#include "runtime/sha256.hpp"
#include "runtime/store.hpp"

namespace {

using clk = std::chrono::steady_clock;

const char* usage = R"(usage: layer_fetch_bench [--mb N] [--runs R]

How fast a node's layer cache fetches, verifies and imports a layer of N MB
(default 100, random bytes) from a layer_store in another actor system over
loopback, R times (default 3); with cp, cp + fsync and sha256 of the same
bytes for comparison. State dirs in $TMPDIR (default /tmp). Needs root;
leaves nothing behind.
)";

int rm_entry(const char* path, const struct stat*, int, FTW*) {
  return ::remove(path);
}

double seconds_since(clk::time_point t0) {
  return std::chrono::duration<double>(clk::now() - t0).count();
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "layer_fetch_bench: %s\n", what.c_str());
  std::exit(1);
}

template <class T>
T must(dsec::expected<T> r, const char* what) {
  if (!r)
    die(std::string{what} + ": " + r.error_value().to_string());
  return std::move(*r);
}

// Runs argv, waits; true if it exited 0.
bool run(std::vector<std::string> argv) {
  pid_t pid = ::fork();
  if (pid < 0)
    return false;
  if (pid == 0) {
    std::vector<char*> a;
    for (auto& s : argv)
      a.push_back(s.data());
    a.push_back(nullptr);
    ::execvp(a[0], a.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

struct figures {
  std::vector<double> fetch, cp, cp_sync, hash;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  uint64_t mb = 100;
  int runs = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc)
        die(a + " needs a value\n" + usage);
      return argv[++i];
    };
    if (a == "--mb")
      mb = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--runs")
      runs = std::atoi(next().c_str());
    else if (a == "-h" || a == "--help") {
      std::fputs(usage, stdout);
      return 0;
    } else
      die("unknown option " + a + "\n" + usage);
  }
  if (mb == 0 || runs <= 0)
    die(std::string{"--mb and --runs must be positive\n"} + usage);

  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string{tmp && *tmp ? tmp : "/tmp"} + "/dsec-fetch-bench-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr)
    die("mkdtemp " + templ + ": " + std::strerror(errno));
  const std::string root = templ;
  struct cleanup {
    std::string dir;
    ~cleanup() { ::nftw(dir.c_str(), rm_entry, 16, FTW_DEPTH | FTW_PHYS); }
  } clean{root};

  // The layer: one file of random bytes (incompressible), in a base layer.
  std::string tree = root + "/tree";
  ::mkdir(tree.c_str(), 0755);
  {
    std::ofstream out{tree + "/blob", std::ios::binary};
    std::mt19937_64 rng(42);
    std::vector<uint64_t> buf((1u << 20) / 8);
    for (uint64_t m = 0; m < mb; ++m) {
      for (auto& v : buf)
        v = rng();
      out.write(reinterpret_cast<const char*>(buf.data()),
                static_cast<std::streamsize>(buf.size() * 8));
    }
    if (!out)
      die("cannot write " + tree + "/blob");
  }
  auto store_a = must(dsec::store::open(root + "/a"), "store A");
  auto ref = must(dsec::parse_layer_ref("big@1"), "ref");
  auto t_build = clk::now();
  auto built = must(store_a.build(dsec::layer_kind::base, ref, tree), "build");
  std::printf("layer big@1: %.1f MB image (%s), built in %.2f s\n",
              static_cast<double>(built.info.size) / 1e6, built.info.digest.c_str(),
              seconds_since(t_build));

  figures f;
  {
    // Node A: the layer_store, published on loopback.
    caf::actor_system_config cfg_a;
    dsec::client::configure(cfg_a);
    cfg_a.set("scheduler.max-threads", size_t{2});
    cfg_a.set("logger.console", caf::atom("none"));
    caf::actor_system sys_a{cfg_a};
    auto key = dsec::internal_key::random(); // A's and B's cluster key
    auto served = dsec::spawn_layer_store(sys_a, store_a, key);
    auto port = sys_a.middleman().publish(served, 0, "127.0.0.1");
    if (!port)
      die("publish: " + caf::to_string(port.error()));

    // Node B: a daemon over an empty store, its cache's source A.
    caf::actor_system_config cfg_b;
    dsec::client::configure(cfg_b);
    cfg_b.set("scheduler.policy", caf::atom("sharing"));
    cfg_b.set("scheduler.max-threads", size_t{2});
    cfg_b.set("logger.console", caf::atom("none"));
    caf::actor_system sys_b{cfg_b};
    dsec::daemon_options o;
    o.state_dir = root + "/b";
    o.netns_prewarm = 1;
    o.cluster_key = key;
    auto d = must(dsec::daemon::start(sys_b, o), "daemon B");
    auto src = sys_b.middleman().remote_actor<dsec::layer_store_actor>("127.0.0.1", *port);
    if (!src)
      die("remote_actor: " + caf::to_string(src.error()));
    caf::anon_send(d->layer_cache(), dsec::source_atom::value, dsec::process_key(), *src,
                   std::string{"daemon A"});
    auto store_b = must(dsec::store::open(o.state_dir), "store B");

    dsec::environment env;
    env.base = "big@1";
    caf::scoped_actor self{sys_b};
    for (int r = 0; r < runs; ++r) {
      auto t0 = clk::now();
      uint64_t lease = 0;
      self->request(d->layer_cache(), caf::infinite, dsec::acquire_atom::value, dsec::process_key(), env)
        .receive([&](dsec::internal_key&, dsec::layer_set& ls) { lease = ls.lease; },
                 [&](caf::error& e) { die("acquire: " + dsec::from_caf(e).to_string()); });
      f.fetch.push_back(seconds_since(t0));
      self->send(d->layer_cache(), dsec::release_atom::value, dsec::process_key(), lease);
      // The lease goes with the release; then the layer can go too.
      bool removed = false;
      for (int i = 0; i < 1000 && !removed; ++i) {
        removed = static_cast<bool>(store_b.remove(ref));
        if (!removed)
          ::usleep(1000);
      }
      if (!removed)
        die("cannot remove big@1 from B after run " + std::to_string(r));

      // The same bytes with cp, to B's disk, then with an fsync.
      auto copy = o.state_dir + "/tmp/cp-copy";
      t0 = clk::now();
      if (!run({"cp", built.info.blob_path, copy}))
        die("cp failed");
      f.cp.push_back(seconds_since(t0));
      ::unlink(copy.c_str());
      t0 = clk::now();
      if (!run({"cp", built.info.blob_path, copy}) || !run({"sync", copy}))
        die("cp + sync failed");
      f.cp_sync.push_back(seconds_since(t0));
      ::unlink(copy.c_str());
      // sha256 alone.
      int fd = ::open(built.info.blob_path.c_str(), O_RDONLY | O_CLOEXEC);
      t0 = clk::now();
      auto hex = dsec::sha256_hex_of_file(fd);
      f.hash.push_back(seconds_since(t0));
      ::close(fd);
      if (!hex || "sha256:" + *hex != built.info.digest)
        die("sha256 of the blob differs from its digest");
    }
    uint64_t fetched = 0, bytes = 0;
    self->request(d->layer_cache(), std::chrono::seconds(30), dsec::list_atom::value, dsec::process_key())
      .receive(
        [&](std::vector<std::string>&, uint64_t n, uint64_t b) {
          fetched = n;
          bytes = b;
        },
        [&](caf::error& e) { die("list: " + dsec::from_caf(e).to_string()); });
    if (fetched != static_cast<uint64_t>(runs) || bytes != runs * built.info.size)
      die("the cache counted " + std::to_string(fetched) + " fetches of " +
          std::to_string(bytes) + " bytes, not " + std::to_string(runs));
    (void) d->shutdown();
    d.reset();
    caf::anon_send_exit(served, caf::exit_reason::user_shutdown);
  }

  double mbytes = static_cast<double>(built.info.size) / 1e6;
  auto line = [&](const char* what, const std::vector<double>& v) {
    std::printf("%-44s", what);
    for (double s : v)
      std::printf(" %7.3f s", s);
    std::printf("   median %7.3f s = %7.1f MB/s\n", median(v), mbytes / median(v));
  };
  std::printf("%d runs, %.1f MB each:\n", runs, mbytes);
  line("fetch + verify + import + mount (B's cache)", f.fetch);
  line("cp of the blob", f.cp);
  line("cp + sync of the blob", f.cp_sync);
  line(dsec::sha256::accelerated() ? "sha256 of the blob (runtime/sha256, SHA-NI)"
                                    : "sha256 of the blob (runtime/sha256, portable)",
       f.hash);
  std::printf("fetch / (cp + sync): %.2fx the time\n", median(f.fetch) / median(f.cp_sync));
  return 0;
}

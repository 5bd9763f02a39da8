// Layer distribution (docs/cluster.md) end to end. Node B is a real daemon
// with a state dir of its own. Its layer source is a layer_store over another
// store (A, its layers built with store::build), running in a second actor
// system in this process, published on 127.0.0.1 with CAF's middleman and
// reached with remote_actor: every chunk crosses CAF's network layer.
//
// Each case makes its own A and B (temporary state dirs below the suite's
// root) and checks at the end that nothing is left on the host: no mount, no
// process, no descriptor. Nothing is timed: a hang is caught by meson's
// timeout, and waiting for something asynchronous polls with a generous cap.
#include <doctest/doctest.h>

#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "actors/layer_store.hpp"
#include "actors/types.hpp"
#include "runtime/store.hpp"
#include "test/actors/common.hpp"
#include "test/support/fixture.hpp"
#include "test/support/host.hpp"

using namespace dsec;
using namespace dsec::test;

namespace fs = std::filesystem;

namespace {

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  for (auto& e : fs::directory_iterator(dir))
    out.insert(e.path().filename().string());
  return out;
}

layer_ref ref_of(const std::string& text) {
  auto r = parse_layer_ref(text);
  REQUIRE(r);
  return *r;
}

// The busybox base tree the actor suites use (bbt@1's source).
std::string base_tree() {
  actor_layers();
  return suite::get().root() + "/src/base-tar";
}

// What nodes A and B share as their cluster's key (a store refuses requests
// without it; docs/security.md).
const internal_key& cluster_key() {
  static const internal_key k = internal_key::random();
  return k;
}

// Node A: a store of its own and a layer_store over it, in an actor system of
// its own, published on 127.0.0.1 (a port the kernel picks).
struct origin : test_system {
  origin() {
    auto s = store::open(dir.path() + "/state");
    REQUIRE_MESSAGE(s, describe(s.error_value()));
    st.emplace(std::move(*s));
    actor = spawn_layer_store(sys, *st, cluster_key());
    auto p = sys.middleman().publish(actor, 0, "127.0.0.1");
    REQUIRE_MESSAGE(p, "publish: " << caf::to_string(p.error()));
    port = *p;
  }
  ~origin() {
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    if (tap)
      caf::anon_send_exit(tap, caf::exit_reason::user_shutdown);
  }

  // Builds `ref` of `kind` here from `tree`; returns what the store says of it.
  layer_info build(const std::string& kind, const std::string& ref, const std::string& tree) {
    auto k = parse_layer_kind(kind);
    REQUIRE(k);
    auto r = st->build(*k, ref_of(ref), tree);
    REQUIRE_MESSAGE(r, "build " << ref << ": " << describe(r.error_value()));
    return r->info;
  }

  temp_dir dir{suite::get().root(), "origin"};
  caf::actor_system sys{cfg};
  std::optional<store> st;
  layer_store_actor actor;
  layer_store_actor tap; // see killed_after()
  uint16_t port = 0;
};

// Node B: a daemon over an empty state dir (or one prepared by `prepare`),
// whose layer cache fetches from `from` through the network.
struct node_b {
  explicit node_b(origin& from, const std::function<void(store&)>& prepare = {})
    : dir(suite::get().root(), "node") {
    auto s = store::open(state());
    REQUIRE(s);
    if (prepare)
      prepare(*s);
    daemon_options o;
    o.state_dir = state();
    o.cluster_key = cluster_key();
    n.emplace(o);
    connect(from.port);
  }

  // Makes the layer_store published at `port` the cache's source.
  void connect(uint16_t port) {
    auto src = n->sys.middleman().remote_actor<layer_store_actor>("127.0.0.1", port);
    REQUIRE_MESSAGE(src, "remote_actor: " << caf::to_string(src.error()));
    // A proxy: the messages to it go through the middleman's connection.
    REQUIRE(src->node() != n->sys.node());
    caf::anon_send(n->d->layer_cache(), source_atom::value, process_key(), *src,
                   std::string{"the origin"});
    list(); // processed: the source is set
  }

  // What the cache lists: its store's refs, layers fetched, bytes fetched.
  std::tuple<std::vector<std::string>, uint64_t, uint64_t> list() {
    caf::scoped_actor self{n->sys};
    std::tuple<std::vector<std::string>, uint64_t, uint64_t> out;
    bool ok = false;
    self->request(n->d->layer_cache(), std::chrono::seconds(60), list_atom::value, process_key())
      .receive(
        [&](std::vector<std::string>& refs, uint64_t fetched, uint64_t bytes) {
          out = {std::move(refs), fetched, bytes};
          ok = true;
        },
        [&](caf::error& e) { FAIL("list: " << describe(from_caf(e))); });
    REQUIRE(ok);
    return out;
  }
  uint64_t fetched() { return std::get<1>(list()); }
  uint64_t fetched_bytes() { return std::get<2>(list()); }

  std::string state() const { return dir.path() + "/state"; }
  // The store's contents: refs, blobs and staging entries.
  std::set<std::string> refs() const { return entries(state() + "/refs"); }
  std::set<std::string> blobs() const { return entries(state() + "/blobs/sha256"); }
  std::set<std::string> tmp() const { return entries(state() + "/tmp"); }

  std::unique_ptr<session> open() {
    auto s = n->c->open_session();
    REQUIRE_MESSAGE(s, "open_session: " << describe(s.error_value()));
    return std::move(*s);
  }

  temp_dir dir;
  std::optional<embedded> n;
};

environment env(const std::string& base, const std::vector<std::string>& tools = {}) {
  environment e;
  e.base = base;
  e.tools = tools;
  return e;
}

std::vector<std::string> make(session& s, const environment& e, uint32_t count) {
  std::vector<std::string> failures;
  auto ids = s.create(e, count, {}, [&](const error& err) { failures.push_back(describe(err)); });
  REQUIRE_MESSAGE(ids, "create: " << describe(ids.error_value()));
  REQUIRE_MESSAGE(ids->size() == count,
                  "created " << ids->size() << " of " << count << "; first failure: "
                             << (failures.empty() ? "none" : failures.front()));
  return std::move(*ids);
}

std::string out_of(session& s, const std::string& id, std::vector<std::string> argv) {
  auto r = s.exec(id, cmd(std::move(argv)));
  REQUIRE_MESSAGE(r, "exec: " << describe(r.error_value()));
  CHECK_MESSAGE(r->exit_code == 0, "stderr: " << r->err);
  return r->out;
}

// A tree with one file of `bytes` random (incompressible) bytes at `path`.
std::string random_tree(const std::string& name, const std::string& path, size_t bytes,
                        unsigned seed) {
  std::string data(bytes, '\0');
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    uint64_t v = rng();
    std::memcpy(data.data() + i, &v, 8);
  }
  return suite::get().make_tree(name, {{path, data}});
}

// The sha256 of a file as the sandbox's busybox prints it.
std::string sha256_in(session& s, const std::string& id, const std::string& path) {
  auto out = out_of(s, id, {"sha256sum", path});
  return out.substr(0, out.find(' '));
}

// A layer_store_actor that passes everything to `real` until the `after`-th
// fetch: then it kills `real` and ends itself without answering, as a node
// that dies in the middle of a transfer. The bytes still come from the real
// layer_store; only its death is timed.
layer_store_actor::behavior_type killer(layer_store_actor::pointer self, layer_store_actor real,
                                        int after) {
  auto seen = std::make_shared<int>(0);
  return {
    [=](describe_atom a, const internal_key& k, const std::string& ref) {
      return self->delegate(real, a, k, ref);
    },
    [=](fetch_atom a, const internal_key& k, const std::string& digest, uint64_t offset,
        uint32_t length) -> caf::result<internal_key, std::string> {
      if (++*seen == after) {
        self->send_exit(real, caf::exit_reason::kill);
        self->quit(caf::exit_reason::kill);
        return self->make_response_promise<internal_key, std::string>(); // never answered
      }
      return self->delegate(real, a, k, digest, offset, length);
    },
  };
}

} // namespace

TEST_CASE("layers: a sandbox runs from layers built only on another node") {
  auto before = settled_snapshot();
  {
    origin a;
    auto base = a.build("base", "lbase@1", base_tree());
    auto tool = a.build("tool", "lhello@1",
                        suite::get().make_tree("lhello", {{"opt/hello/msg", "hello from A\n"}}));
    node_b b(a);
    CHECK(b.refs().empty());

    auto s = b.open();
    auto e = env("lbase@1", {"lhello@1"});
    auto id = make(*s, e, 1).front();
    CHECK(out_of(*s, id, {"cat", "/opt/hello/msg"}) == "hello from A\n");
    CHECK(out_of(*s, id, {"cat", "/etc/layer-file"}) == "base\n");

    auto [refs, fetched, bytes] = b.list();
    CHECK(refs == std::vector<std::string>{"lbase@1", "lhello@1"});
    CHECK(fetched == 2);
    CHECK(bytes == base.size + tool.size);
    // B's store holds A's images under A's digests, with A's metadata.
    CHECK(b.blobs() == std::set<std::string>{base.digest.substr(7), tool.digest.substr(7)});
    CHECK(b.tmp().empty());
    auto bst = store::open(b.state());
    REQUIRE(bst);
    auto info = bst->find(ref_of("lhello@1"));
    REQUIRE_MESSAGE(info, describe(info.error_value()));
    CHECK(info->digest == tool.digest);
    CHECK(info->kind == layer_kind::tool);
    CHECK(info->created == tool.created);
    CHECK(info->source == tool.source);
    CHECK("sha256:" + sha256_of(info->blob_path) == tool.digest);

    // Present now: the next sandboxes need no fetch.
    auto more = make(*s, e, 2);
    CHECK(out_of(*s, more[1], {"cat", "/opt/hello/msg"}) == "hello from A\n");
    CHECK(b.fetched() == 2);
    REQUIRE(s->close());
  }
  check_nothing_left(before);
}

TEST_CASE("layers: 20 concurrent creates needing a layer fetch it once") {
  auto before = settled_snapshot();
  {
    origin a;
    // Several chunks, so the fetch is still going when the others ask.
    auto tool = a.build("tool", "lshared@1", random_tree("lshared", "opt/shared/blob", 3 << 20, 20));
    // B builds the base itself (the same tree gives the same image); only the
    // tool comes from A.
    node_b b(a, [](store& st) {
      auto r = st.build(layer_kind::base, ref_of("lbase@1"), base_tree());
      REQUIRE_MESSAGE(r, describe(r.error_value()));
    });
    auto s = b.open();
    auto e = env("lbase@1", {"lshared@1"});
    std::mutex mu;
    std::vector<std::string> ready, failures;
    std::atomic<int> done{0};
    for (int i = 0; i < 20; ++i)
      s->create_async(
        e, 1,
        [&](expected<std::vector<std::string>> r) {
          std::lock_guard lock{mu};
          if (!r)
            failures.push_back(describe(r.error_value()));
          ++done;
        },
        [&](const std::string& id) {
          std::lock_guard lock{mu};
          ready.push_back(id);
        },
        [&](const error& err) {
          std::lock_guard lock{mu};
          failures.push_back(describe(err));
        });
    REQUIRE(eventually([&] { return done.load() == 20; }, std::chrono::seconds(300)));
    {
      std::lock_guard lock{mu};
      CHECK_MESSAGE(failures.empty(), failures.front());
      CHECK(ready.size() == 20);
    }
    CHECK(b.fetched() == 1);
    CHECK(b.fetched_bytes() == tool.size);
    CHECK(b.refs() == std::set<std::string>{"lbase@1", "lshared@1"});
    CHECK(b.tmp().empty());
    // Each sandbox sees the whole file.
    auto sum = sha256_of(suite::get().root() + "/src/lshared/opt/shared/blob");
    for (size_t i = 0; i < ready.size(); i += 7)
      CHECK(sha256_in(*s, ready[i], "/opt/shared/blob") == sum);
    REQUIRE(s->close());
  }
  check_nothing_left(before);
}

TEST_CASE("layers: a layer of many chunks arrives byte-exact") {
  auto before = settled_snapshot();
  {
    origin a;
    a.build("base", "lbase@1", base_tree());
    auto big = a.build("tool", "lbig@1", random_tree("lbig", "opt/big/blob", 5 << 20, 5));
    REQUIRE(big.size > 4 * max_fetch_chunk); // more chunks than requests in flight
    node_b b(a);
    auto s = b.open();
    auto id = make(*s, env("lbase@1", {"lbig@1"}), 1).front();
    CHECK(sha256_in(*s, id, "/opt/big/blob")
          == sha256_of(suite::get().root() + "/src/lbig/opt/big/blob"));
    auto bst = store::open(b.state());
    REQUIRE(bst);
    auto info = bst->find(ref_of("lbig@1"));
    REQUIRE(info);
    CHECK(read_file(info->blob_path) == read_file(big.blob_path));
    CHECK(b.fetched() == 2);
    CHECK(b.tmp().empty());
    REQUIRE(s->close());
  }
  check_nothing_left(before);
}

TEST_CASE("layers: a layer neither here nor at the source is not_found, naming it") {
  auto before = settled_snapshot();
  {
    origin a;
    a.build("base", "lbase@1", base_tree());
    node_b b(a);
    auto s = b.open();
    auto r = s->create(env("lbase@1", {"lnope@1"}), 2);
    check_error(r, errc::not_found, "unknown layer lnope@1");
    MESSAGE("what the trainer sees: " << describe(r.error_value()));
    CHECK(r.error_value().message.find("layer source") != std::string::npos);
    // Without a source it is the single node's message, as before.
    caf::anon_send(b.n->d->layer_cache(), source_atom::value, process_key(), layer_store_actor{},
                   std::string{});
    b.list();
    auto plain = s->create(env("lbase@1", {"lnope2@1"}), 1);
    check_error(plain, errc::not_found, "unknown layer lnope2@1 (see 'dsec layer ls')");
    CHECK(b.refs() == std::set<std::string>{"lbase@1"}); // the base came for the first
    CHECK(b.tmp().empty());
    REQUIRE(s->close());
  }
  check_nothing_left(before);
}

TEST_CASE("layers: a source whose image does not match its digest is refused; nothing stays") {
  auto before = settled_snapshot();
  {
    origin a;
    auto lie = a.build("tool", "llie@1", random_tree("llie", "opt/lie/blob", 2 << 20, 7));
    // The blob on A rots after it was built: same size, one byte changed.
    {
      unique_fd fd{::open(lie.blob_path.c_str(), O_RDWR | O_CLOEXEC)};
      REQUIRE(fd);
      char c = 0;
      auto at = static_cast<off_t>(lie.size / 2);
      REQUIRE(::pread(fd.get(), &c, 1, at) == 1);
      c = static_cast<char>(c ^ 0x5a);
      REQUIRE(::pwrite(fd.get(), &c, 1, at) == 1);
    }
    REQUIRE("sha256:" + sha256_of(lie.blob_path) != lie.digest);
    node_b b(a, [](store& st) {
      auto r = st.build(layer_kind::base, ref_of("lbase@1"), base_tree());
      REQUIRE_MESSAGE(r, describe(r.error_value()));
    });
    auto refs = b.refs();
    auto blobs = b.blobs();
    auto s = b.open();
    std::vector<std::string> failures;
    auto r = s->create(env("lbase@1", {"llie@1"}), 3, {},
                       [&](const error& e) { failures.push_back(e.message); });
    check_error(r, errc::malformed, "digest mismatch");
    MESSAGE("what the trainer sees: " << describe(r.error_value()));
    CHECK(r.error_value().message.find("llie@1") != std::string::npos);
    CHECK(r.error_value().message.find(lie.digest) != std::string::npos);
    CHECK(failures.size() == 3);
    for (const auto& f : failures)
      CHECK(f.find("digest mismatch") != std::string::npos);
    // Nothing of it in B's store: no ref, no blob, no staged file.
    CHECK(b.refs() == refs);
    CHECK(b.blobs() == blobs);
    CHECK(b.tmp().empty());
    CHECK(b.fetched() == 0);
    REQUIRE(s->close());
  }
  check_nothing_left(before);
}

TEST_CASE("layers: the source dying in the middle of a fetch fails every waiter") {
  auto before = settled_snapshot();
  {
    origin a;
    a.build("tool", "lhalf@1", random_tree("lhalf", "opt/half/blob", 6 << 20, 9));
    // B reaches A's layer_store through a tap that kills it at the 3rd chunk.
    a.tap = a.sys.spawn(killer, a.actor, 3);
    auto p = a.sys.middleman().publish(a.tap, 0, "127.0.0.1");
    REQUIRE(p);
    node_b b(a, [](store& st) {
      auto r = st.build(layer_kind::base, ref_of("lbase@1"), base_tree());
      REQUIRE_MESSAGE(r, describe(r.error_value()));
    });
    b.connect(*p);
    auto refs = b.refs();
    auto blobs = b.blobs();
    auto s = b.open();
    std::vector<std::string> failures;
    auto r = s->create(env("lbase@1", {"lhalf@1"}), 3, {},
                       [&](const error& e) { failures.push_back(describe(e)); });
    REQUIRE_FALSE(r);
    MESSAGE("what the trainer sees: " << describe(r.error_value()));
    CHECK_MESSAGE(r.error_value().code == errc::disconnected, describe(r.error_value()));
    CHECK(r.error_value().message.find("lhalf@1") != std::string::npos);
    CHECK(r.error_value().message.find("layer source") != std::string::npos);
    CHECK(failures.size() == 3);
    CHECK(b.refs() == refs);
    CHECK(b.blobs() == blobs);
    CHECK(b.tmp().empty());
    CHECK(b.fetched() == 0);
    // The node still serves what it has.
    auto id = make(*s, env("lbase@1"), 1).front();
    CHECK(out_of(*s, id, {"cat", "/etc/layer-file"}) == "base\n");
    REQUIRE(s->close());
  }
  check_nothing_left(before);
}

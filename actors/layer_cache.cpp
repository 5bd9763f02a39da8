#include "actors/layer_cache.hpp"
#include "runtime/snapshot.hpp"

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/node_id.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>

#include "actors/layer_store.hpp"
#include "actors/types.hpp"
#include "runtime/engine.hpp"
#include "runtime/metrics.hpp"
#include "runtime/mount.hpp"

namespace dsec {

namespace {

// Layer distribution: chunks of at most this many bytes, this many requests in
// flight per layer, and how long the source may take to answer each request.
constexpr uint32_t fetch_chunk = max_fetch_chunk;
constexpr uint32_t fetches_in_flight = 4;
constexpr auto fetch_timeout = std::chrono::seconds(30);

// How a layer source is named in errors: by whom it was given as (the
// coordinator's address), never by CAF's ids of its actor and process.
std::string name_of(const layer_store_actor& src, const std::string& name) {
  if (!src)
    return "none";
  return name.empty() ? std::string{"a peer's layer store"} : name;
}

// Its metrics (runtime/metrics.hpp, docs/observability.md), the process's.
struct cache_metrics {
  metrics::counter& hits;
  metrics::counter& misses;
  metrics::counter& evictions;
  metrics::gauge& bytes;
  metrics::counter& fetch_bytes;
  metrics::counter& fetched;
  metrics::counter& fetch_failed;
  metrics::histogram& fetch_seconds;
  static cache_metrics& get() {
    static cache_metrics m = [] {
      auto& r = metrics::process_registry();
      return cache_metrics{
        r.get_counter("dsec_layer_cache_hits_total",
                      "Layer images a sandbox needed that were mounted already."),
        r.get_counter("dsec_layer_cache_misses_total",
                      "Layer images mounted for a sandbox that needed them."),
        r.get_counter("dsec_layer_cache_evictions_total",
                      "Unused layer images unmounted beyond --cache-bytes."),
        r.get_gauge("dsec_layer_cache_bytes", "Bytes of the layer images mounted now."),
        r.get_counter("dsec_layer_fetch_bytes_total",
                      "Bytes of layers fetched from the cluster's layer source."),
        r.get_counter("dsec_layer_fetches_total", "Layers fetched from the layer source.",
                      {{"outcome", "ok"}}),
        r.get_counter("dsec_layer_fetches_total", "Layers fetched from the layer source.",
                      {{"outcome", "failed"}}),
        r.get_histogram("dsec_layer_fetch_seconds",
                        "From a layer's fetch's start to its import into the store.",
                        metrics::latency_buckets())};
    }();
    return m;
  }
};

struct layer_cache_state {
  static inline const char* name = "dsec.layer_cache";

  engine* eng = nullptr;
  uint64_t budget = 0;
  internal_key key; // the member key, for the layer source

  struct mounted {
    std::unique_ptr<layer_mount> mnt;
    uint64_t bytes = 0;
    uint32_t users = 0;
    uint64_t last_used = 0;
  };
  std::unordered_map<std::string, mounted> mounts; // by digest

  struct ref_entry {
    layer_kind kind;
    std::vector<std::string> digests; // topmost first: more than one for an OCI image
    std::optional<layer_lease> lease; // held while users > 0
    uint32_t users = 0;
  };
  std::unordered_map<std::string, ref_entry> refs; // by NAME@VERSION

  struct lease_entry {
    std::vector<std::string> refs;
    std::vector<std::string> digests;
  };
  std::unordered_map<uint64_t, lease_entry> leases;

  std::unique_ptr<layer_mount> system;
  uint64_t next_lease = 1;
  uint64_t tick = 0;
  uint64_t bytes = 0;
  uint64_t evicted = 0;
  double published_bytes = 0; // what it added to dsec_layer_cache_bytes
  void publish_bytes() {
    auto now = static_cast<double>(bytes);
    if (now != published_bytes)
      cache_metrics::get().bytes.add(now - published_bytes);
    published_bytes = now;
  }
  ~layer_cache_state() {
    bytes = 0;
    publish_bytes();
  }
  // layer distribution: where missing layers come from (none: a single node)
  layer_store_actor source;
  std::string source_name; // e.g. "the coordinator 10.0.0.1:7070"
  uint64_t fetched = 0, fetched_bytes = 0;

  // A layer being fetched from a source, once however many acquires wait for it.
  struct fetch_job {
    uint64_t id = 0;               // tells a live job's replies from a dead one's
    layer_store_actor from;
    std::string from_name;
    layer_meta meta;               // as the source described it
    layer_kind kind = layer_kind::base;
    // What is fetched, one blob after the other: the layer's image, or the
    // lowers of an OCI image that the store lacks (a lower shared with an
    // image the node has is not fetched again).
    struct blob {
      std::string digest;
      uint64_t size = 0;
    };
    std::vector<blob> blobs;
    size_t current = 0;            // the blob being fetched
    std::vector<staged_file> done; // an image's fetched blobs, checked, in order
    uint64_t bytes = 0;            // fetched and checked so far
    std::optional<staged_file> file; // in the store's tmp/, hashed as it is written
    uint64_t next_offset = 0;      // the next byte to ask for
    uint32_t in_flight = 0;
    std::map<uint64_t, std::string> early; // chunks that came before their turn
    std::vector<uint64_t> waiters; // the acquires waiting for it
    // copy_atom's callers (a diff made on another node, copied here)
    std::vector<caf::typed_response_promise<internal_key, bool>> copies;
    std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  };
  std::unordered_map<std::string, fetch_job> fetches; // by NAME@VERSION
  uint64_t next_job = 1;

  // An acquire that waits for fetches of the layers it names.
  struct waiting_acquire {
    environment env;
    caf::typed_response_promise<internal_key, layer_set> rp;
    size_t pending = 0;            // fetches not finished yet
    uint32_t rounds = 1;           // a snapshot's record names more once its diff is here
    std::optional<error> failure;  // the first that failed
  };
  std::unordered_map<uint64_t, waiting_acquire> waiting;
  uint64_t next_waiter = 1;

  // The layers of `env` that the store lacks (not_found), each once.
  std::vector<std::string> missing(const environment& env) {
    std::vector<std::string> all;
    auto add = [&](const environment& e) {
      if (!e.base.empty())
        all.push_back(e.base);
      if (!e.workdir.empty())
        all.push_back(e.workdir);
      all.insert(all.end(), e.tools.begin(), e.tools.end());
    };
    add(env);
    // A snapshot: its diff, and once that is here the layers its record
    // names, down the chain (diffs stack); acquire fetches them round by round.
    environment at = env;
    for (int depth = 0; !at.snapshot.empty() && depth < 16; ++depth) {
      auto parsed = parse_layer_ref(at.snapshot);
      if (!parsed)
        break;
      auto info = eng->layers().find(*parsed);
      if (!info) {
        all.push_back(at.snapshot);
        break;
      }
      auto rec = parse_on(info->on);
      if (!rec)
        break;
      at = std::move(*rec);
      add(at);
    }
    std::vector<std::string> out;
    for (const auto& text : all) {
      if (auto it = refs.find(text); it != refs.end() && it->second.users > 0)
        continue;
      auto parsed = parse_layer_ref(text);
      if (!parsed) // acquire reports it
        continue;
      auto info = eng->layers().find(*parsed);
      if (!info && info.error_value().code == errc::not_found
          && std::find(out.begin(), out.end(), text) == out.end())
        out.push_back(text);
    }
    return out;
  }

  // Takes a reference on `ref`, checking its kind; leases it in the store when
  // it was unused.
  expected<ref_entry*> use_ref(const std::string& text, layer_kind want, const char* slot) {
    DSEC_TRY(parsed, parse_layer_ref(text));
    auto it = refs.find(text);
    if (it == refs.end() || it->second.users == 0) {
      DSEC_TRY(l, eng->layers().lease(parsed));
      auto& e = refs[text];
      e.kind = l.info().kind;
      e.digests = l.info().digests();
      e.lease.emplace(std::move(l));
      it = refs.find(text);
    }
    auto& e = it->second;
    if (auto k = check_layer_kind(slot, text, e.kind, want); !k) {
      if (e.users == 0)
        e.lease.reset();
      return std::move(k).error_value();
    }
    ++e.users;
    return &e;
  }

  void drop_ref(const std::string& text) {
    auto it = refs.find(text);
    if (it == refs.end() || it->second.users == 0)
      return;
    if (--it->second.users == 0)
      it->second.lease.reset(); // `layer rm` may remove it now
  }

  // Mounts (or finds) the image `path` of `digest` and takes a reference.
  expected<int> use_mount(const std::string& digest, const std::string& path) {
    auto it = mounts.find(digest);
    if (it == mounts.end()) {
      DSEC_TRY(m, layer_mount::open(path, eng->userns_fd()));
      mounted mm;
      mm.mnt = std::make_unique<layer_mount>(std::move(m));
      struct stat st{};
      mm.bytes = ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
      bytes += mm.bytes;
      it = mounts.emplace(digest, std::move(mm)).first;
      cache_metrics::get().misses.inc();
      publish_bytes();
    } else {
      cache_metrics::get().hits.inc();
    }
    ++it->second.users;
    it->second.last_used = ++tick;
    return it->second.mnt->dir_fd();
  }

  void drop_mount(const std::string& digest) {
    auto it = mounts.find(digest);
    if (it != mounts.end() && it->second.users > 0)
      --it->second.users;
  }

  // Unmounts unused layers, oldest first, until the budget is kept.
  void evict() {
    while (budget > 0 && bytes > budget) {
      auto victim = mounts.end();
      for (auto it = mounts.begin(); it != mounts.end(); ++it)
        if (it->second.users == 0
            && (victim == mounts.end() || it->second.last_used < victim->second.last_used))
          victim = it;
      if (victim == mounts.end())
        return; // everything is in use
      bytes -= victim->second.bytes;
      mounts.erase(victim);
      ++evicted;
      cache_metrics::get().evictions.inc();
      publish_bytes();
    }
  }

  expected<layer_set> acquire(const environment& env) {
    if (!system) {
      DSEC_TRY(path, eng->layers().system_layer());
      DSEC_TRY(m, layer_mount::open(path, eng->userns_fd()));
      system = std::make_unique<layer_mount>(std::move(m));
    }
    if (env.base.empty() && env.snapshot.empty())
      return dsec::make_error(errc::invalid_argument, "an environment needs a base layer");
    // A snapshot's chain of diffs down to its base (runtime/snapshot.hpp).
    auto slots = resolve_layers(env, [this](const std::string& text) -> expected<layer_record> {
      DSEC_TRY(parsed, parse_layer_ref(text));
      DSEC_TRY(info, eng->layers().find(parsed));
      return layer_record{info.kind, info.on};
    });
    if (!slots)
      return std::move(slots).error_value();
    lease_entry le;
    layer_set out;
    out.fds.push_back(system->dir_fd());
    auto undo = [&] {
      for (auto& d : le.digests)
        drop_mount(d);
      for (auto& r : le.refs)
        drop_ref(r);
    };
    for (const auto& sl : *slots) { // topmost first
      const std::string& text = sl.ref;
      auto e = use_ref(text, sl.kind, sl.slot.c_str());
      if (!e) {
        undo();
        return std::move(e).error_value();
      }
      le.refs.push_back(text);
      // Each of the layer's images (an OCI image has several), topmost first.
      const auto& paths = (*e)->lease->blob_paths();
      for (size_t i = 0; i < (*e)->digests.size() && i < paths.size(); ++i) {
        auto fd = use_mount((*e)->digests[i], paths[i]);
        if (!fd) {
          undo();
          return std::move(fd).error_value().in_step("mount_layers");
        }
        le.digests.push_back((*e)->digests[i]);
        out.fds.push_back(*fd);
      }
      if (&sl == &slots->back()) { // the base: its config gives the commands' defaults
        out.config = (*e)->lease->info().config;
        out.base_lowers = static_cast<uint32_t>(std::min((*e)->digests.size(), paths.size()));
      }
    }
    out.lease = next_lease++;
    leases.emplace(out.lease, std::move(le));
    evict();
    return out;
  }

  void release(uint64_t lease) {
    auto it = leases.find(lease);
    if (it == leases.end())
      return;
    for (auto& d : it->second.digests)
      drop_mount(d);
    for (auto& r : it->second.refs)
      drop_ref(r);
    leases.erase(it);
    evict();
  }
};

using cache_ptr = layer_cache_actor::stateful_pointer<layer_cache_state>;

// ---- layer distribution ---------------------------------------------------------

void join_fetch(cache_ptr self, const std::string& ref, uint64_t id);

// Ends the fetch of `ref`: its staged file goes (unless imported), and every
// acquire waiting for it either fails with `failure` or, once it waits for no
// other fetch, is served from the store.
void end_fetch(cache_ptr self, const std::string& ref, std::optional<error> failure) {
  auto& s = self->state;
  auto it = s.fetches.find(ref);
  if (it == s.fetches.end())
    return;
  auto waiters = std::move(it->second.waiters);
  for (auto& c : it->second.copies) {
    if (failure)
      c.deliver(to_caf(*failure));
    else
      c.deliver(process_key(), true);
  }
  auto& cm = cache_metrics::get();
  if (failure) {
    cm.fetch_failed.inc();
  } else {
    cm.fetched.inc();
    cm.fetch_bytes.inc(it->second.bytes);
    cm.fetch_seconds.observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - it->second.started)
        .count());
  }
  s.fetches.erase(it); // before serving anyone: a new acquire starts afresh
  for (auto id : waiters) {
    auto w = s.waiting.find(id);
    if (w == s.waiting.end())
      continue;
    if (failure && !w->second.failure)
      w->second.failure = failure;
    if (--w->second.pending > 0)
      continue;
    auto done = std::move(w->second);
    s.waiting.erase(w);
    if (done.failure) {
      done.rp.deliver(to_caf(*done.failure));
      continue;
    }
    auto r = s.acquire(done.env);
    if (r) {
      done.rp.deliver(process_key(), std::move(*r));
      continue;
    }
    // A diff fetched names layers this node lacks too: fetch those.
    if (r.error_value().code == errc::not_found && done.rounds < 17) {
      auto lacking = s.missing(done.env);
      if (!lacking.empty()) {
        auto again = s.next_waiter++;
        done.pending = lacking.size();
        ++done.rounds;
        s.waiting.emplace(again, std::move(done));
        for (const auto& l : lacking)
          join_fetch(self, l, again);
        continue;
      }
    }
    done.rp.deliver(to_caf(r.error_value()));
  }
}

// Fails the fetch of `ref` with an error that names the layer and the source.
void fail_fetch(cache_ptr self, const std::string& ref, errc code, const std::string& why) {
  auto& s = self->state;
  auto it = s.fetches.find(ref);
  if (it == s.fetches.end())
    return;
  end_fetch(self, ref,
            make_error(code, "cannot fetch layer " + ref + " from its layer source ("
                               + name_of(it->second.from, it->second.from_name) + "): " + why));
}

// A request to the source failed (an error reply, a timeout, the source gone).
void fail_request(cache_ptr self, const std::string& ref, const caf::error& e) {
  auto err = from_caf(e);
  std::string why;
  switch (err.code) {
    case errc::timeout:
      why = "no answer within " + std::to_string(fetch_timeout.count()) + " s";
      break;
    case errc::disconnected:
      why = "the source is gone (" + err.message + ")";
      break;
    default:
      why = err.message;
  }
  fail_fetch(self, ref, err.code, why);
}

void pump(cache_ptr self, const std::string& ref);

// Stages a file for the job's current blob and starts fetching it.
void start_blob(cache_ptr self, const std::string& ref);

// Installs what was fetched: the layer's image, or an OCI image's lowers (each
// already checked) with the config and manifest the source described.
void install(cache_ptr self, const std::string& ref) {
  auto& s = self->state;
  auto& job = s.fetches.at(ref);
  auto parsed = parse_layer_ref(ref);
  expected<import_result> r = make_error(errc::invalid_argument, "nothing fetched");
  if (job.meta.lowers.empty()) {
    r = s.eng->layers().import(job.kind, *parsed, job.meta.digest, job.meta.size,
                               job.meta.created, job.meta.source, std::move(*job.file),
                               job.meta.on);
    job.file.reset();
  } else {
    std::vector<image_lower> lowers;
    for (size_t i = 0; i < job.meta.lowers.size(); ++i) {
      image_lower l;
      l.digest = job.meta.lowers[i];
      l.size = job.meta.lower_sizes[i];
      for (size_t b = 0; b < job.blobs.size(); ++b)
        if (job.blobs[b].digest == l.digest)
          l.image = job.done[b].path(); // fetched; else stored already
      lowers.push_back(std::move(l));
    }
    r = s.eng->layers().commit_image(*parsed, std::move(lowers), job.meta.config,
                                     job.meta.manifest, job.meta.source);
    job.done.clear();
  }
  // A layer of that name built here meanwhile: the acquire uses the local one.
  if (!r && r.error_value().code != errc::already_exists)
    return fail_fetch(self, ref, r.error_value().code,
                      "cannot install it: " + r.error_value().to_string());
  ++s.fetched;
  s.fetched_bytes += job.bytes;
  end_fetch(self, ref, std::nullopt);
}

// Checks what the staged file holds against what the source described; then
// the next blob, or the install.
void finish_blob(cache_ptr self, const std::string& ref) {
  auto& s = self->state;
  auto& job = s.fetches.at(ref);
  auto& file = *job.file;
  const auto& want = job.blobs[job.current];
  if (file.size() != want.size)
    return fail_fetch(self, ref, errc::malformed,
                      "size mismatch: got " + std::to_string(file.size()) + " bytes of "
                        + want.digest + ", the source described " + std::to_string(want.size));
  if (file.digest() != want.digest)
    return fail_fetch(self, ref, errc::malformed,
                      "digest mismatch: the bytes received hash to " + file.digest()
                        + ", the source described " + want.digest);
  job.bytes += want.size;
  if (job.meta.lowers.empty())
    return install(self, ref);
  job.done.push_back(std::move(file));
  job.file.reset();
  if (++job.current < job.blobs.size())
    return start_blob(self, ref);
  install(self, ref);
}

// A chunk arrived: written (and hashed) in order, early ones kept until their turn.
void on_chunk(cache_ptr self, const std::string& ref, uint64_t job_id, uint64_t offset,
              uint32_t length, std::string& data) {
  auto& s = self->state;
  auto it = s.fetches.find(ref);
  if (it == s.fetches.end() || it->second.id != job_id)
    return; // that fetch failed already
  auto& job = it->second;
  --job.in_flight;
  if (data.size() != length)
    return fail_fetch(self, ref, errc::malformed,
                      "size mismatch: the source sent " + std::to_string(data.size())
                        + " bytes at offset " + std::to_string(offset) + " of "
                        + job.blobs[job.current].digest + ", not " + std::to_string(length)
                        + " (its image is not the size it described)");
  job.early.emplace(offset, std::move(data));
  while (!job.early.empty() && job.early.begin()->first == job.file->size()) {
    auto& chunk = job.early.begin()->second;
    if (auto w = job.file->append(chunk.data(), chunk.size()); !w)
      return fail_fetch(self, ref, w.error_value().code,
                        "cannot write it: " + w.error_value().to_string());
    job.early.erase(job.early.begin());
  }
  if (job.file->size() == job.blobs[job.current].size && job.in_flight == 0)
    return finish_blob(self, ref);
  pump(self, ref);
}

// Keeps up to fetches_in_flight chunk requests going.
void pump(cache_ptr self, const std::string& ref) {
  auto& job = self->state.fetches.at(ref);
  const auto& want = job.blobs[job.current];
  while (job.in_flight < fetches_in_flight && job.next_offset < want.size) {
    auto offset = job.next_offset;
    auto length = static_cast<uint32_t>(std::min<uint64_t>(fetch_chunk, want.size - offset));
    job.next_offset += length;
    ++job.in_flight;
    self
      ->request(job.from, fetch_timeout, fetch_atom::value, self->state.key, want.digest,
                offset, length)
      .then(
        [=, id = job.id](const internal_key& k, std::string& data) {
          if (!genuine(k, self->state.key, "a reply to fetch")) {
            auto it = self->state.fetches.find(ref);
            if (it != self->state.fetches.end() && it->second.id == id)
              fail_fetch(self, ref, errc::unauthorized,
                         "a reply to a fetch did not carry the cluster's key");
            return;
          }
          on_chunk(self, ref, id, offset, length, data);
        },
        [=, id = job.id](caf::error& e) {
          auto it = self->state.fetches.find(ref);
          if (it != self->state.fetches.end() && it->second.id == id)
            fail_request(self, ref, e);
        });
  }
}

// The source described the layer: check the description, stage a file, fetch.
void on_described(cache_ptr self, const std::string& ref, layer_meta& meta) {
  auto& s = self->state;
  auto& job = s.fetches.at(ref);
  if (meta.ref != ref)
    return fail_fetch(self, ref, errc::malformed,
                      "it described layer '" + meta.ref.substr(0, 300) + "' instead");
  if (!store::is_digest(meta.digest))
    return fail_fetch(self, ref, errc::malformed,
                      "it described a malformed digest '" + meta.digest.substr(0, 80) + "'");
  auto kind = parse_layer_kind(meta.kind);
  if (!kind)
    return fail_fetch(self, ref, errc::malformed, kind.error_value().message);
  job.blobs.clear();
  if (meta.lowers.empty()) {
    job.blobs.push_back({meta.digest, meta.size});
  } else {
    // An OCI image: its lowers, topmost first, the top one its digest.
    if (*kind != layer_kind::base || meta.lowers.size() != meta.lower_sizes.size()
        || meta.lowers.front() != meta.digest)
      return fail_fetch(self, ref, errc::malformed,
                        "it described an image whose lowers do not match its digest, sizes "
                        "or kind");
    for (size_t i = 0; i < meta.lowers.size(); ++i) {
      const auto& d = meta.lowers[i];
      if (!store::is_digest(d))
        return fail_fetch(self, ref, errc::malformed,
                          "it described a malformed lower digest '" + d.substr(0, 80) + "'");
      bool listed = false;
      for (const auto& b : job.blobs)
        listed = listed || b.digest == d;
      if (!listed && !s.eng->layers().open_blob(d)) // a lower twice, or stored already
        job.blobs.push_back({d, meta.lower_sizes[i]});
    }
  }
  job.meta = std::move(meta);
  job.kind = *kind;
  job.current = 0;
  if (job.blobs.empty()) // every lower is stored already
    return install(self, ref);
  start_blob(self, ref);
}

void start_blob(cache_ptr self, const std::string& ref) {
  auto& job = self->state.fetches.at(ref);
  auto file = self->state.eng->layers().stage("fetch");
  if (!file)
    return fail_fetch(self, ref, file.error_value().code,
                      "cannot stage it: " + file.error_value().to_string());
  job.file.emplace(std::move(*file));
  job.next_offset = 0;
  job.early.clear();
  if (job.blobs[job.current].size == 0)
    return finish_blob(self, ref);
  pump(self, ref);
}

// Starts the fetch of `ref` from `from` (which must not run yet).
void start_fetch(cache_ptr self, const std::string& ref, layer_store_actor from,
                 std::string from_name);

// Makes acquire `id` wait for the fetch of `ref`, starting it from the
// layer source unless it runs.
void join_fetch(cache_ptr self, const std::string& ref, uint64_t id) {
  auto& s = self->state;
  if (auto it = s.fetches.find(ref); it == s.fetches.end())
    start_fetch(self, ref, s.source, s.source_name);
  s.fetches[ref].waiters.push_back(id);
}

void start_fetch(cache_ptr self, const std::string& ref, layer_store_actor from,
                 std::string from_name) {
  auto& s = self->state;
  auto& job = s.fetches[ref];
  job.id = s.next_job++;
  job.from = std::move(from);
  job.from_name = std::move(from_name);
  self->request(job.from, fetch_timeout, describe_atom::value, s.key, ref)
    .then([=, id = job.id](const internal_key& k, layer_meta& meta) {
            if (genuine(k, self->state.key, "a reply to describe")) {
              on_described(self, ref, meta);
              return;
            }
            auto it = self->state.fetches.find(ref);
            if (it != self->state.fetches.end() && it->second.id == id)
              fail_fetch(self, ref, errc::unauthorized,
                         "the reply describing it did not carry the cluster's key");
          },
          [=, id = job.id](caf::error& e) {
            auto& s = self->state;
            auto it = s.fetches.find(ref);
            if (it == s.fetches.end() || it->second.id != id)
              return;
            if (e.category() == error_category
                && static_cast<errc>(e.code()) == errc::not_found)
              return end_fetch(self, ref,
                               make_error(errc::not_found,
                                          "unknown layer " + ref
                                            + ": neither this node's store nor its layer "
                                              "source ("
                                            + name_of(it->second.from, it->second.from_name) + ") has it"));
            fail_request(self, ref, e);
          });
}

// Every acquire waiting for a fetch fails: the cache is going away.
void fail_waiting(cache_ptr self, const std::string& why) {
  auto& s = self->state;
  for (auto& [id, w] : s.waiting)
    w.rp.deliver(to_caf(make_error(errc::disconnected, why)));
  s.waiting.clear();
  for (auto& [ref, job] : s.fetches)
    for (auto& c : job.copies)
      c.deliver(to_caf(make_error(errc::disconnected, why)));
  s.fetches.clear();
}

layer_cache_actor::behavior_type layer_cache_impl(cache_ptr self, engine* eng,
                                                  uint64_t budget, internal_key key) {
  self->state.eng = eng;
  self->state.budget = budget;
  self->state.key = key;
  // A source that goes away fails its fetches now, not at their timeouts.
  self->set_down_handler([=](caf::down_msg& dm) {
    std::vector<std::string> gone;
    for (auto& [ref, job] : self->state.fetches)
      if (job.from && job.from.address() == dm.source
          && really_down(job.from, "a down message of a layer source"))
        gone.push_back(ref);
    for (auto& ref : gone)
      fail_fetch(self, ref, errc::disconnected,
                 "the source is gone: " + in_words(dm.reason));
  });
  self->set_exit_handler([=](caf::exit_msg& em) {
    fail_waiting(self, "the node's layer cache stopped while the layers were fetched");
    self->quit(em.reason);
  });
  return {
    [=](acquire_atom, const internal_key& k,
        const environment& env) -> caf::result<internal_key, layer_set> {
      auto& s = self->state;
      if (!genuine(k, process_key(), "acquire (layer cache)"))
        return refuse("acquire");
      auto r = s.acquire(env);
      if (r)
        return {process_key(), std::move(*r)};
      // A layer the store lacks comes from the source, if there is one.
      if (r.error_value().code != errc::not_found || !s.source)
        return to_caf(r.error_value());
      auto lacking = s.missing(env);
      if (lacking.empty())
        return to_caf(r.error_value());
      auto id = s.next_waiter++;
      auto& w = s.waiting[id];
      w.env = env;
      w.rp = self->make_response_promise<internal_key, layer_set>();
      w.pending = lacking.size();
      auto rp = w.rp;
      for (const auto& ref : lacking)
        join_fetch(self, ref, id);
      return rp;
    },
    [=](release_atom, const internal_key& k, uint64_t lease) {
      if (genuine(k, process_key(), "release (layer cache)"))
        self->state.release(lease);
    },
    [=](copy_atom, const internal_key& k, const std::string& ref, layer_store_actor& from,
        std::string& from_name) -> caf::result<internal_key, bool> {
      auto& s = self->state;
      if (!genuine(k, process_key(), "copy (layer cache)"))
        return refuse("copy");
      auto parsed = parse_layer_ref(ref);
      if (!parsed)
        return to_caf(parsed.error_value());
      if (s.eng->layers().find(*parsed))
        return {process_key(), false};
      if (!from)
        return to_caf(make_error(errc::invalid_argument, "copy " + ref + ": no layer store"));
      auto rp = self->make_response_promise<internal_key, bool>();
      if (!s.fetches.count(ref)) {
        self->monitor(from); // a node that goes fails the copy at once
        start_fetch(self, ref, std::move(from), std::move(from_name));
      }
      s.fetches[ref].copies.push_back(rp);
      return rp;
    },
    [=](source_atom, const internal_key& k, layer_store_actor& src, std::string& name) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "source (layer cache)"))
        return;
      if (src && src != s.source)
        self->monitor(src);
      s.source = std::move(src);
      s.source_name = std::move(name);
    },
    [=](list_atom,
        const internal_key& k) -> caf::result<std::vector<std::string>, uint64_t, uint64_t> {
      auto& s = self->state;
      if (!genuine(k, process_key(), "list (layer cache)"))
        return refuse("list");
      std::vector<std::string> refs;
      if (auto all = s.eng->layers().list())
        for (auto& l : *all)
          refs.push_back(l.ref.to_string());
      return {std::move(refs), s.fetched, s.fetched_bytes};
    },
    [=](stats_atom,
        const internal_key& k) -> caf::result<uint32_t, uint64_t, uint64_t, uint64_t> {
      auto& s = self->state;
      if (!genuine(k, process_key(), "stats (layer cache)"))
        return refuse("stats");
      return {static_cast<uint32_t>(s.mounts.size()), s.bytes, s.budget, s.evicted};
    },
  };
}

} // namespace

layer_cache_actor spawn_layer_cache(caf::actor_system& sys, engine& eng, uint64_t budget,
                                    internal_key key) {
  return sys.spawn(layer_cache_impl, &eng, budget, key);
}

} // namespace dsec

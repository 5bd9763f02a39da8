#include "actors/scheduler.hpp"
#include "runtime/log.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/config_value.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <sys/random.h>
#include <sys/stat.h>

#include <cstdio>
#include <ctime>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <atomic>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "actors/cluster_map.hpp"
#include "actors/sandbox_id.hpp"
#include "actors/session.hpp"
#include "actors/trajectory.hpp"
#include "actors/types.hpp"
#include "actors/warm_pool.hpp"
#include "runtime/clock.hpp"
#include "runtime/metrics.hpp"

namespace dsec {

namespace {

// ---- the coordinator's view of the cluster, for /metrics --------------------
// (runtime/metrics.hpp, docs/observability.md). The scheduler writes atomics;
// a scrape reads them on its own thread, and computes the heartbeat ages.
struct place_job; // one create being placed over the cluster (below)

struct cluster_view {
  struct node {
    std::atomic<bool> up{false};
    std::atomic<int64_t> last_beat_ns{0}; // steady clock
    std::atomic<uint32_t> slots{0}, live{0};
    std::atomic<uint64_t> created{0}, destroyed{0}, failed{0}; // since the node started
    std::atomic<bool> cordoned{false};
    // Its create latency since it started (node_report.create_buckets),
    // under cluster_view::mu.
    std::vector<uint64_t> create_buckets;
    double create_sum = 0;
  };
  std::mutex mu; // guards the map and the latencies, not the atomics
  std::map<std::string, std::unique_ptr<node>> nodes; // by name; lost ones stay, down
  uint64_t handle = 0;

  node& of(const std::string& name) {
    std::lock_guard<std::mutex> g{mu};
    auto& p = nodes[name];
    if (!p)
      p = std::make_unique<node>();
    return *p;
  }
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
  }
  void beat(const std::string& name, const node_report& rep) {
    auto& n = of(name);
    n.up = true;
    n.last_beat_ns = now_ns();
    n.slots = rep.slots;
    n.live = rep.live;
    n.created = rep.created;
    n.destroyed = rep.destroyed;
    n.failed = rep.failed;
    n.cordoned = rep.cordoned;
    std::lock_guard<std::mutex> g{mu};
    n.create_buckets = rep.create_buckets;
    n.create_sum = rep.create_sum;
  }
  void collect(std::vector<metrics::sample_family>& out) {
    metrics::sample_family up{"dsec_cluster_node_up",
                              "1 while a node of the cluster is up, 0 once it is lost.",
                              "gauge", {}},
      age{"dsec_cluster_node_heartbeat_age_seconds",
          "Seconds since the coordinator's last heartbeat from a node that is up.", "gauge", {}},
      slots{"dsec_cluster_node_slots", "A node's slots, as its last heartbeat said.", "gauge",
            {}},
      live{"dsec_cluster_node_live", "A node's live sandboxes, as its last heartbeat said.",
           "gauge", {}},
      cordoned{"dsec_cluster_node_cordoned", "1 while a node is cordoned or draining.",
               "gauge", {}},
      created{"dsec_cluster_node_creates_total",
              "Sandboxes a node made ready since it started, as its last heartbeat said.",
              "counter", {}},
      destroyed{"dsec_cluster_node_destroys_total",
                "Sandboxes of a node that ended since it started, as its last heartbeat said.",
                "counter", {}},
      failed{"dsec_cluster_node_failures_total",
             "Sandboxes a node refused or lost before they were ready, as its last heartbeat "
             "said.",
             "counter", {}};

    auto now = now_ns();
    {
      std::lock_guard<std::mutex> g{mu};
      for (const auto& [name, n] : nodes) {
        metrics::labels l{{"node", name}};
        bool on = n->up;
        up.samples.emplace_back(l, on ? 1 : 0);
        if (on)
          age.samples.emplace_back(l, static_cast<double>(now - n->last_beat_ns) / 1e9);
        slots.samples.emplace_back(l, n->slots.load());
        live.samples.emplace_back(l, n->live.load());
        cordoned.samples.emplace_back(l, n->cordoned ? 1 : 0);
        created.samples.emplace_back(l, static_cast<double>(n->created.load()));
        destroyed.samples.emplace_back(l, static_cast<double>(n->destroyed.load()));
        failed.samples.emplace_back(l, static_cast<double>(n->failed.load()));
      }
    }
    for (auto* f : {&up, &age, &slots, &live, &cordoned, &created, &destroyed, &failed})
      out.push_back(std::move(*f));
    out.push_back(create_latency());
  }

  // The cluster's create latency: the nodes' histograms (those up) summed,
  // in dsec_sandbox_create_seconds' buckets; no node label (one series).
  metrics::sample_family create_latency() {
    const auto& bounds = metrics::latency_buckets();
    std::vector<uint64_t> sum(bounds.size() + 1, 0);
    double seconds = 0;
    {
      std::lock_guard<std::mutex> g{mu};
      for (const auto& [name, n] : nodes) {
        if (!n->up || n->create_buckets.size() != sum.size())
          continue;
        for (size_t i = 0; i < sum.size(); ++i)
          sum[i] += n->create_buckets[i];
        seconds += n->create_sum;
      }
    }
    metrics::sample_family h{"dsec_cluster_create_seconds",
                             "From a sandbox's admission by its node to its being ready, over "
                             "every node of the cluster that is up (their heartbeats).",
                             "histogram", {}};
    for (size_t i = 0; i < sum.size(); ++i) {
      h.samples.emplace_back(
        metrics::labels{{"le", i < bounds.size() ? metrics::format_value(bounds[i]) : "+Inf"}},
        static_cast<double>(sum[i]));
      h.suffixes.push_back("_bucket");
    }
    h.samples.emplace_back(metrics::labels{}, seconds);
    h.suffixes.push_back("_sum");
    h.samples.emplace_back(metrics::labels{}, static_cast<double>(sum.back()));
    h.suffixes.push_back("_count");
    return h;
  }
};


struct scheduler_state {
  static inline const char* name = "dsec.scheduler";

  scheduler_config cfg;
  std::unordered_map<std::string, session_actor> sessions;
  /// Sandboxes of resumed sessions, by id: served through their session,
  /// which answers from the log or rebuilds them.
  std::unordered_map<std::string, std::string> resumed;
  /// The names of live sessions (`session open --name`), each naming one
  /// session: lookup takes a name wherever it takes an id.
  std::unordered_map<std::string, std::string> session_names;
  /// What `sessions` says of each live session (by id).
  std::unordered_map<std::string, session_summary> summaries;
  bool shutting_down = false;
  /// When it started: a coordinator's nodes (re)join in its first seconds.
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  // ---- the cluster (a coordinator's) ----
  struct member {
    std::string name;
    node_actor node;
    layer_store_actor store;
    caf::node_id where;
    node_report last;                 // its last heartbeat, without the layers
    std::vector<std::string> layers;  // the last full list it sent
    uint64_t joined_ms = 0;
    bool local = false;               // the coordinator's own node
  };
  std::unordered_map<uint32_t, member> members; // by cluster_map id
  std::unordered_map<std::string, uint32_t> by_name;
  std::map<caf::actor_addr, uint32_t> by_addr;
  cluster_map map;
  std::deque<member_info> lost; // the latest, for `cluster status`
  /// Create requests being placed: a node lost while it has a piece of one
  /// unanswered gives that piece back at once (see lose()).
  std::vector<std::weak_ptr<place_job>> placing;
  std::shared_ptr<cluster_view> view; // a coordinator's, in the process's /metrics

  // ---- by_id's routes ----
  /// Where by_id found a sandbox: its actor, and its session's id (empty:
  /// the request goes straight to the sandbox). A sandbox is looked up once
  /// and then served from here until its actor goes (a monitor): a
  /// command's stdin pieces go on in the order they came, with no lookup
  /// each (issue 20).
  struct route {
    sandbox_actor sb;
    std::string session;
  };
  using route_fn = std::function<void(const route*, const caf::error&)>;
  std::unordered_map<std::string, route> routes;
  std::map<caf::actor_addr, std::string> route_ids; // the monitored sandboxes
  /// Calls for an id being looked up, in the order they came.
  std::unordered_map<std::string, std::vector<route_fn>> resolving;

  ~scheduler_state() {
    if (view)
      metrics::process_registry().remove_collector(view->handle);
  }
};

using self_ptr = scheduler_actor::stateful_pointer<scheduler_state>;

// Why the scheduler refuses to resume or reattach session `id` (`verb`):
// shutting down, a malformed id, or a node of a cluster (its coordinator
// serves sessions); nothing when it may.
std::optional<error> refuse_session_verb(const scheduler_state& s, const std::string& id,
                                         const char* verb) {
  if (s.shutting_down)
    return make_error(errc::overloaded, "the daemon is shutting down");
  if (auto v = check_name(id, "a session id"); !v)
    return v.error_value();
  if (!s.cfg.joined.empty())
    return make_error(errc::unsupported, "node " + s.cfg.name + " belongs to the cluster of "
                                           + s.cfg.joined + ": " + verb + " sessions there");
  return std::nullopt;
}

// The scheduler's levels for /metrics: its sessions (not its default one) and
// what waits in its mailbox, sampled by its busiest handlers.
void publish(self_ptr self) {
  auto& r = metrics::process_registry();
  static auto& sessions = r.get_gauge("dsec_sessions", "Sessions open at the scheduler.");
  static auto& mailbox = r.get_gauge(
    "dsec_mailbox_messages",
    "Messages waiting in an actor's mailbox when it last looked (the nodes' summed).",
    {{"actor", "scheduler"}});
  auto n = self->state.sessions.size();
  sessions.set(static_cast<double>(n > 0 ? n - 1 : 0));
  mailbox.set(static_cast<double>(self->mailbox().size()));
}

// The names of the backends a node's report offers.
std::vector<std::string> offer_names(const node_report& rep) {
  std::vector<std::string> out;
  out.reserve(rep.backends.size());
  for (const auto& b : rep.backends)
    out.push_back(b.name);
  return out;
}

// Sends an operator's verb (cordon, drain) to the node named `name`: one of
// a coordinator's members, or a plain daemon's own node. A cordon takes
// effect in the coordinator's placement at once (and from the node's
// reports after).
template <class Atom, class Arg>
caf::result<uint32_t> operate(self_ptr self, const std::string& name, const char* verb,
                              caf::duration timeout, Atom atom, Arg arg) {
  auto& s = self->state;
  node_actor node;
  uint32_t id = 0;
  if (s.cfg.coordinator) {
    auto it = s.by_name.find(name);
    if (it == s.by_name.end()) {
      std::string names;
      for (const auto& [n, i] : s.by_name)
        names += (names.empty() ? "" : ", ") + n;
      return to_caf(make_error(errc::not_found, std::string{verb} + ": no node " + name
                                                  + " in the cluster (nodes up: "
                                                  + (names.empty() ? "none" : names) + ")"));
    }
    id = it->second;
    node = s.members.at(id).node;
  } else {
    if (name != s.cfg.name)
      return to_caf(make_error(errc::not_found, std::string{verb} + ": this dsecd is node "
                                                  + s.cfg.name + ", not " + name));
    node = s.cfg.node;
  }
  bool cordon = true;
  if constexpr (std::is_same_v<Atom, cordon_atom>)
    cordon = arg;
  if (id)
    s.map.cordon(id, cordon);
  auto rp = self->make_response_promise<uint32_t>();
  self->request(node, timeout, atom, s.cfg.key, arg)
    .then(
      [=](const internal_key& k, uint32_t n) mutable {
        if (!genuine(k, self->state.cfg.key, "a reply to cordon or drain"))
          rp.deliver(to_caf(unauthorized("a reply to cordon or drain")));
        else
          rp.deliver(n);
      },
      [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
  return rp;
}

caf::error not_coordinator(self_ptr self) {
  return to_caf(make_error(errc::unsupported,
                           "dsecd " + self->state.cfg.name
                             + " is not a cluster's coordinator (start it with --coordinator)"));
}

void give_back(self_ptr self, uint32_t id, const std::string& name, const std::string& why);

// A node leaves the cluster: lost (no heartbeat, connection gone) or replaced
// by a new process under its name. Every session hears it (its sandboxes
// there are gone); the map stops placing there.
void lose(self_ptr self, uint32_t id, const std::string& why) {
  auto& s = self->state;
  auto it = s.members.find(id);
  if (it == s.members.end())
    return;
  auto m = std::move(it->second);
  s.members.erase(it);
  if (auto n = s.by_name.find(m.name); n != s.by_name.end() && n->second == id)
    s.by_name.erase(n);
  s.by_addr.erase(m.node.address());
  s.map.remove(id);
  self->demonitor(m.node.address());
  // Its sandboxes are looked up again (a hung node's would not answer).
  for (auto r = s.route_ids.begin(); r != s.route_ids.end();) {
    if (r->first.node() != m.node.node()) {
      ++r;
      continue;
    }
    self->demonitor(r->first);
    s.routes.erase(r->second);
    r = s.route_ids.erase(r);
  }
  if (s.view)
    s.view->of(m.name).up = false;
  std::printf("dsecd: node %s lost: %s\n", m.name.c_str(), why.c_str());
  std::fflush(stdout);
  log::write(log::level::warn, "cluster", "node lost", {{"node", m.name}, {"why", why}});
  member_info info;
  info.name = m.name;
  info.state = "lost";
  {
    char when[32] = "";
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
    info.why = why + " (" + when + ")";
  }
  info.coordinator = m.local;
  info.last = std::move(m.last);
  info.joined_ms = m.joined_ms;
  // One row per name: its latest loss.
  std::erase_if(s.lost, [&](const member_info& l) { return l.name == info.name; });
  s.lost.push_back(std::move(info));
  while (s.lost.size() > 32)
    s.lost.pop_front();
  for (auto& [sid, sess] : s.sessions)
    caf::anon_send(sess, lost_atom::value, process_key(), m.where, m.name, why);
  give_back(self, id, m.name, why);
}

// One create request being placed over the cluster, piece by piece.
struct place_job {
  environment env;
  session_actor session;
  placement pl;
  cluster_map::batch batch;
  uint32_t piece = 1;
  uint32_t left = 0;
  uint32_t admitted = 0;
  uint32_t outstanding = 0;
  uint32_t refusals = 0;
  bool done = false;
  std::string why; // the last refusal
  /// The pieces sent and not yet answered: number -> (node id, sandboxes).
  /// One its node was lost with is dropped from here; its answer, should it
  /// come, is then ignored.
  std::map<uint64_t, std::pair<uint32_t, uint32_t>> pieces;
  uint64_t next_piece = 0;
  caf::typed_response_promise<internal_key, uint32_t> rp;
};

void place_more(self_ptr self, const std::shared_ptr<place_job>& job);

// Node `id` was lost: each create with a piece there unanswered places that
// piece elsewhere, rather than waiting out the spawn's 30 s timeout (a node
// cut off by the network does not answer, and its connection stays open).
// Sandboxes the node did make for it report ready to their session from a
// lost node, and the session destroys them.
void give_back(self_ptr self, uint32_t id, const std::string& name, const std::string& why) {
  auto& s = self->state;
  std::vector<std::shared_ptr<place_job>> hit;
  std::erase_if(s.placing, [](const auto& w) { return w.expired(); });
  for (auto& w : s.placing) {
    auto job = w.lock();
    bool any = false;
    for (auto it = job->pieces.begin(); it != job->pieces.end();) {
      if (it->second.first != id) {
        ++it;
        continue;
      }
      job->left += it->second.second;
      --job->outstanding;
      ++job->refusals;
      it = job->pieces.erase(it);
      any = true;
    }
    if (any) {
      job->why = "node " + name + " was lost (" + why + ")";
      hit.push_back(std::move(job));
    }
  }
  for (auto& job : hit)
    place_more(self, job);
}

// How long `list` waits for each node: one that does not answer in time is
// named in the reply instead of holding up the others' sandboxes.
constexpr auto list_wait = std::chrono::seconds(3);

// Refusals (a node full after all, or unreachable) a request may meet before
// what is left of it fails.
constexpr uint32_t max_refusals = 16;

// The member (its map id) that sandbox actor `sb` runs on; 0: none now.
uint32_t member_of(const scheduler_state& s, const sandbox_actor& sb) {
  for (const auto& [id, m] : s.members)
    if (m.where == sb.node())
      return id;
  return 0;
}

void place_more(self_ptr self, const std::shared_ptr<place_job>& job) {
  auto& s = self->state;
  while (job->left > 0 && job->refusals < max_refusals) {
    auto id = s.map.pick(job->batch);
    if (!id)
      break;
    auto* n = s.map.find(id);
    // free() is 0 for a node picked on its report alone (may_have_room): one.
    uint32_t k = std::min({job->piece, job->left, std::max(n->free(), 1u)});
    s.map.placed(id, k, job->batch.refs);
    s.map.claimed(id, job->batch, k);
    job->left -= k;
    ++job->outstanding;
    auto piece = job->next_piece++;
    job->pieces.emplace(piece, std::make_pair(id, k));
    const auto& m = s.members.at(id);
    auto where = m.where;
    auto name = m.name;
    self
      ->request(m.node, std::chrono::seconds(30), spawn_atom::value, s.cfg.key, job->env, k,
                job->session, job->pl)
      .then(
        [=](const internal_key& key, uint32_t got) {
          if (job->pieces.erase(piece) == 0)
            return; // given back when its node was lost
          --job->outstanding;
          if (!genuine(key, self->state.cfg.key, "a reply to spawn")) {
            // Not the node's answer: what it admitted is not known. Count
            // none: the sandboxes it did admit still report to the session.
            got = 0;
          }
          job->admitted += got;
          if (got > 0)
            caf::anon_send(job->session, placed_atom::value, process_key(), job->pl.request,
                           where, got);
          if (got < k) {
            self->state.map.full(id);
            job->left += k - got;
            ++job->refusals;
            job->why = "node " + name + " refused " + std::to_string(k - got) + " (full)";
          }
          place_more(self, job);
        },
        [=](caf::error& e) {
          if (job->pieces.erase(piece) == 0)
            return;
          --job->outstanding;
          self->state.map.full(id);
          job->left += k;
          ++job->refusals;
          job->why = "node " + name + ": " + from_caf(e).message;
          place_more(self, job);
        });
  }
  if (job->outstanding > 0 || job->done)
    return;
  job->done = true;
  if (job->left > 0) {
    auto msg = s.map.size() == 0
                 ? std::string{"no node has joined the cluster"}
                 : "the cluster has no free slot for " + std::to_string(job->left)
                     + " more sandboxes (" + std::to_string(s.map.size())
                     + (s.map.size() == 1 ? " node up" : " nodes up")
                     + (job->why.empty() ? std::string{} : "; " + job->why) + ")";
    // A coordinator just (re)started: its nodes may not have joined yet.
    auto age = std::chrono::steady_clock::now() - s.started;
    if (age < std::chrono::seconds(10))
      msg += "; the coordinator started "
             + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(age).count())
             + " ms ago and its nodes may still be joining: retry";
    auto e = to_caf(make_error(errc::overloaded, msg));
    for (uint32_t i = 0; i < job->left; ++i)
      caf::anon_send(job->session, failed_atom::value, s.cfg.key, e, job->pl.request);
  }
  job->rp.deliver(s.cfg.key, job->admitted);
}

// Finds a sandbox by id: on the node, or (a coordinator) on the node its id
// names (actors/sandbox_id.hpp), else on whichever node has it, asking all the
// others at once (a sandbox a resumed session rebuilt elsewhere).
template <class Found, class Fail>
void find_box(self_ptr self, const std::string& id, Found found, Fail fail, bool named_only);

template <class Found, class Fail>
void find_box(self_ptr self, const std::string& id, Found found, Fail fail) {
  auto& s = self->state;
  if (!s.cfg.coordinator)
    return find_box(self, id, std::move(found), std::move(fail), false);
  bool any = false;
  for (const auto& [mid, m] : s.members)
    any = any || names_node(id, m.name);
  if (!any)
    return find_box(self, id, std::move(found), std::move(fail), false);
  find_box(self, id, found, [=](const caf::error&) mutable {
    find_box(self, id, found, fail, false); // not there: it may live elsewhere
  }, true);
}

template <class Found, class Fail>
void find_box(self_ptr self, const std::string& id, Found found, Fail fail, bool named_only) {
  auto& s = self->state;
  if (!s.cfg.coordinator) {
    self->request(s.cfg.node, std::chrono::seconds(30), lookup_atom::value, s.cfg.key, id)
      .then(
        [=](const internal_key& k, sandbox_actor& sb) mutable {
          if (genuine(k, self->state.cfg.key, "a reply to lookup"))
            found(sb);
          else
            fail(refuse("a reply to lookup"));
        },
        [=](caf::error& e) mutable { fail(e); });
    return;
  }
  struct pending {
    size_t left = 0;
    bool answered = false;
  };
  auto p = std::make_shared<pending>();
  for (const auto& [mid, m] : s.members)
    p->left += !named_only || names_node(id, m.name);
  if (p->left == 0) {
    fail(to_caf(make_error(errc::not_found, "no sandbox " + id + " (no node in the cluster)")));
    return;
  }
  for (auto& [mid, m] : s.members)
    if (!named_only || names_node(id, m.name))
    self->request(m.node, std::chrono::seconds(10), lookup_atom::value, s.cfg.key, id)
      .then(
        [=](const internal_key& k, sandbox_actor& sb) mutable {
          --p->left;
          if (!genuine(k, self->state.cfg.key, "a reply to lookup")) {
            if (p->left == 0 && !p->answered)
              fail(refuse("a reply to lookup"));
            return;
          }
          if (!p->answered) {
            p->answered = true;
            found(sb);
          }
        },
        [=](caf::error&) mutable {
          if (--p->left == 0 && !p->answered)
            fail(to_caf(make_error(errc::not_found,
                                   "no sandbox " + id
                                     + " in the cluster (one that lived on a lost node is gone"
                                       " with it: see `cluster status`)")));
        });
}

std::string new_session_id() {
  unsigned char b[4] = {};
  (void) ::getrandom(b, sizeof b, 0);
  static const char hex[] = "0123456789abcdef";
  std::string s = "s-";
  for (auto x : b) {
    s += hex[x >> 4];
    s += hex[x & 15];
  }
  return s;
}

// Calls `k` with where sandbox `id` is (scheduler_state::routes): at once
// when known, else once found, after the calls for it that came first.
// A sandbox whose list call fails is not remembered (it goes straight to the
// sandbox this once, which answers or is gone).
void with_route(self_ptr self, const std::string& id, scheduler_state::route_fn k) {
  using route = scheduler_state::route;
  auto& s = self->state;
  if (auto r = s.routes.find(id); r != s.routes.end())
    return k(&r->second, caf::error{});
  auto [w, fresh] = s.resolving.try_emplace(id);
  w->second.push_back(std::move(k));
  if (!fresh)
    return;
  auto finish = [self, id](const route* r, const caf::error& e) {
    auto& s = self->state;
    auto it = s.resolving.find(id);
    if (it == s.resolving.end())
      return;
    auto waiting = std::move(it->second);
    s.resolving.erase(it);
    for (auto& f : waiting)
      f(r, e);
  };
  find_box(
    self, id,
    [=](sandbox_actor& sb) {
      self->request(sb, std::chrono::seconds(30), list_atom::value, self->state.cfg.key)
        .then(
          [=](sandbox_info& info) {
            auto& s = self->state;
            auto addr = sb.address();
            if (s.route_ids.emplace(addr, id).second)
              self->monitor(sb);
            auto& r = s.routes[id] = route{sb, info.session};
            auto copy = r; // (a call may end the sandbox)
            finish(&copy, caf::error{});
          },
          [=](caf::error&) {
            route r{sb, {}};
            finish(&r, caf::error{});
          });
    },
    [=](caf::error e) { finish(nullptr, e); });
}

// A monitored sandbox went: its route is forgotten. False for another actor.
bool forget_route(scheduler_state& s, const caf::actor_addr& addr) {
  auto it = s.route_ids.find(addr);
  if (it == s.route_ids.end())
    return false;
  if (auto r = s.routes.find(it->second); r != s.routes.end() && r->second.sb.address() == addr)
    s.routes.erase(r);
  s.route_ids.erase(it);
  return true;
}

// Finds a sandbox and hands the request to it: through its session if that
// was resumed (it may not have been rebuilt yet), else through its session if
// that is here (one with a trajectory log records what its sandboxes do; one
// without hands the request straight on), else to the sandbox on its node.
template <class Result, class Atom, class... Ts>
caf::result<Result> by_id(self_ptr self, const std::string& id, Atom atom, Ts... xs) {
  auto rp = self->template make_response_promise<Result>();
  auto& s = self->state;
  if (auto r = s.resumed.find(id); r != s.resumed.end()) {
    if (auto sess = s.sessions.find(r->second); sess != s.sessions.end()) {
      rp.delegate(sess->second, atom, id, xs...);
      return rp;
    }
  }
  with_route(self, id, [=](const scheduler_state::route* r, const caf::error& e) mutable {
    if (!r) {
      rp.deliver(e);
      return;
    }
    auto& s = self->state;
    if (!r->session.empty())
      if (auto sess = s.sessions.find(r->session); sess != s.sessions.end()) {
        rp.delegate(sess->second, atom, id, xs...);
        return;
      }
    rp.delegate(r->sb, atom, s.cfg.key, xs...);
  });
  return rp;
}

// Like by_id, for the verbs only a session serves (snapshots, issue 16):
// snapshot and fork go to the sandbox's session.
template <class Result, class Atom, class... Ts>
caf::result<Result> via_session(self_ptr self, const std::string& id, Atom atom, Ts... xs) {
  auto rp = self->template make_response_promise<Result>();
  auto& s = self->state;
  if (auto r = s.resumed.find(id); r != s.resumed.end()) {
    if (auto sess = s.sessions.find(r->second); sess != s.sessions.end()) {
      rp.delegate(sess->second, atom, id, xs...);
      return rp;
    }
  }
  find_box(
    self, id,
      [=](sandbox_actor& sb) mutable {
        auto key = self->state.cfg.key;
        self->request(sb, std::chrono::seconds(30), list_atom::value, key)
          .then(
            [=](sandbox_info& info) mutable {
              auto& s = self->state;
              if (auto sess = s.sessions.find(info.session); sess != s.sessions.end())
                rp.delegate(sess->second, atom, id, xs...);
              else
                rp.deliver(to_caf(make_error(errc::not_found, "the session of sandbox " + id
                                                                + " (" + info.session
                                                                + ") is not on this daemon")));
            },
            [=](caf::error& e) mutable { rp.deliver(e); });
      },
      [=](caf::error e) mutable { rp.deliver(e); });
  return rp;
}

// Warm pools over the nodes (at the end of this file).
// The `sessions` verb: the live sessions, then the logs under the
// trajectories dir that no live session has (resumable), ordered by id. The
// dir is the daemon's own: nothing a sandbox controls is read.
std::vector<session_summary> list_sessions(const scheduler_state& s) {
  namespace fs = std::filesystem;
  auto log_ms = [](const fs::path& log) -> uint64_t {
    struct stat st {};
    if (::stat(log.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      return 0;
    return static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1'000'000;
  };
  std::vector<session_summary> out;
  for (const auto& [id, sum] : s.summaries) {
    out.push_back(sum);
    if (sum.trajectory && !s.cfg.trajectories.empty())
      out.back().log_ms = log_ms(fs::path{trajectory_dir(s.cfg.trajectories, id)} / "log");
  }
  if (!s.cfg.trajectories.empty()) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(s.cfg.trajectories, ec)) {
      auto id = e.path().filename().string();
      if (s.summaries.count(id))
        continue;
      if (auto t = log_ms(e.path() / "log"); t != 0)
        out.push_back({id, "", "resumable", false, true, 0, t});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const session_summary& a, const session_summary& b) { return a.id < b.id; });
  return out;
}

void spread_pool_to(self_ptr self, environment env, uint32_t size, session_actor owner,
                    std::string owner_id, std::function<void(caf::expected<uint32_t>)> done);
caf::typed_response_promise<uint32_t> spread_pool(self_ptr self, environment env, uint32_t size,
                                                  session_actor owner, std::string owner_id);
caf::typed_response_promise<std::vector<pool_info>> gather_pools(self_ptr self);

// Spawns session `id` and records it (sessions, and what `sessions` says of
// it): the daemon's default one, an opened one, or one resumed from `resume`.
// `log_dir`: it gets the trajectories dir (every session but the default).
session_actor start_session(self_ptr self, const std::string& id, session_options opts,
                            caf::actor trainer, std::shared_ptr<const trajectory_plan> resume,
                            bool log_dir, bool recovered = false, bool owned = false) {
  auto& s = self->state;
  s.summaries[id] = {id, opts.name, "live", static_cast<bool>(trainer) || owned,
                     opts.trajectory || resume != nullptr, opts.quota, 0};
  session_config sc;
  sc.id = id;
  sc.options = std::move(opts);
  sc.trainer = std::move(trainer);
  sc.scheduler = self;
  if (log_dir)
    sc.trajectories = s.cfg.trajectories;
  sc.resume = std::move(resume);
  sc.cluster = s.cfg.coordinator;
  sc.key = s.cfg.key;
  sc.recovered = recovered;
  sc.owned = owned || static_cast<bool>(sc.trainer);
  sc.reattach_grace = s.cfg.orphan_grace;
  if (log::enabled(log::level::info)) {
    auto client = sc.trainer ? to_string(sc.trainer.node()) : std::string{"none"};
    log::write(log::level::info, "session",
               recovered ? "rebuilt" : sc.resume ? "resumed" : "opened",
               {{"session", id}, {"name", sc.options.name}, {"client_node", client.substr(0, 12)},
                {"quota", std::to_string(sc.options.quota)},
                {"trajectory", sc.options.trajectory || sc.resume ? "yes" : "no"}});
  }
  auto sess = spawn_session(self->system(), std::move(sc));
  s.sessions.emplace(id, sess);
  return sess;
}

// A session a restarted coordinator rebuilds under its old id (docs/cluster.md,
// "When the coordinator dies"): from a node's report of the sandboxes it kept
// (no trainer yet: an owned one waits --orphan-grace for it), or from a
// trainer's reattach. Its name is taken back if nobody took it meanwhile.
session_actor recover_session(self_ptr self, const std::string& id, session_options opts,
                              bool owned, caf::actor trainer) {
  auto& s = self->state;
  if (opts.quota == 0)
    opts.quota = session_options{}.quota;
  opts.trajectory = false; // (one with a log is resumed instead: see reattach)
  if (!opts.name.empty() && (s.session_names.count(opts.name) || s.sessions.count(opts.name)))
    opts.name.clear();
  if (!opts.name.empty())
    s.session_names.emplace(opts.name, id);
  std::printf("dsecd: session %s rebuilt (%s)\n", id.c_str(),
              trainer ? "its trainer reattached" : "a node reported its sandboxes");
  std::fflush(stdout);
  auto sess = start_session(self, id, std::move(opts), std::move(trainer), nullptr, true, true,
                            owned);
  publish(self);
  return sess;
}

scheduler_actor::behavior_type scheduler_impl(self_ptr self, scheduler_config cfg) {
  self->state.cfg = std::move(cfg);
  {
    // The daemon's own session, for sandboxes the command line detaches
    // (`dsec run --detach` without --session): nobody owns it, so they live
    // until removed or until their TTL.
    session_options opts;
    opts.quota = 1u << 20;
    opts.name = "default";
    (void) start_session(self, "default", std::move(opts), caf::actor{}, nullptr, false);
  }
  if (self->state.cfg.trajectory_keep.count() > 0 && !self->state.cfg.trajectories.empty())
    self->send(self, ttl_atom::value, process_key());
  if (self->state.cfg.coordinator) {
    auto view = std::make_shared<cluster_view>();
    view->handle = metrics::process_registry().add_collector(
      [w = std::weak_ptr<cluster_view>(view)](std::vector<metrics::sample_family>& out) {
        if (auto v = w.lock())
          v->collect(out);
      });
    self->state.view = std::move(view);
    self->send(self, timeout_atom::value, process_key());
    self->set_down_handler([=](caf::down_msg& dm) {
      auto& s = self->state;
      if (forget_route(s, dm.source))
        return;
      auto it = s.by_addr.find(dm.source);
      if (it == s.by_addr.end()
          || !really_down(s.members.at(it->second).node, "a down message of a cluster's node"))
        return;
      // A process that died closes its connection at once, a heartbeat or
      // so after its last; a hung one (or a cut network) goes quiet first,
      // and its connection is dropped only after --client-timeout of silence
      // (the middleman's connection-timeout; when that is shorter than
      // --beat-timeout). Say which.
      int64_t quiet = -1;
      if (auto* n = s.map.find(it->second))
        quiet = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - n->last_report)
                  .count();
      auto drop_after = std::chrono::duration_cast<std::chrono::milliseconds>(
                          caf::get_or(self->system().config(), "middleman.connection-timeout",
                                      caf::timespan{s.cfg.beat_timeout}))
                          .count();
      std::string why;
      if (dm.reason != caf::exit_reason::remote_link_unreachable)
        why = "its node actor ended (" + in_words(dm.reason) + ")";
      else if (quiet >= 0 && quiet >= drop_after * 9 / 10)
        why = "no heartbeat for " + std::to_string(quiet)
              + " ms, then its connection timed out (the node hung, or the network failed)";
      else
        why = "its connection dropped (the process died, or the network failed)";
      lose(self, it->second, why);
    });
  } else {
    self->set_down_handler([=](caf::down_msg& dm) { (void) forget_route(self->state, dm.source); });
  }
  return {
    [=](ttl_atom, const internal_key& k) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "ttl (scheduler)"))
        return;
      for (const auto& what : expire_trajectories(s.cfg.trajectories, s.cfg.trajectory_keep,
                                                  [&](const std::string& id) {
                                                    return s.sessions.count(id) > 0;
                                                  }))
        std::printf("dsecd: removed %s\n", what.c_str());
      std::fflush(stdout);
      self->delayed_send(self, std::chrono::hours(1), ttl_atom::value, process_key());
    },
    [=](open_atom, session_options& opts,
        const caf::actor& trainer) -> caf::result<session_actor, std::string> {
      auto& s = self->state;
      if (s.shutting_down)
        return to_caf(make_error(errc::overloaded, "the daemon is shutting down"));
      if (!s.cfg.joined.empty())
        return to_caf(make_error(errc::unsupported,
                                 "node " + s.cfg.name + " belongs to the cluster of "
                                   + s.cfg.joined + ": open sessions there"));
      if (opts.quota == 0)
        return to_caf(make_error(errc::invalid_argument, "a session's quota must be at least 1"));
      if (!opts.name.empty()) {
        if (auto n = s.session_names.find(opts.name); n != s.session_names.end())
          return to_caf(make_error(errc::already_exists, "a session named " + opts.name
                                                           + " is open (" + n->second
                                                           + "): close it, or pick another name"));
        if (s.sessions.count(opts.name))
          return to_caf(make_error(errc::already_exists,
                                   "session name " + opts.name + " is the id of another session"));
      }
      auto id = new_session_id();
      // Not the id of a session that may still be resumed either.
      auto taken = [&](const std::string& x) {
        struct stat st {};
        return s.sessions.count(x) > 0
               || (!s.cfg.trajectories.empty()
                   && ::stat(trajectory_dir(s.cfg.trajectories, x).c_str(), &st) == 0);
      };
      while (taken(id))
        id = new_session_id();
      if (opts.trajectory && s.cfg.trajectories.empty())
        return to_caf(make_error(errc::unsupported,
                                 "this daemon keeps no trajectory logs (no state dir)"));
      if (!opts.name.empty())
        s.session_names.emplace(opts.name, id);
      auto sess = start_session(self, id, std::move(opts), trainer, nullptr, true);
      publish(self);
      return {sess, id};
    },
    [=](resume_atom, const std::string& id,
        const caf::actor& trainer) -> caf::result<session_actor, std::string> {
      auto& s = self->state;
      if (auto e = refuse_session_verb(s, id, "resume"))
        return to_caf(*e);
      if (s.sessions.count(id))
        return to_caf(make_error(errc::in_use, "session " + id
                                                 + " is live: use it, or close it, rather"
                                                   " than resume it"));
      if (s.cfg.trajectories.empty())
        return to_caf(make_error(errc::unsupported,
                                 "this daemon keeps no trajectory logs (no state dir)"));
      auto plan = load_trajectory(s.cfg.trajectories, id);
      if (!plan)
        return to_caf(plan.error_value());
      // Closed ones too: their session answers for them from the log.
      for (const auto& b : plan->boxes)
        s.resumed[b.id] = id;
      auto opts = plan->options;
      auto sess = start_session(self, id, std::move(opts), trainer,
                                std::make_shared<const trajectory_plan>(std::move(*plan)), true);
      publish(self);
      return {sess, id};
    },
    [=](reattach_atom, const std::string& id, session_options& opts, bool owned,
        const caf::actor& trainer) -> caf::result<session_actor, std::string> {
      auto& s = self->state;
      if (auto e = refuse_session_verb(s, id, "reattach"))
        return to_caf(*e);
      auto it = s.sessions.find(id);
      if (it != s.sessions.end()) {
        if (owned && trainer)
          caf::anon_send(it->second, reattach_atom::value, process_key(), trainer);
        if (owned)
          s.summaries[id].owned = true;
        return {it->second, id};
      }
      if (opts.quota == 0)
        return to_caf(make_error(errc::invalid_argument, "a session's quota must be at least 1"));
      if (opts.trajectory)
        return to_caf(make_error(errc::not_found,
                                 "session " + id + " is not live here: it keeps a trajectory "
                                 "log, resume it (docs/trajectory.md)"));
      return {recover_session(self, id, std::move(opts), owned, owned ? trainer : caf::actor{}),
              id};
    },
    [=](sessions_atom) -> std::vector<session_summary> {
      return list_sessions(self->state);
    },
    [=](lookup_atom, const std::string& id) -> caf::result<session_actor> {
      auto& s = self->state;
      auto it = s.sessions.find(id);
      if (it == s.sessions.end())
        if (auto n = s.session_names.find(id); n != s.session_names.end())
          it = s.sessions.find(n->second);
      if (it == s.sessions.end())
        return to_caf(make_error(errc::not_found, "no session " + id + " (neither an id nor the "
                                                                       "name of an open session)"));
      return it->second;
    },
    [=](place_atom, const internal_key& k, environment& env, uint32_t count,
        session_actor& session, placement& pl) -> caf::result<internal_key, uint32_t> {
      auto& s = self->state;
      if (!genuine(k, process_key(), "place (scheduler)"))
        return refuse("place");
      publish(self);
      if (!s.cfg.coordinator) {
        // One node: it gets everything (the node refuses what it has no slot for).
        return self->delegate(s.cfg.node, spawn_atom::value, s.cfg.key, std::move(env), count,
                              std::move(session), std::move(pl));
      }
      if (!s.map.offered(env.backend) && s.map.size() > 0)
        return to_caf(make_error(errc::unsupported,
                                 "no node of the cluster offers backend '" + env.backend + "'"));
      auto job = std::make_shared<place_job>();
      job->batch = cluster_map::make_batch(env.base, env.workdir, env.tools, env.backend,
                                           env.snapshot);
      // Where a ready pooled sandbox is, for what a node would claim one for
      // (actors/node.cpp, claim_pooled): the session's pools, then the nodes'.
      if (s.map.any_pooled() && poolable(env) && pl.id.empty() && pl.seed_pack.empty()
          && pl.seed_manifest.empty()) {
        auto key = pool_key(env);
        job->batch.own_pool = pl.session_id + "\n" + key;
        job->batch.node_pool = "node\n" + key;
      }
      job->env = std::move(env);
      job->session = std::move(session);
      job->pl = std::move(pl);
      job->pl.report_refusals = false; // placed elsewhere instead
      job->piece = s.map.piece_size(count);
      job->left = count;
      job->rp = self->make_response_promise<internal_key, uint32_t>();
      auto rp = job->rp;
      s.placing.push_back(job);
      if (job->pl.near.empty()) {
        place_more(self, job);
        return rp;
      }
      // Only on the node of sandbox `near` (a fork: its diff is there).
      auto near = job->pl.near;
      find_box(
        self, near,
        [=](sandbox_actor& sb) {
          auto& s = self->state;
          job->batch.only = member_of(s, sb);
          if (job->batch.only == 0) {
            job->why = "sandbox " + near + "'s node is not a member now";
            job->refusals = max_refusals; // nowhere to place them
          } else {
            job->why = "they go to node " + s.members.at(job->batch.only).name
                       + ", where sandbox " + near + " and its snapshot are";
          }
          place_more(self, job);
        },
        [=](caf::error e) {
          job->why = "sandbox " + near + ": " + from_caf(e).message;
          job->refusals = max_refusals;
          place_more(self, job);
        });
      return rp;
    },
    [=](copy_atom, const internal_key& k, const std::string& ref,
        const std::string& id) -> caf::result<internal_key, bool> {
      auto& s = self->state;
      if (!genuine(k, process_key(), "copy (scheduler)"))
        return refuse("copy");
      if (!s.cfg.coordinator || !s.cfg.cache)
        return {s.cfg.key, false}; // one node: its store is the only one
      auto rp = self->make_response_promise<internal_key, bool>();
      find_box(
        self, id,
        [=](sandbox_actor& sb) mutable {
          auto& s = self->state;
          auto mid = member_of(s, sb);
          const auto* from = mid != 0 ? &s.members.at(mid) : nullptr;
          if (!from || from->local || !from->store) {
            rp.deliver(s.cfg.key, false); // made here (or its node is gone)
            return;
          }
          self
            ->request(s.cfg.cache, caf::infinite, copy_atom::value, process_key(), ref,
                      from->store, "node " + from->name)
            .then(
              [=](const internal_key& k2, bool copied) mutable {
                if (!genuine(k2, process_key(), "a reply to copy"))
                  rp.deliver(refuse("a reply to copy"));
                else
                  rp.deliver(self->state.cfg.key, copied);
              },
              [=](caf::error& e) mutable { rp.deliver(e); });
        },
        [=](caf::error e) mutable { rp.deliver(e); });
      return rp;
    },
    [=](exec_atom, const std::string& id, const exec_request& req) {
      return by_id<exec_result>(self, id, exec_atom::value, req);
    },
    [=](put_atom, const std::string& id, const std::string& dir, const std::string& tar) {
      return by_id<uint64_t>(self, id, put_atom::value, dir, tar);
    },
    [=](get_atom, const std::string& id, const std::string& path) {
      return by_id<std::string>(self, id, get_atom::value, path);
    },
    [=](feedback_atom, const std::string& id, const chronus_feedback_msg& fb) {
      return by_id<bool>(self, id, feedback_atom::value, fb);
    },
    [=](logs_atom, const std::string& id, const logs_request& q) {
      return by_id<logs_reply>(self, id, logs_atom::value, q);
    },
    [=](usage_atom, const std::string& id, bool processes) {
      return by_id<sandbox_usage>(self, id, usage_atom::value, processes);
    },
    [=](signal_atom, const std::string& id, uint64_t eid, int32_t sig) {
      return by_id<bool>(self, id, signal_atom::value, eid, sig);
    },
    [=](stdin_atom, const std::string& id, uint64_t eid, std::string& data, bool close) {
      return by_id<uint64_t>(self, id, stdin_atom::value, eid, std::move(data), close);
    },
    [=](resize_atom, const std::string& id, uint64_t eid, uint16_t rows, uint16_t cols) {
      return by_id<bool>(self, id, resize_atom::value, eid, rows, cols);
    },
    [=](credit_atom, const std::string& id, uint64_t eid, uint64_t bytes) {
      return by_id<bool>(self, id, credit_atom::value, eid, bytes);
    },
    [=](destroy_atom, const std::string& id) {
      return by_id<bool>(self, id, destroy_atom::value);
    },
    [=](network_atom, const std::string& id, const std::vector<std::string>& allow,
        const std::vector<std::string>& deny) {
      return by_id<bool>(self, id, network_atom::value, allow, deny);
    },
    [=](expose_atom, const std::string& id, uint16_t port) {
      return by_id<exposed_port>(self, id, expose_atom::value, port);
    },
    // ---- snapshots (issue 16) ----
    [=](pause_atom, const std::string& id, bool on) {
      return by_id<bool>(self, id, pause_atom::value, on);
    },
    [=](snapshot_atom, const std::string& id, const std::string& ref) {
      return via_session<std::string>(self, id, snapshot_atom::value, ref);
    },
    [=](fork_atom, const std::string& id, uint32_t count, const caf::actor& listener) {
      return via_session<uint32_t>(self, id, fork_atom::value, count, listener);
    },
    [=](list_atom) -> caf::result<std::vector<sandbox_info>, std::vector<std::string>> {
      auto& s = self->state;
      // Every node's, together. A node that does not answer within
      // list_wait (hung, or cut off but not yet lost) is named instead.
      struct gather {
        std::vector<sandbox_info> all;
        std::vector<std::string> missing;
        size_t left = 0;
      };
      auto g = std::make_shared<gather>();
      auto rp = self->make_response_promise<std::vector<sandbox_info>, std::vector<std::string>>();
      std::vector<std::pair<node_actor, std::string>> nodes;
      if (!s.cfg.coordinator)
        nodes.emplace_back(s.cfg.node, s.cfg.name);
      for (auto& [id, m] : s.members)
        nodes.emplace_back(m.node, m.name);
      g->left = nodes.size();
      if (g->left == 0)
        rp.deliver(std::vector<sandbox_info>{}, std::vector<std::string>{});
      auto finish = [=]() mutable {
        if (--g->left > 0)
          return;
        std::sort(g->missing.begin(), g->missing.end());
        rp.deliver(std::move(g->all), std::move(g->missing));
      };
      for (auto& [node, name] : nodes)
        self->request(node, list_wait, list_atom::value, s.cfg.key)
          .then(
            [=, name = name](const internal_key& k, std::vector<sandbox_info>& xs) mutable {
              // (with the key checked: the list goes to a client, the key does not)
              if (genuine(k, self->state.cfg.key, "a reply to list"))
                for (auto& x : xs)
                  g->all.push_back(std::move(x));
              else
                g->missing.push_back(name);
              finish();
            },
            [=, name = name](caf::error&) mutable {
              g->missing.push_back(name);
              finish();
            });
      return rp;
    },
    [=](cordon_atom, const std::string& name, bool on) -> caf::result<uint32_t> {
      return operate(self, name, on ? "cordon" : "uncordon",
                     caf::duration{std::chrono::seconds(10)}, cordon_atom::value, on);
    },
    [=](drain_atom, const std::string& name, uint64_t timeout_ms) -> caf::result<uint32_t> {
      // (a node that hangs or dies meanwhile ends the drain with an error
      // 10 s after its own timeout)
      auto wait = timeout_ms == 0 ? caf::duration{caf::infinite}
                                  : caf::duration{std::chrono::milliseconds(timeout_ms)
                                                  + std::chrono::seconds(10)};
      return operate(self, name, "drain", wait, drain_atom::value, timeout_ms);
    },
    [=](cluster_atom) -> caf::result<std::vector<member_info>> {
      auto& s = self->state;
      if (!s.cfg.coordinator)
        return not_coordinator(self);
      std::vector<member_info> out;
      auto now = std::chrono::steady_clock::now();
      for (auto& [id, m] : s.members) {
        member_info info;
        info.name = m.name;
        auto* placed_at = s.map.find(id);
        info.state = placed_at && placed_at->cordoned ? "cordoned" : "up";
        // (simulated nodes live in this process too, but are not its own node)
        info.coordinator = m.local && m.name == s.cfg.name;
        info.last = m.last;
        info.last.layers = m.layers;
        info.joined_ms = m.joined_ms;
        if (auto* n = s.map.find(id)) {
          info.since_beat_ms = static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::milliseconds>(now - n->last_report).count());
          info.placed = n->placed;
        }
        out.push_back(std::move(info));
      }
      std::sort(out.begin(), out.end(), [](const member_info& a, const member_info& b) {
        return a.coordinator != b.coordinator ? a.coordinator : a.name < b.name;
      });
      // A lost node that joined again is shown up only.
      for (auto& l : s.lost)
        if (!s.by_name.count(l.name))
          out.push_back(l);
      return out;
    },
    [=](join_atom, const internal_key& k, node_report& rep, node_actor& node,
        layer_store_actor& store) -> caf::result<internal_key, layer_store_actor> {
      auto& s = self->state;
      if (!s.cfg.coordinator)
        return not_coordinator(self);
      if (!genuine(k, s.cfg.key, "join (scheduler)"))
        return to_caf(make_error(errc::unauthorized,
                                 "coordinator " + s.cfg.name
                                   + " refused the join: the message does not carry this "
                                     "cluster's key (give the node a copy of the coordinator's "
                                     "key file: dsecd --cluster-key FILE)"));
      if (s.shutting_down)
        return to_caf(make_error(errc::overloaded, "the coordinator is shutting down"));
      if (rep.name.empty() || !node)
        return to_caf(make_error(errc::invalid_argument, "a joining node needs a name and a node actor"));
      if (auto it = s.by_name.find(rep.name); it != s.by_name.end())
        lose(self, it->second, "it joined again (a new process under the same name)");
      // The coordinator's own node (not a simulated one, which lives in this
      // process too): its store is the layers' source; it fills last.
      bool own = node.node() == self->node() && rep.name == s.cfg.name;
      auto id = s.map.add(rep.name, rep.slots, rep.live, rep.layers, own);
      s.map.offers(id, offer_names(rep));
      s.map.cordon(id, rep.cordoned);
      auto& m = s.members[id];
      m.name = rep.name;
      m.where = node.node();
      m.local = m.where == self->node();
      m.node = std::move(node);
      m.store = std::move(store);
      m.layers = std::move(rep.layers);
      rep.layers.clear();
      auto held = std::move(rep.held);
      rep.held.clear();
      m.last = std::move(rep);
      m.joined_ms = unix_ms();
      if (s.view)
        s.view->beat(m.name, m.last);
      s.by_name[m.name] = id;
      s.by_addr[m.node.address()] = id;
      self->monitor(m.node);
      // Sessions that lived through its loss may place there again.
      for (auto& [sid, sess] : s.sessions)
        caf::anon_send(sess, join_atom::value, process_key(), m.where);
      // The sandboxes it kept after losing its coordinator (this one, before
      // a restart): their sessions are rebuilt if need be and adopt them.
      // Those of a session with a trajectory log are destroyed instead: the
      // trainer's client resumes it from its log, which rebuilds them.
      size_t adopted = 0, left = 0;
      for (auto& h : held) {
        if (!check_name(h.id, "a session id"))
          continue;
        if (h.options.trajectory) {
          // Its log rebuilds them (the trainer's client resumes it): they
          // go now, so that their ids are free for the rebuilds.
          left += h.sandboxes.size();
          self->request(m.node, std::chrono::seconds(10), adopt_atom::value, s.cfg.key, h.id,
                        session_actor{})
            .then([](const internal_key&, uint32_t) {}, [](caf::error&) {});
          continue;
        }
        auto it = s.sessions.find(h.id);
        auto sess = it != s.sessions.end()
                      ? it->second
                      : recover_session(self, h.id, h.options, h.owned, caf::actor{});
        adopted += h.sandboxes.size();
        self->request(m.node, std::chrono::seconds(10), adopt_atom::value, s.cfg.key, h.id, sess)
          .then([](const internal_key&, uint32_t) {}, [](caf::error&) {});
      }
      if (adopted + left > 0) {
        std::printf("dsecd: node %s kept %zu sandboxes of the coordinator before: %zu adopted"
                    " into their sessions%s\n",
                    m.name.c_str(), adopted + left, adopted,
                    left > 0 ? (", " + std::to_string(left)
                                + " of sessions with trajectory logs destroyed, to be rebuilt by their resume")
                                 .c_str()
                             : "");
        std::fflush(stdout);
      }
      std::printf("dsecd: node %s joined (%u slots, %zu layers)%s\n", m.name.c_str(),
                  m.last.slots, m.layers.size(), m.local ? " (this process)" : "");
      std::fflush(stdout);
      log::write(log::level::info, "cluster", "node joined",
                 {{"node", m.name}, {"slots", std::to_string(m.last.slots)},
                  {"adopted", std::to_string(adopted)}});
      return {s.cfg.key, s.cfg.store};
    },
    [=](beat_atom, const internal_key& k, node_report& rep) -> caf::result<internal_key, bool> {
      auto& s = self->state;
      if (!s.cfg.coordinator)
        return not_coordinator(self);
      if (!genuine(k, s.cfg.key, "beat (scheduler)"))
        return refuse("beat");
      publish(self);
      auto it = s.by_name.find(rep.name);
      if (it == s.by_name.end())
        return {s.cfg.key, false};
      auto& m = s.members.at(it->second);
      // (The sender is the peer's word; here it only tells an older process
      // of a genuine member from the newer one.)
      if (auto sender = self->current_sender(); sender && sender->node() != m.where)
        return {s.cfg.key, false}; // an older process under the same name
      s.map.report(it->second, rep.slots, rep.live, rep.layers_sent ? &rep.layers : nullptr);
      {
        std::unordered_map<std::string, uint32_t> ready;
        for (const auto& p : rep.pools)
          if (!p.key.empty())
            ready[p.owner + "\n" + p.key] += p.ready;
        s.map.pools(it->second, std::move(ready));
      }
      s.map.offers(it->second, offer_names(rep));
      s.map.cordon(it->second, rep.cordoned);
      if (rep.layers_sent)
        m.layers = std::move(rep.layers);
      rep.layers.clear();
      if (s.view)
        s.view->beat(m.name, rep);
      m.last = std::move(rep);
      return {s.cfg.key, true};
    },
    [=](timeout_atom, const internal_key& k) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "timeout (scheduler)"))
        return;
      auto now = std::chrono::steady_clock::now();
      std::vector<std::pair<uint32_t, int64_t>> dead;
      for (auto& [id, m] : s.members) {
        auto* n = s.map.find(id);
        if (m.local || !n)
          continue;
        auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(now - n->last_report);
        if (quiet > s.cfg.beat_timeout)
          dead.emplace_back(id, quiet.count());
      }
      for (auto [id, ms] : dead)
        lose(self, id,
             "no heartbeat for " + std::to_string(ms) + " ms (--beat-timeout "
               + std::to_string(s.cfg.beat_timeout.count())
               + " ms): the node hung, or the network failed; its connection is still open");
      self->delayed_send(self, std::max(std::chrono::milliseconds(50), s.cfg.beat_timeout / 6),
                         timeout_atom::value, process_key());
    },
    [=](stats_atom) -> caf::result<node_stats> {
      auto rp = self->make_response_promise<node_stats>();
      auto sessions = static_cast<uint32_t>(self->state.sessions.size());
      self->request(self->state.cfg.node, std::chrono::seconds(10), stats_atom::value,
                    self->state.cfg.key)
        .then(
          [=](const internal_key& k, node_stats& ns) mutable {
            if (!genuine(k, self->state.cfg.key, "a reply to stats")) {
              rp.deliver(refuse("a reply to stats"));
              return;
            }
            ns.sessions = sessions;
            if (auto& door = self->state.cfg.door)
              ns.refused_clients = door->refused.load();
            rp.deliver(std::move(ns));
          },
          [=](caf::error& e) mutable { rp.deliver(e); });
      return rp;
    },
    [=](gone_atom, const internal_key& k, const std::string& session_id) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "gone (scheduler)"))
        return;
      s.sessions.erase(session_id);
      s.summaries.erase(session_id);
      std::erase_if(s.session_names, [&](const auto& kv) { return kv.second == session_id; });
      std::erase_if(s.resumed, [&](const auto& kv) { return kv.second == session_id; });
      publish(self);
    },
    [=](pool_atom, environment& env, uint32_t size) -> caf::result<uint32_t> {
      if (!self->state.cfg.joined.empty())
        return to_caf(make_error(errc::unsupported,
                                 "node " + self->state.cfg.name + " belongs to the cluster of "
                                   + self->state.cfg.joined + ": set pools there"));
      return spread_pool(self, std::move(env), size, session_actor{}, "node");
    },
    [=](pool_atom) -> caf::result<std::vector<pool_info>> { return gather_pools(self); },
    [=](pool_atom, const internal_key& k, environment& env, uint32_t size,
        session_actor& owner, std::string& owner_id) -> caf::result<internal_key, uint32_t> {
      if (!genuine(k, process_key(), "pool (scheduler)"))
        return refuse("pool");
      auto rp = self->make_response_promise<internal_key, uint32_t>();
      spread_pool_to(self, std::move(env), size, std::move(owner), std::move(owner_id),
                     [rp, key = self->state.cfg.key](caf::expected<uint32_t> n) mutable {
                       if (n)
                         rp.deliver(key, *n);
                       else
                         rp.deliver(n.error());
                     });
      return rp;
    },
    [=](shutdown_atom, const internal_key& k) -> caf::result<uint32_t> {
      auto& s = self->state;
      if (!genuine(k, process_key(), "shutdown (scheduler)"))
        return refuse("shutdown");
      s.shutting_down = true;
      // The node first: it destroys (and counts) every sandbox; had the
      // sessions gone first, some would be gone before the node counted.
      // Then the sessions close, but their trajectory logs stay: a restarted
      // daemon resumes them. (The nodes of a cluster destroy their sandboxes
      // when they lose us.)
      auto rp = self->make_response_promise<uint32_t>();
      auto close_sessions = [=] {
        for (auto& [id, sess] : self->state.sessions)
          caf::anon_send(sess, shutdown_atom::value, process_key());
      };
      self->request(s.cfg.node, std::chrono::seconds(60), shutdown_atom::value, process_key())
        .then(
          [=](uint32_t n) mutable {
            close_sessions();
            rp.deliver(n);
          },
          [=](caf::error& e) mutable {
            close_sessions();
            rp.deliver(e);
          });
      return rp;
    },
  };
}

// ---- warm pools (actors/warm_pool.hpp) -------------------------------------------

// The nodes a pool is spread over: this one, or (a coordinator) every node
// up now, by name; with `takers`, only those that take sandboxes (not one of
// --slots 0, such as a coordinator that runs none, nor a cordoned one). A
// node that joins later gets no share of a pool.
std::vector<std::pair<node_actor, std::string>> pool_nodes(self_ptr self, bool takers,
                                                         const std::string& backend = {}) {
  auto& s = self->state;
  std::vector<std::pair<node_actor, std::string>> nodes;
  if (!s.cfg.coordinator)
    nodes.emplace_back(s.cfg.node, s.cfg.name);
  // A pool of microVMs goes only to the nodes that offer them.
  auto offers = [&](const node_report& r) {
    if (backend != "microvm")
      return true;
    for (const auto& b : r.backends)
      if (b.name == backend && b.slots > 0)
        return true;
    return false;
  };
  for (auto& [id, m] : s.members)
    if (!takers || (m.last.slots > 0 && !m.last.cordoned && offers(m.last)))
      nodes.emplace_back(m.node, m.name);
  std::sort(nodes.begin(), nodes.end(),
            [](const auto& a, const auto& b) { return a.second < b.second; });
  return nodes;
}

// Sets a pool of `size` over the nodes: each gets size / n, the first size % n
// one more (0 removes it everywhere). The reply: how many the nodes took; an
// error only if every node refused (the first node's).
void spread_pool_to(self_ptr self, environment env, uint32_t size, session_actor owner,
                    std::string owner_id, std::function<void(caf::expected<uint32_t>)> done) {
  // (a removal reaches every node)
  auto nodes = pool_nodes(self, size > 0, env.backend);
  if (nodes.empty()) {
    done(to_caf(make_error(errc::overloaded,
                           self->state.members.empty()
                             ? "no node has joined the cluster"
                           : env.backend == "microvm"
                             ? "no node takes a pool of microVMs: none up offers the microvm "
                               "backend with slots, or those that do have --slots 0 or are "
                               "cordoned"
                             : "no node takes a pool: every node up has --slots 0 or is "
                               "cordoned")));
    return;
  }
  struct gather {
    uint32_t took = 0;
    size_t left = 0, ok = 0;
    caf::error first;
  };
  auto g = std::make_shared<gather>();
  g->left = nodes.size();
  auto n = static_cast<uint32_t>(nodes.size());
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t share = size / n + (i < size % n ? 1 : 0);
    self
      ->request(nodes[i].first, std::chrono::seconds(30), pool_atom::value, self->state.cfg.key,
                env, share, owner, owner_id)
      .then(
        [=](const internal_key& k, uint32_t got) mutable {
          if (genuine(k, self->state.cfg.key, "a reply to pool")) {
            g->took += got;
            ++g->ok;
          } else if (!g->first) {
            g->first = refuse("a reply to pool");
          }
          if (--g->left == 0)
            done(g->ok > 0 ? caf::expected<uint32_t>{g->took} : caf::expected<uint32_t>{g->first});
        },
        [=](caf::error& e) mutable {
          if (!g->first)
            g->first = e;
          if (--g->left == 0)
            done(g->ok > 0 ? caf::expected<uint32_t>{g->took} : caf::expected<uint32_t>{g->first});
        });
  }
}

caf::typed_response_promise<uint32_t> spread_pool(self_ptr self, environment env, uint32_t size,
                                                  session_actor owner, std::string owner_id) {
  auto rp = self->make_response_promise<uint32_t>();
  spread_pool_to(self, std::move(env), size, std::move(owner), std::move(owner_id),
                 [rp](caf::expected<uint32_t> n) mutable {
                   if (n)
                     rp.deliver(*n);
                   else
                     rp.deliver(n.error());
                 });
  return rp;
}

// Every node's pools, from their stats (3 s each; one that does not answer is left out).
caf::typed_response_promise<std::vector<pool_info>> gather_pools(self_ptr self) {
  auto rp = self->make_response_promise<std::vector<pool_info>>();
  auto nodes = pool_nodes(self, false);
  struct gather {
    std::vector<pool_info> all;
    size_t left = 0;
  };
  auto g = std::make_shared<gather>();
  g->left = nodes.size();
  if (nodes.empty())
    rp.deliver(std::vector<pool_info>{});
  for (auto& [node, name] : nodes)
    self->request(node, list_wait, stats_atom::value, self->state.cfg.key)
      .then(
        [=](const internal_key& k, node_stats& ns) mutable {
          if (genuine(k, self->state.cfg.key, "a reply to stats"))
            for (auto& p : ns.pools)
              g->all.push_back(std::move(p));
          if (--g->left == 0)
            rp.deliver(std::move(g->all));
        },
        [=](caf::error&) mutable {
          if (--g->left == 0)
            rp.deliver(std::move(g->all));
        });
  return rp;
}

} // namespace

scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_config cfg) {
  return sys.spawn(scheduler_impl, std::move(cfg));
}

} // namespace dsec

// The session actor (actors/session.hpp): one actor per session, its behaviour
// assembled from three files over one state (actors/session_state.hpp). This one
// holds the core: the message handlers, creates (their checks, the quota, batches,
// keys and tags), lists, closing, forwarding to sandboxes, the Chronus watchers
// and lost nodes. The trajectory log is session_log.cpp, resume and replay
// session_replay.cpp.
#include "actors/session.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <unordered_map>

#include "actors/session_state.hpp"
#include "actors/warm_pool.hpp"
#include "runtime/log.hpp"
#include "runtime/metrics.hpp"

namespace dsec {

namespace session_detail {

namespace {

// Events kept for a watcher that has not come yet; beyond either limit, the
// oldest go.
constexpr size_t max_backlog = 65536;
constexpr size_t max_backlog_bytes = 64u << 20;
// Sandboxes whose end is remembered (to say why in a later request's error).
constexpr size_t max_ended = 65536;
// A create's key and tags: bounds.
constexpr size_t max_key = 256;
constexpr size_t max_tags = 64;
constexpr size_t max_tags_bytes = 16384;

// The sessions' mailbox depths for /metrics (docs/observability.md): each
// session notes its own when its busiest handlers run (creates, execs, its
// sandboxes' events); dsec_mailbox_messages{actor="sessions"} is their sum,
// dsec_session_mailbox_max_messages the deepest. No session label: the
// series stay few however many sessions there are.
struct session_mailboxes {
  std::mutex mu;
  std::unordered_map<caf::actor_id, size_t> depth;
  size_t sum = 0;
  metrics::gauge& total = metrics::process_registry().get_gauge(
    "dsec_mailbox_messages",
    "Messages waiting in an actor's mailbox when it last looked (the nodes' summed).",
    {{"actor", "sessions"}});

  static session_mailboxes& get() {
    static auto* m = [] {
      auto* p = new session_mailboxes; // never destroyed: sessions may note during exit
      metrics::process_registry().add_collector([p](std::vector<metrics::sample_family>& out) {
        size_t deepest = 0;
        {
          std::lock_guard<std::mutex> g{p->mu};
          for (const auto& [id, d] : p->depth)
            deepest = std::max(deepest, d);
        }
        out.push_back({"dsec_session_mailbox_max_messages",
                       "Messages waiting in the deepest session's mailbox when it last looked.",
                       "gauge",
                       {{metrics::labels{}, static_cast<double>(deepest)}},
                       {}});
      });
      return p;
    }();
    return *m;
  }
  void note(caf::actor_id id, size_t n) {
    std::lock_guard<std::mutex> g{mu};
    auto& d = depth[id];
    sum = sum - d + n;
    d = n;
    total.set(static_cast<double>(sum));
  }
  void forget(caf::actor_id id) {
    std::lock_guard<std::mutex> g{mu};
    if (auto it = depth.find(id); it != depth.end()) {
      sum -= it->second;
      depth.erase(it);
      total.set(static_cast<double>(sum));
    }
  }
};

void note_mailbox(self_ptr self) {
  session_mailboxes::get().note(self->id(), self->mailbox().size());
}

} // namespace

// ---- ending -----------------------------------------------------------------

// Tells a remote listener the ready sandboxes of its batch not told yet.
template <class Batch>
void announce(Batch& b) {
  if (b.unannounced.empty())
    return;
  if (b.listener && b.labeled) {
    caf::anon_send(b.listener, ready_atom::value,
                   ready_ids{std::move(b.unannounced), std::move(b.unannounced_keys)});
  } else if (b.listener) {
    if (b.unannounced.size() == 1)
      caf::anon_send(b.listener, ready_atom::value, std::move(b.unannounced.front()));
    else
      caf::anon_send(b.listener, ready_atom::value, ready_ids{std::move(b.unannounced), {}});
  }
  b.unannounced.clear();
  b.unannounced_keys.clear();
}

void finish_batch(self_ptr self, uint64_t req) {
  auto& s = self->state;
  auto it = s.batches.find(req);
  if (it == s.batches.end())
    return;
  auto& b = it->second;
  if (b.ready + b.failed < b.count)
    return;
  announce(b);
  if (b.rebuild.empty()) // nobody waits on a rebuild's batch
    b.rp.deliver(b.ready);
  if (!b.key.empty())
    if (auto k = s.key_batches.find(b.key); k != s.key_batches.end() && --k->second == 0)
      s.key_batches.erase(k);
  s.batches.erase(it);
}

void maybe_end(self_ptr self) {
  auto& s = self->state;
  if (!s.closing || !s.sandboxes.empty() || s.pending > 0)
    return;
  if (s.log) {
    flush(self);
    s.log.reset();
    if (!s.keep_log) {
      // Closed by its trainer: the run is over, nothing will resume it.
      std::error_code ec;
      std::filesystem::remove_all(s.dir, ec);
    }
  }
  log::write(log::level::info, "session", s.keep_log ? "ended, its log kept for a resume" : "closed",
             {{"session", s.cfg.id}, {"sandboxes_closed", std::to_string(s.closed_count)}});
  // The scheduler first: once close() has returned, the session is not found.
  caf::anon_send(s.cfg.scheduler, gone_atom::value, process_key(), s.cfg.id);
  for (auto& rp : s.close_waiters)
    rp.deliver(s.closed_count);
  s.close_waiters.clear();
  // A normal exit says "closed" to the trainer's calls still coming
  // (errc::closed); a session that keeps its log (its trainer died, its
  // daemon stops) ends otherwise: they hear `disconnected`.
  self->quit(s.keep_log ? caf::make_error(caf::exit_reason::user_shutdown) : caf::error{});
}

void close_session(self_ptr self) {
  auto& s = self->state;
  if (s.closing)
    return maybe_end(self);
  s.closing = true;
  s.closed_count = static_cast<uint32_t>(s.sandboxes.size());
  for (auto& [id, sb] : s.sandboxes)
    caf::anon_send(sb, destroy_atom::value, s.cfg.key);
  // Sandboxes not rebuilt yet just go (one being rebuilt goes when its
  // ready_atom finds the session closing).
  std::erase_if(s.replay, [](const auto& kv) { return !kv.second.materializing; });
  maybe_end(self);
}

// Finds a sandbox of this session, or says why not.
expected<sandbox_actor> find(self_ptr self, const std::string& id) {
  auto& s = self->state;
  auto it = s.sandboxes.find(id);
  if (it == s.sandboxes.end()) {
    if (auto l = s.lost_boxes.find(id); l != s.lost_boxes.end())
      return make_error(errc::lost, l->second);
    if (auto e = s.ended.find(id); e != s.ended.end())
      return make_error(errc::closed, e->second);
    // Rebuilt by a restarted coordinator: a node that kept its sandboxes
    // hands them over once it rejoined (adopt), and may rejoin until its
    // orphan grace ends. Until then an unknown id may be one of those: retry.
    auto age = std::chrono::steady_clock::now() - s.started;
    if (s.cfg.recovered && age < s.cfg.reattach_grace) {
      auto left = std::chrono::duration_cast<std::chrono::seconds>(s.cfg.reattach_grace - age);
      return make_error(errc::disconnected,
                        "sandbox " + id + " is not known to session " + s.cfg.id
                          + " yet: its coordinator restarted, and the node holding it may not "
                            "have handed it over yet (retry; not_found once "
                          + std::to_string(left.count()) + " s more have passed)");
    }
    return make_error(errc::not_found, "no sandbox " + id + " in session " + s.cfg.id);
  }
  return it->second;
}

// ---- keys and ends of sandboxes -----------------------------------------------

std::string sandbox_key(const std::string& create_key, uint32_t count, uint32_t index) {
  return count == 1 ? create_key : create_key + "#" + std::to_string(index);
}

// Gives sandbox `id`, ready for batch `b`, its key (the next index of its
// create) and remembers its labels; returns the key.
template <class Batch>
std::string label_sandbox(self_ptr self, Batch& b, const std::string& id) {
  auto& s = self->state;
  auto key = sandbox_key(b.key, b.count, b.next_index++);
  s.labels[id] = box_labels{key, b.key, b.tags, b.ttl_ms};
  s.by_key[key] = id;
  s.key_members[b.key].insert(id);
  return key;
}

// An adopted sandbox's labels (a restarted coordinator's session): its
// create's key, if the trainer gave one, counts again (a create of that key is
// refused while it lives), and its tags show in list(). Of a create of several,
// the members are keyed K#0, K#1, ... again in the order they are adopted
// (their first numbering is not known to the node).
void adopt_labels(self_ptr self, const std::string& id, create_labels labels, uint32_t count) {
  auto& s = self->state;
  if (s.labels.count(id))
    return;
  if (labels.key.empty()) {
    if (!labels.tags.empty())
      s.labels[id] = box_labels{{}, {}, std::move(labels.tags), 0};
    return;
  }
  auto& members = s.key_members[labels.key];
  std::string key = labels.key;
  if (count > 1) {
    uint32_t i = 0;
    while (s.by_key.count(labels.key + "#" + std::to_string(i)))
      ++i;
    key = labels.key + "#" + std::to_string(i);
  }
  s.labels[id] = box_labels{key, labels.key, std::move(labels.tags), 0};
  s.by_key[key] = id;
  members.insert(id);
}

// A sandbox no longer counts for its create's key (it ended, or was
// destroyed while replaying).
void release_key(self_ptr self, const std::string& id) {
  auto& s = self->state;
  auto l = s.labels.find(id);
  if (l == s.labels.end())
    return;
  if (auto m = s.key_members.find(l->second.group_key); m != s.key_members.end()) {
    m->second.erase(id);
    if (m->second.empty())
      s.key_members.erase(m);
  }
}

// Remembers why sandbox `id` went, for the requests that still come for it
// (errc::closed, saying so), and forgets its labels.
void note_end(self_ptr self, const std::string& id) {
  auto& s = self->state;
  std::string why;
  if (s.destroying.erase(id) > 0) {
    why = "sandbox " + id + " was destroyed by its trainer (destroy, or its session closing)";
  } else if (s.expired.erase(id) > 0) {
    auto l = s.labels.find(id);
    auto ttl = l != s.labels.end() ? l->second.ttl_ms : 0;
    why = "sandbox " + id + " reached its TTL"
          + (ttl ? " of " + std::to_string(ttl / 1000) + "." + std::to_string(ttl % 1000 / 100)
                     + " s"
                 : std::string{})
          + " and was destroyed (give the create a longer ttl)";
  } else {
    why = "sandbox " + id + " ended on its own: it failed, or its node stopped it (dsecd's log"
          " says why)";
  }
  release_key(self, id);
  s.labels.erase(id);
  if (s.ended.insert_or_assign(id, std::move(why)).second)
    s.ended_order.push_back(id);
  while (s.ended_order.size() > max_ended) {
    auto old = std::move(s.ended_order.front());
    s.ended_order.pop_front();
    s.ended.erase(old);
    if (auto l = s.labels.find(old); l == s.labels.end())
      std::erase_if(s.by_key, [&](const auto& kv) { return kv.second == old; });
  }
}

// A create's key and tags, checked: what is wrong, named.
expected<void> check_labels(self_ptr self, const create_labels& l) {
  auto& s = self->state;
  if (l.key.size() > max_key)
    return make_error(errc::invalid_argument, "create key: at most " + std::to_string(max_key)
                                                + " bytes, got " + std::to_string(l.key.size()));
  if (l.key.find('\0') != std::string::npos)
    return make_error(errc::invalid_argument, "create key: contains a NUL byte");
  if (l.key.find('#') != std::string::npos && !s.logged_keys.count(l.key))
    return make_error(errc::invalid_argument,
                      "create key '" + l.key + "': '#' is dsec's own (\"#N\" for a create"
                      " without a key, K#i for the sandboxes of a batch); pass such a key"
                      " back only to resume its create");
  if (l.tags.size() > max_tags)
    return make_error(errc::invalid_argument, "tags: at most " + std::to_string(max_tags)
                                                + ", got " + std::to_string(l.tags.size()));
  size_t bytes = 0;
  for (const auto& [k, v] : l.tags) {
    if (k.empty())
      return make_error(errc::invalid_argument, "tags: a tag has an empty name");
    bytes += k.size() + v.size();
  }
  if (bytes > max_tags_bytes)
    return make_error(errc::invalid_argument, "tags: at most " + std::to_string(max_tags_bytes)
                                                + " bytes in all, got " + std::to_string(bytes));
  return {};
}

// A relay for a streamed command: the sandbox streams to whoever asked, so the
// relay asks, forwards the chunks to `requester`, and answers with the result.
// With `kept` it also keeps a copy of the output (up to `limit` per stream)
// and puts it into the result. If the requester goes away, so does the relay
// (and the sandbox kills the command as it would have).
caf::actor spawn_relay(self_ptr self, sandbox_actor sb, caf::strong_actor_ptr requester,
                       std::shared_ptr<kept_output> kept, uint64_t limit) {
  auto key = self->state.cfg.key;
  return self->spawn([sb, requester, kept, limit, key](caf::event_based_actor* r) -> caf::behavior {
    if (requester) {
      r->monitor(requester);
      r->set_down_handler([r, requester](caf::down_msg& dm) {
        if (dm.source == requester->address()
            && really_down(requester, "a down message of a relay's requester"))
          r->quit();
      });
    }
    return {
      // (from its session only: process surface)
      [=](exec_atom, const internal_key& k, exec_request& q) -> caf::result<exec_result> {
        if (!genuine(k, process_key(), "exec (relay)"))
          return refuse("exec");
        auto p = r->make_response_promise<exec_result>();
        r->request(sb, caf::infinite, exec_atom::value, key, std::move(q))
          .then(
            [=](exec_result& res) mutable {
              if (kept) {
                // (kept->truncated says the copy is short, not what the
                // requester got: it had every chunk.)
                res.out = std::move(kept->out);
                res.err = std::move(kept->err);
              }
              p.deliver(std::move(res));
              r->quit();
            },
            [=](caf::error& e) mutable {
              p.deliver(e);
              r->quit();
            });
        return p;
      },
      [=](output_chunk& c) {
        if (kept) {
          auto& buf = c.stream == 2 ? kept->err : kept->out;
          size_t room = buf.size() < limit ? limit - buf.size() : 0;
          if (c.data.size() > room)
            kept->truncated = true;
          buf.append(c.data, 0, std::min(room, c.data.size()));
        }
        if (requester)
          caf::anon_send(caf::actor_cast<caf::actor>(requester), std::move(c));
      },
    };
  });
}

// A command without a log: delegated, or (a streamed one on another node)
// through a relay whose call is kept like forward_to's.
void forward_exec(self_ptr self, const sandbox_actor& sb, exec_request req,
                  caf::strong_actor_ptr requester, caf::typed_response_promise<exec_result> rp) {
  auto& s = self->state;
  // (A handle's command tells its requester its id: through a relay too.)
  if (!(req.stream || req.handle) || !s.cfg.cluster || sb.node() == self->node())
    return forward_to<exec_result>(self, sb, rp, exec_atom::value, std::move(req));
  auto relay = spawn_relay(self, sb, std::move(requester), nullptr, 0);
  ask<exec_result>(
    self, sb, relay, [rp](exec_result& r) mutable { rp.deliver(std::move(r)); },
    [rp](caf::error& e) mutable { rp.deliver(e); },
    [rp, relay](const error& e) mutable {
      caf::anon_send_exit(relay, caf::exit_reason::kill);
      rp.deliver(to_caf(e));
    },
    exec_atom::value, process_key(), std::move(req));
}

// Answers the current request with `e` (for handlers that return delegated<T>).
template <class T>
caf::delegated<T> fail_with(self_ptr self, const error& e) {
  auto rp = self->make_response_promise<T>();
  rp.deliver(to_caf(e));
  return {};
}

// Hands an event to the watchers, or keeps it until one comes.
void publish_event(self_ptr self, chronus_event_msg ev) {
  auto& s = self->state;
  if (s.watchers.empty()) {
    s.backlog_bytes += ev.bytes.size();
    s.backlog.push_back(std::move(ev));
    while (s.backlog.size() > max_backlog || s.backlog_bytes > max_backlog_bytes) {
      s.backlog_bytes -= s.backlog.front().bytes.size();
      s.backlog.pop_front();
      ++s.dropped;
    }
    return;
  }
  for (size_t i = 0; i + 1 < s.watchers.size(); ++i)
    caf::anon_send(s.watchers[i], chronus_atom::value, ev);
  caf::anon_send(s.watchers.back(), chronus_atom::value, std::move(ev));
}

// ---- the cluster ----------------------------------------------------------------

// Sandboxes of request `req` admitted by a node that is lost and not yet
// ready: they fail now (errc::lost).
void settle(self_ptr self, const caf::node_id& where, uint64_t req) {
  auto& s = self->state;
  auto n = s.inflight.find(where);
  if (n == s.inflight.end())
    return;
  auto r = n->second.find(req);
  if (r == n->second.end())
    return;
  if (s.lost_nodes.count(where) && r->second > 0) {
    auto e = to_caf(make_error(errc::lost, "the node a sandbox was being created on was lost"));
    for (int64_t i = 0; i < r->second; ++i)
      caf::anon_send(self, failed_atom::value, s.cfg.key, e, req);
    r->second = 0;
  }
  if (r->second == 0)
    n->second.erase(r);
  if (n->second.empty() && !s.lost_nodes.count(where))
    s.inflight.erase(n);
}

// A node was lost: its sandboxes are gone (each gets a `lost` event), calls
// in flight there fail, and so do creations it had admitted.
void node_lost(self_ptr self, const caf::node_id& where, const std::string& name,
               const std::string& why) {
  auto& s = self->state;
  if (!s.lost_nodes.insert(where).second)
    return;
  auto text = "node " + name + " was lost (" + why + ")";
  std::vector<std::function<void(const error&)>> fails;
  for (auto it = s.calls.begin(); it != s.calls.end();) {
    if (it->second.where == where) {
      fails.push_back(std::move(it->second.fail));
      it = s.calls.erase(it);
    } else {
      ++it;
    }
  }
  std::vector<std::string> gone;
  for (const auto& [id, sb] : s.sandboxes)
    if (sb.node() == where)
      gone.push_back(id);
  auto now_ns = static_cast<uint64_t>(
    std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch())
      .count());
  for (const auto& id : gone) {
    s.sandboxes.erase(id);
    auto msg = "sandbox " + id + " is gone: its " + text;
    s.lost_boxes.emplace(id, msg);
    publish_event(self, chronus_event_msg{encode_lost_event(id, now_ns, msg), false, {}});
  }
  for (auto& f : fails)
    f(make_error(errc::lost, "the sandbox's " + text));
  std::vector<uint64_t> reqs;
  if (auto n = s.inflight.find(where); n != s.inflight.end())
    for (const auto& [req, count] : n->second)
      reqs.push_back(req);
  for (auto req : reqs)
    settle(self, where, req);
  maybe_end(self);
}

// ---- creates, keys and lists ------------------------------------------------------

// The sandboxes of the session as list() shows them: live ones (asked), then
// replaying ones, with their keys and tags.
caf::typed_response_promise<std::vector<sandbox_info>> list_sandboxes(self_ptr self) {
  auto& s = self->state;
  auto rp = self->make_response_promise<std::vector<sandbox_info>>();
  auto fill = [self](sandbox_info& info) {
    auto& s = self->state;
    if (auto l = s.labels.find(info.id); l != s.labels.end()) {
      info.key = l->second.key;
      info.tags = l->second.tags;
    }
  };
  struct gather {
    std::vector<sandbox_info> infos;
    size_t left = 0;
  };
  auto g = std::make_shared<gather>();
  for (auto& [id, rb] : s.replay) {
    if (rb.materializing || (rb.closed && (!rb.claimed || rb.destroyed_again)))
      continue;
    sandbox_info info;
    info.id = id;
    info.session = s.cfg.id;
    info.state = rb.closed ? "closed" : rb.broken ? "broken" : "replaying";
    info.env = rb.box.env;
    fill(info);
    g->infos.push_back(std::move(info));
  }
  g->left = s.sandboxes.size();
  if (g->left == 0) {
    rp.deliver(std::move(g->infos));
    return rp;
  }
  // 3 s for each: a sandbox on a hung node shows as "no answer" rather than
  // holding up the list.
  for (const auto& [id, sb] : s.sandboxes)
    self->request(sb, std::chrono::seconds(3), list_atom::value, s.cfg.key)
      .then(
        [=](sandbox_info& info) mutable {
          fill(info);
          g->infos.push_back(std::move(info));
          if (--g->left == 0)
            rp.deliver(std::move(g->infos));
        },
        [=, id = id](caf::error& e) mutable {
          // Gone meanwhile: left out; not answering: said so.
          if (e != caf::sec::request_receiver_down) {
            sandbox_info info;
            info.id = id;
            info.session = self->state.cfg.id;
            info.state = "no answer";
            fill(info);
            g->infos.push_back(std::move(info));
          }
          if (--g->left == 0)
            rp.deliver(std::move(g->infos));
        });
  return rp;
}

// The sandbox with a key (lookup_atom).
caf::result<sandbox_info> find_by_key(self_ptr self, const std::string& key) {
  auto& s = self->state;
  auto k = s.by_key.find(key);
  if (k == s.by_key.end())
    return to_caf(make_error(errc::not_found, "no sandbox with key '" + key + "' in session "
                                                + s.cfg.id));
  auto id = k->second;
  sandbox_info info;
  info.id = id;
  info.session = s.cfg.id;
  if (auto l = s.labels.find(id); l != s.labels.end()) {
    info.key = l->second.key;
    info.tags = l->second.tags;
  } else {
    info.key = key;
  }
  if (auto r = s.replay.find(id); r != s.replay.end() && !r->second.materializing) {
    info.state = r->second.closed ? "closed" : r->second.broken ? "broken" : "replaying";
    info.env = r->second.box.env;
    return info;
  }
  auto sb = s.sandboxes.find(id);
  if (sb == s.sandboxes.end()) {
    if (auto e = s.ended.find(id); e != s.ended.end())
      return to_caf(make_error(errc::closed, "key '" + key + "': " + e->second));
    if (auto l = s.lost_boxes.find(id); l != s.lost_boxes.end())
      return to_caf(make_error(errc::lost, "key '" + key + "': " + l->second));
    info.state = "creating"; // being rebuilt
    return info;
  }
  auto rp = self->make_response_promise<sandbox_info>();
  self->request(sb->second, std::chrono::seconds(10), list_atom::value, s.cfg.key)
    .then(
      [=](sandbox_info& live) mutable {
        live.key = info.key;
        live.tags = info.tags;
        rp.deliver(std::move(live));
      },
      [=](caf::error& e) mutable { rp.deliver(e); });
  return rp;
}

// Starts a batch of `count` sandboxes of which `ready` and `failed` are
// settled already (a resumed create's logged ones): the others are placed.
caf::result<uint32_t> start_batch(self_ptr self, environment env, uint32_t count,
                                  const caf::actor& listener, create_labels labels, bool labeled,
                                  uint64_t group, uint32_t ready, uint32_t failed,
                                  std::string near) {
  auto& s = self->state;
  uint32_t fresh = count - ready - failed;
  uint64_t req = s.next_request++;
  auto& b = s.batches[req];
  b.count = count;
  b.ready = ready;
  b.failed = failed;
  b.next_index = ready;
  b.listener = listener;
  b.rp = self->make_response_promise<uint32_t>();
  b.group = group != 0 ? group : s.next_group++;
  b.env = env;
  b.labeled = labeled;
  create_labels given{labels.key, labels.tags}; // for the nodes (placement.labels)
  b.key = labels.key.empty() ? "#" + std::to_string(b.group) : std::move(labels.key);
  b.tags = std::move(labels.tags);
  b.ttl_ms = env.ttl_ms != 0 ? env.ttl_ms : s.cfg.options.default_ttl_ms;
  ++s.key_batches[b.key];
  s.pending += fresh;
  auto rp = b.rp;
  placement pl;
  pl.request = req;
  pl.session_id = s.cfg.id;
  pl.session = s.cfg.options;
  pl.owned = s.cfg.trainer || s.cfg.owned;
  pl.ttl_ms = s.cfg.options.default_ttl_ms;
  pl.keep_upper = s.log.has_value();
  pl.labels = std::move(given);
  pl.count = count;
  pl.near = std::move(near);
  self
    ->request(s.cfg.scheduler, caf::infinite, place_atom::value, process_key(), std::move(env),
              fresh, session_actor{self}, std::move(pl))
    .then([](const internal_key&, uint32_t) {},
          [=](caf::error& e) {
            // Nothing was placed: every one of them failed.
            auto& s = self->state;
            auto it = s.batches.find(req);
            if (it == s.batches.end())
              return;
            uint32_t left = it->second.count - it->second.ready - it->second.failed;
            for (uint32_t i = 0; i < left; ++i)
              caf::anon_send(self, failed_atom::value, self->state.cfg.key, e, req);
          });
  return rp;
}

// The quota's check for `more` sandboxes; an error saying so if they do not fit now.
std::optional<error> over_quota(self_ptr self, uint64_t more) {
  auto& s = self->state;
  uint64_t in_use = s.sandboxes.size() + s.pending + s.replay_claimed;
  if (in_use + s.pooled + more <= s.cfg.options.quota)
    return std::nullopt;
  auto pooled = s.pooled == 0 ? std::string{}
                              : ", " + std::to_string(s.pooled) + " kept in its warm pools";
  return make_error(errc::overloaded,
                    "session " + s.cfg.id + " quota: " + std::to_string(in_use)
                      + " sandboxes live or coming" + pooled + ", " + std::to_string(more)
                      + " more asked for, at most " + std::to_string(s.cfg.options.quota)
                      + (s.pooled == 0 ? " (retry once some are destroyed)"
                                       : " (retry once some are destroyed, or shrink its pools)"));
}

// A create call (create_atom). Its key, in a resumed session, gets the
// sandboxes the log made for it; anything else gets fresh sandboxes (never
// another key's).
caf::result<uint32_t> create_call(self_ptr self, environment env, uint32_t count,
                                  const caf::actor& listener, create_labels labels,
                                  bool labeled, std::string near = {}) {
  auto& s = self->state;
  if (s.closing)
    return to_caf(make_error(errc::closed, "session " + s.cfg.id + " is closing"));
  if (count == 0)
    return uint32_t{0};
  // The one validation of an environment (runtime/environment.hpp), before
  // anything is placed: layer names, limits, the backend.
  if (auto v = env.validate(); !v)
    return to_caf(v.error_value());
  if (env.backend == "function")
    return to_caf(make_error(errc::invalid_argument,
                             "backend 'function' makes one sandbox per call: use call"
                             " (session::call, `dsec call`), not create"));
  if (count > s.cfg.options.quota)
    return to_caf(make_error(errc::invalid_argument,
                             "session " + s.cfg.id + ": a create of " + std::to_string(count)
                               + " sandboxes can never fit its quota of "
                               + std::to_string(s.cfg.options.quota)
                               + " (ask for fewer, or open the session with a larger quota)"));
  if (auto ok = check_labels(self, labels); !ok)
    return to_caf(ok.error_value());
  if (!labels.key.empty()) {
    const auto& key = labels.key;
    if (auto m = s.key_members.find(key); m != s.key_members.end())
      return to_caf(make_error(errc::already_exists,
                               "create key '" + key + "' is in use in session " + s.cfg.id
                                 + " by sandbox " + *m->second.begin()
                                 + " (destroy it first, or give another key)"));
    if (s.key_batches.count(key))
      return to_caf(make_error(errc::already_exists,
                               "create key '" + key + "' is in use in session " + s.cfg.id
                                 + " by a create still in flight (give another key)"));
    if (auto lk = s.logged_keys.find(key); lk != s.logged_keys.end() && !lk->second.empty()) {
      size_t gi = lk->second.front();
      const auto& g = s.groups[gi];
      if (g.env != env || g.count != count)
        return to_caf(make_error(
          errc::invalid_argument,
          "create key '" + key + "' of session " + s.cfg.id + " was a create of "
            + std::to_string(g.count) + " before the resume, this one asks for "
            + std::to_string(count) + " (" + g.env.difference(env, "in the log", "now")
            + "): give it the same environment and count to resume it, or another key"));
      lk->second.pop_front();
      if (lk->second.empty())
        s.logged_keys.erase(lk);
      return claim_logged(self, gi, std::move(env), count, listener, std::move(labels));
    }
  }
  if (auto e = over_quota(self, count)) {
    log::refusal("session", "quota", "a create did not fit the session's quota",
                 {{"session", s.cfg.id}, {"error", e->message}});
    return to_caf(*e);
  }
  return start_batch(self, std::move(env), count, listener, std::move(labels), labeled, 0, 0,
                     0, std::move(near));
}

// Warm pools and the function backend (at the end of this file).
caf::result<uint32_t> set_pool(self_ptr self, environment env, uint32_t size);
caf::result<exec_result> function_call(self_ptr self, environment env, exec_request req);

// Snapshots (issue 16), in actors/session_snapshot.cpp.
caf::result<bool> pause_one(self_ptr self, const std::string& id, bool on);
caf::result<uint32_t> pause_all(self_ptr self, bool on);
caf::result<std::string> snapshot_one(self_ptr self, const std::string& id, const std::string& ref);
caf::result<uint32_t> fork_one(self_ptr self, const std::string& id, uint32_t count,
                               const caf::actor& listener);

session_actor::behavior_type session_impl(self_ptr self, session_config cfg) {
  self->state.cfg = std::move(cfg);
  auto& st = self->state;
  note_mailbox(self);
  self->attach_functor([id = self->id()] { session_mailboxes::get().forget(id); });
  if (st.cfg.trainer)
    self->monitor(st.cfg.trainer);
  if (st.cfg.options.trajectory) {
    if (st.cfg.trajectories.empty()) {
      log::write(log::level::error, "trajectory", "no place for trajectory logs",
                 {{"session", st.cfg.id}});
    } else if (auto r = open_log(self); !r) {
      log::write(log::level::error, "trajectory", r.error_value().message, {{"session", st.cfg.id}});
      st.log.reset();
    }
  }
  if (st.cfg.resume)
    arrange_resume(self, *st.cfg.resume);
  // Rebuilt by a restarted coordinator from a node's report: an owned one
  // closes unless its trainer reattaches in time (docs/cluster.md).
  if (st.cfg.recovered && st.cfg.owned && !st.cfg.trainer)
    self->delayed_send(self, st.cfg.reattach_grace, orphan_atom::value, process_key());
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    if (s.cfg.trainer && dm.source == s.cfg.trainer.address()) {
      if (really_down(s.cfg.trainer, "a down message of a session's trainer"))
        close_session(self); // the trainer died: its log stays for a resume
      return;
    }
    auto& w = s.watchers;
    w.erase(std::remove_if(w.begin(), w.end(),
                           [&](const caf::actor& a) {
                             return a.address() == dm.source
                                    && really_down(a, "a down message of a watcher");
                           }),
            w.end());
  });
  return {
    [=](create_atom, environment& env, uint32_t count,
        const caf::actor& listener) -> caf::result<uint32_t> {
      note_mailbox(self);
      return create_call(self, std::move(env), count, listener, {}, false);
    },
    [=](create_atom, environment& env, uint32_t count, const caf::actor& listener,
        create_labels& labels) -> caf::result<uint32_t> {
      note_mailbox(self);
      return create_call(self, std::move(env), count, listener, std::move(labels), true);
    },
    [=](create_atom, environment& env, uint32_t count, const caf::actor& listener,
        create_labels& labels, std::string& near) -> caf::result<uint32_t> {
      note_mailbox(self);
      if (!self->state.sandboxes.count(near))
        return to_caf(make_error(errc::not_found, "session " + self->state.cfg.id
                                                    + " has no sandbox " + near
                                                    + " to place sandboxes near"));
      return create_call(self, std::move(env), count, listener, std::move(labels),
                         !labels.key.empty() || !labels.tags.empty(), std::move(near));
    },
    [=](lookup_atom, const std::string& key) -> caf::result<sandbox_info> {
      return find_by_key(self, key);
    },
    [=](exec_atom, const std::string& id, exec_request& req)
      -> caf::delegated<exec_result> {
      note_mailbox(self);
      auto& s = self->state;
      if (!s.log && !s.replay.count(id)) {
        // No log: the sandbox answers the caller directly (and streams to it).
        if (auto sb = find(self, id)) {
          auto requester = self->current_sender();
          auto rp = self->make_response_promise<exec_result>();
          forward_exec(self, *sb, std::move(req), std::move(requester), rp);
          return {};
        } else
          return fail_with<exec_result>(self, sb.error_value());
      }
      // Who streamed output goes to: take it before the promise takes it away.
      auto requester = self->current_sender();
      auto rp = self->make_response_promise<exec_result>();
      if (req.transfer == transfer_get) {
        // A get changes nothing: never logged nor answered from the log, as
        // the whole-buffer get (a sandbox still replaying is rebuilt first).
        with_sandbox(
          self, id,
          [=](sandbox_actor sb) mutable { forward_exec(self, sb, req, requester, rp); },
          [=](const error& e) mutable { rp.deliver(to_caf(e)); });
        return {};
      }
      if (req.detach && !req.idempotent) {
        rp.deliver(to_caf(make_error(errc::invalid_argument,
                                     "a detached command in a session with a trajectory log"
                                     " must be marked idempotent (exec_request.idempotent,"
                                     " --idempotent): its effects cannot be packed at any"
                                     " one point")));
        return {};
      }
      if (exec_from_log(self, id, req, requester, rp))
        return {};
      with_sandbox(
        self, id,
        [=](sandbox_actor sb) mutable { logged_exec(self, id, sb, req, requester, rp); },
        [=](const error& e) mutable { rp.deliver(to_caf(e)); });
      return {};
    },
    [=](put_atom, const std::string& id, std::string& dir,
        std::string& tar) -> caf::delegated<uint64_t> {
      auto& s = self->state;
      if (!s.log && !s.replay.count(id)) {
        if (auto sb = find(self, id)) {
          auto rp = self->make_response_promise<uint64_t>();
          forward_to<uint64_t>(self, *sb, rp, put_atom::value, std::move(dir), std::move(tar));
          return {};
        } else
          return fail_with<uint64_t>(self, sb.error_value());
      }
      auto rp = self->make_response_promise<uint64_t>();
      if (put_from_log(self, id, dir, tar, rp))
        return {};
      with_sandbox(
        self, id,
        [=](sandbox_actor sb) mutable { logged_put(self, id, sb, dir, tar, rp); },
        [=](const error& e) mutable { rp.deliver(to_caf(e)); });
      return {};
    },
    [=](get_atom, const std::string& id, std::string& path) -> caf::delegated<std::string> {
      auto rp = self->make_response_promise<std::string>();
      with_sandbox(
        self, id, [=](sandbox_actor sb) mutable {
          forward_to<std::string>(self, sb, rp, get_atom::value, path);
        },
        [=](const error& e) mutable { rp.deliver(to_caf(e)); });
      return {};
    },
    [=](destroy_atom, const std::string& id) -> caf::delegated<bool> {
      auto& s = self->state;
      auto rp = self->make_response_promise<bool>();
      trajectory_record rec;
      rec.kind = trajectory_record::destroyed;
      rec.sandbox = id;
      if (auto it = s.replay.find(id); it != s.replay.end() && !it->second.materializing) {
        if (it->second.closed) {
          // Destroyed before the resume, destroyed again: as it was.
          it->second.destroyed_again = true;
          rp.deliver(true);
          return {};
        }
        // Never rebuilt: nothing to tear down.
        if (counted(it->second))
          --s.replay_claimed;
        s.replay.erase(it);
        s.destroying.insert(id);
        note_end(self, id);
        commit(self, rec, [rp]() mutable { rp.deliver(true); });
        return {};
      }
      with_sandbox(
        self, id,
        [=](sandbox_actor sb) mutable {
          self->state.destroying.insert(id);
          if (!self->state.log) {
            forward_to<bool>(self, sb, rp, destroy_atom::value);
            return;
          }
          self->request(sb, caf::infinite, destroy_atom::value, self->state.cfg.key)
            .then([=](bool ok) mutable { commit(self, rec, [rp, ok]() mutable { rp.deliver(ok); }); },
                  [=](caf::error& e) mutable { rp.deliver(e); });
        },
        [=](const error& e) mutable { rp.deliver(to_caf(e)); });
      return {};
    },
    [=](lifetime_atom, const std::string& id, uint64_t ms) -> caf::delegated<uint64_t> {
      constexpr uint64_t min_ms = 1000, max_ms = 30ull * 24 * 3600 * 1000;
      auto rp = self->make_response_promise<uint64_t>();
      if (ms < min_ms || ms > max_ms) {
        rp.deliver(to_caf(make_error(errc::invalid_argument,
                                     "set_ttl " + id + ": a TTL of " + std::to_string(ms)
                                       + " ms is out of range (1 s to 30 days)")));
        return {};
      }
      // A sandbox of the log not rebuilt yet has no timer to set: it is
      // rebuilt first, like for any other call on it.
      with_sandbox(
        self, id,
        [=](sandbox_actor sb) mutable {
          if (auto l = self->state.labels.find(id); l != self->state.labels.end())
            l->second.ttl_ms = ms; // said when it runs out
          forward_to<uint64_t>(self, sb, rp, lifetime_atom::value, ms);
        },
        [=](const error& e) mutable { rp.deliver(to_caf(e)); });
      return {};
    },
    [=](network_atom, const std::string& id, const std::vector<std::string>& allow,
        const std::vector<std::string>& deny) -> caf::delegated<bool> {
      auto rp = self->make_response_promise<bool>();
      // With a log: answered from it while replaying, else set and logged.
      if (policy_from_log(self, id, allow, deny, rp))
        return {};
      with_sandbox(
        self, id,
        [=](sandbox_actor sb) mutable {
          if (self->state.log)
            return logged_network(self, id, sb, allow, deny, rp);
          forward_to<bool>(self, sb, rp, network_atom::value, allow, deny);
        },
        [=](const error& e) mutable { rp.deliver(to_caf(e)); });
      return {};
    },
    [=](expose_atom, const std::string& id, uint16_t port) -> caf::delegated<exposed_port> {
      auto rp = self->make_response_promise<exposed_port>();
      with_sandbox(
        self, id,
        [=](sandbox_actor sb) mutable {
          forward_to<exposed_port>(self, sb, rp, expose_atom::value, port);
        },
        [=](const error& e) mutable { rp.deliver(to_caf(e)); });
      return {};
    },
    [=](list_atom) -> caf::result<std::vector<sandbox_info>> { return list_sandboxes(self); },
    [=](watch_atom, const caf::actor& watcher) -> caf::result<uint64_t> {
      auto& s = self->state;
      if (!watcher)
        return to_caf(make_error(errc::invalid_argument, "watch: no watcher given"));
      self->monitor(watcher);
      s.watchers.push_back(watcher);
      uint64_t kept = s.backlog.size();
      for (auto& ev : s.backlog)
        caf::anon_send(watcher, chronus_atom::value, std::move(ev));
      s.backlog.clear();
      s.backlog_bytes = 0;
      return kept;
    },
    [=](chronus_atom, const internal_key& k, chronus_event_msg& ev) {
      note_mailbox(self);
      if (genuine(k, self->state.cfg.key, "chronus (session)"))
        sandbox_event(self, std::move(ev));
    },
    [=](placed_atom, const internal_key& k, uint64_t req, const caf::node_id& where, uint32_t n) {
      if (!genuine(k, process_key(), "placed (session)"))
        return;
      self->state.inflight[where][req] += n;
      settle(self, where, req);
    },
    [=](lost_atom, const internal_key& k, const caf::node_id& where, const std::string& name,
        const std::string& why) {
      if (genuine(k, process_key(), "lost (session)"))
        node_lost(self, where, name, why);
    },
    [=](adopt_atom, const internal_key& k, const std::string& id, const sandbox_actor& sb,
        create_labels& labels, uint32_t count) {
      // One of its sandboxes, kept by its node while the coordinator was
      // gone: this session's again (docs/cluster.md), with its create's key
      // and tags as the node kept them.
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "adopt (session)") || !sb)
        return;
      if (s.closing) {
        caf::anon_send(sb, destroy_atom::value, s.cfg.key);
        return;
      }
      s.sandboxes[id] = sb;
      s.lost_boxes.erase(id);
      s.ended.erase(id);
      adopt_labels(self, id, std::move(labels), count);
    },
    [=](reattach_atom, const internal_key& k, const caf::actor& trainer) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "reattach (session)") || !trainer || s.closing)
        return;
      if (s.cfg.trainer == trainer)
        return;
      if (s.cfg.trainer)
        self->demonitor(s.cfg.trainer.address());
      s.cfg.trainer = trainer;
      s.cfg.owned = true;
      self->monitor(trainer);
    },
    [=](orphan_atom, const internal_key& k) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "orphan (session)") || s.cfg.trainer || s.closing)
        return;
      std::printf("dsecd: session %s: no trainer reattached within --orphan-grace: closing it"
                  " (%zu sandboxes)\n",
                  s.cfg.id.c_str(), s.sandboxes.size());
      std::fflush(stdout);
      close_session(self);
    },
    [=](join_atom, const internal_key& k, const caf::node_id& where) {
      // A node lost while it hung has destroyed what it had and joined
      // again (the same process: the same node id).
      if (!genuine(k, process_key(), "join (session)"))
        return;
      auto& s = self->state;
      if (s.lost_nodes.erase(where))
        s.inflight.erase(where);
    },
    [=](feedback_atom, const std::string& id,
        chronus_feedback_msg& fb) -> caf::delegated<bool> {
      auto& s = self->state;
      auto rp = self->make_response_promise<bool>();
      if (!s.replayed_requests.empty())
        if (auto f = decode_feedback(as_bytes(fb.bytes));
            f && s.replayed_requests.erase({id, f->request_id}) > 0) {
          // An answer to a request replayed from the log: its command has
          // run, and may be over (its sandbox destroyed) by now.
          rp.deliver(true);
          return {};
        }
      if (s.replay.count(id) && !s.sandboxes.count(id)) {
        // A replayed request (or one of a sandbox that is not live): the
        // command that asked has run; the answer changes nothing.
        rp.deliver(true);
        return {};
      }
      if (s.log) {
        trajectory_record rec;
        rec.kind = trajectory_record::answered;
        rec.sandbox = id;
        rec.bytes = fb.bytes;
        append_only(self, rec);
      }
      with_sandbox(
        self, id, [=](sandbox_actor sb) mutable {
          forward_to<bool>(self, sb, rp, feedback_atom::value, fb);
        },
        [=](const error& e) mutable { rp.deliver(to_caf(e)); });
      return {};
    },
    [=](close_atom) -> caf::result<uint32_t> {
      auto rp = self->make_response_promise<uint32_t>();
      self->state.close_waiters.push_back(rp);
      self->state.keep_log = false;
      close_session(self);
      return rp;
    },
    [=](shutdown_atom, const internal_key& k) {
      if (genuine(k, process_key(), "shutdown (session)"))
        close_session(self);
    },
    [=](flush_atom, const internal_key& k) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "flush (session)"))
        return;
      if (s.announce_scheduled) {
        s.announce_scheduled = false;
        for (auto& [req, b] : s.batches)
          announce(b);
      }
      flush(self);
    },
    [=](ready_atom, const internal_key& k, const std::string& id, const sandbox_actor& sb,
        uint64_t req) {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "ready (session)"))
        return;
      if (s.cfg.cluster) {
        auto where = sb.node();
        if (s.lost_nodes.count(where)) {
          // Its node was declared lost (it stopped answering) and it failed
          // then: too late now.
          caf::anon_send(sb, destroy_atom::value, s.cfg.key);
          return;
        }
        --s.inflight[where][req];
        settle(self, where, req);
      }
      --s.pending;
      s.sandboxes.emplace(id, sb); // until its gone_atom, also when closing
      auto it = s.batches.find(req);
      if (s.closing) {
        // Too late: it goes with the rest, counted by close, and its batch
        // hears that it failed rather than that it is ready.
        ++s.closed_count;
        caf::anon_send(sb, destroy_atom::value, s.cfg.key);
        if (it != s.batches.end()) {
          ++it->second.failed;
          if (!it->second.rebuild.empty()) {
            auto r = s.replay.find(it->second.rebuild);
            if (r != s.replay.end()) {
              r->second.broken = make_error(errc::not_found, "session " + s.cfg.id
                                                                 + " closed");
              auto waiting = std::move(r->second.waiting);
              s.replay.erase(r);
              for (auto& f : waiting)
                f();
            }
          }
          if (it->second.listener)
            caf::anon_send(it->second.listener, failed_atom::value,
                           to_caf(make_error(errc::not_found, "sandbox " + id
                                                                + " was ready after session "
                                                                + s.cfg.id + " closed")));
          finish_batch(self, req);
        }
        return;
      }
      if (it != s.batches.end()) {
        if (!it->second.rebuild.empty()) {
          ++it->second.ready;
          auto rebuilt = it->second.rebuild;
          finish_batch(self, req);
          replay_tail(self, rebuilt, sb, 0);
          return;
        }
        auto key = label_sandbox(self, it->second, id);
        // Counted when announced: the batch's reply must not overtake it.
        auto announce = [=] {
          auto& s = self->state;
          auto it = s.batches.find(req);
          if (it == s.batches.end())
            return;
          auto& b = it->second;
          ++b.ready;
          if (b.listener && b.listener.node() != self->node()) {
            // One message (and one serialization) for many.
            b.unannounced.push_back(id);
            if (b.labeled)
              b.unannounced_keys.push_back(key);
            if (b.ready + b.failed < b.count && !s.announce_scheduled) {
              s.announce_scheduled = true;
              self->send(self, flush_atom::value, process_key()); // behind what is in the mailbox
            }
          } else if (b.listener && b.labeled) {
            caf::anon_send(b.listener, ready_atom::value, ready_ids{{id}, {key}});
          } else if (b.listener) {
            caf::anon_send(b.listener, ready_atom::value, id);
          }
          finish_batch(self, req);
        };
        if (s.log) {
          trajectory_record rec;
          rec.kind = trajectory_record::created;
          rec.sandbox = id;
          rec.env = it->second.env;
          rec.group = it->second.group;
          rec.group_count = it->second.count;
          rec.key = key;
          rec.group_key = it->second.key;
          rec.tags = it->second.tags;
          commit(self, rec, announce);
        } else {
          announce();
        }
      }
    },
    [=](failed_atom, const internal_key& k, const caf::error& e, uint64_t req) {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "failed (session)"))
        return;
      if (auto sender = self->current_sender(); s.cfg.cluster && sender) {
        auto where = sender->node();
        if (s.lost_nodes.count(where))
          return; // failed already, when its node was lost
        --s.inflight[where][req];
        settle(self, where, req);
      }
      --s.pending;
      auto it = s.batches.find(req);
      if (it != s.batches.end()) {
        ++it->second.failed;
        if (!it->second.rebuild.empty()) {
          auto r = s.replay.find(it->second.rebuild);
          if (r != s.replay.end()) {
            set_materializing(s, r->second, false);
            r->second.broken = from_caf(e);
            r->second.broken->message = "rebuilding sandbox " + r->first + ": "
                                        + r->second.broken->message;
            auto waiting = std::move(r->second.waiting);
            r->second.waiting.clear();
            for (auto& f : waiting)
              f();
          }
        } else {
          if (s.log) {
            trajectory_record rec;
            rec.kind = trajectory_record::failed;
            rec.env = it->second.env;
            rec.group = it->second.group;
            rec.group_count = it->second.count;
            rec.group_key = it->second.key;
            auto err = from_caf(e);
            rec.fail_code = static_cast<uint8_t>(err.code);
            rec.fail_message = err.message;
            commit(self, rec);
          }
          if (it->second.listener)
            caf::anon_send(it->second.listener, failed_atom::value, e);
        }
        finish_batch(self, req);
      }
      maybe_end(self);
    },
    [=](gone_atom, const internal_key& k, const std::string& id) {
      if (!genuine(k, self->state.cfg.key, "gone (session)"))
        return;
      self->state.sandboxes.erase(id);
      note_end(self, id);
      maybe_end(self);
    },
    [=](ttl_atom, const internal_key& k, const std::string& id) {
      if (!genuine(k, self->state.cfg.key, "ttl (session)"))
        return;
      if (self->state.sandboxes.count(id))
        self->state.expired.insert(id);
    },
    [=](pool_atom, environment& env, uint32_t size) -> caf::result<uint32_t> {
      return set_pool(self, std::move(env), size);
    },
    [=](call_atom, environment& env, exec_request& req) -> caf::result<exec_result> {
      if (req.tty)
        return to_caf(make_error(errc::unsupported,
                                 "terminals (exec -t, pty=) in a function call: start the command"
                                 " in a sandbox of your own instead"));
      if (req.handle || req.open_stdin)
        return to_caf(make_error(errc::invalid_argument,
                                 "a function call's command has no process handle (start it"
                                 " in a sandbox of your own instead)"));
      return function_call(self, std::move(env), std::move(req));
    },
    // ---- process handles (exec_request.handle) ----
    [=](logs_atom, const std::string& id, const logs_request& q) -> caf::delegated<logs_reply> {
      auto sb = find(self, id);
      if (!sb)
        return fail_with<logs_reply>(self, sb.error_value());
      auto rp = self->make_response_promise<logs_reply>();
      forward_to<logs_reply>(self, *sb, rp, logs_atom::value, q);
      return {};
    },
    [=](usage_atom, const std::string& id, bool processes) -> caf::delegated<sandbox_usage> {
      auto sb = find(self, id);
      if (!sb)
        return fail_with<sandbox_usage>(self, sb.error_value());
      auto rp = self->make_response_promise<sandbox_usage>();
      forward_to<sandbox_usage>(self, *sb, rp, usage_atom::value, processes);
      return {};
    },
    [=](signal_atom, const std::string& id, uint64_t eid,
        int32_t sig) -> caf::delegated<bool> {
      auto sb = find(self, id);
      if (!sb)
        return fail_with<bool>(self, sb.error_value());
      auto rp = self->make_response_promise<bool>();
      forward_to<bool>(self, *sb, rp, signal_atom::value, eid, sig);
      return {};
    },
    [=](stdin_atom, const std::string& id, uint64_t eid, std::string& data,
        bool close) -> caf::delegated<uint64_t> {
      auto sb = find(self, id);
      if (!sb)
        return fail_with<uint64_t>(self, sb.error_value());
      auto rp = self->make_response_promise<uint64_t>();
      forward_to<uint64_t>(self, *sb, rp, stdin_atom::value, eid, std::move(data), close);
      return {};
    },
    [=](resize_atom, const std::string& id, uint64_t eid, uint16_t rows,
        uint16_t cols) -> caf::delegated<bool> {
      auto sb = find(self, id);
      if (!sb)
        return fail_with<bool>(self, sb.error_value());
      auto rp = self->make_response_promise<bool>();
      forward_to<bool>(self, *sb, rp, resize_atom::value, eid, rows, cols);
      return {};
    },
    [=](credit_atom, const std::string& id, uint64_t eid,
        uint64_t bytes) -> caf::delegated<bool> {
      auto rp = self->make_response_promise<bool>();
      auto sb = find(self, id);
      if (!sb) { // gone, or not rebuilt (a replayed command streams from the log)
        rp.deliver(false);
        return {};
      }
      forward_to<bool>(self, *sb, rp, credit_atom::value, eid, bytes);
      return {};
    },
    // ---- snapshots (issue 16): actors/session_snapshot.cpp ----
    [=](pause_atom, const std::string& id, bool on) -> caf::result<bool> {
      return pause_one(self, id, on);
    },
    [=](pause_atom, bool on) -> caf::result<uint32_t> { return pause_all(self, on); },
    [=](snapshot_atom, const std::string& id, const std::string& ref)
      -> caf::result<std::string> { return snapshot_one(self, id, ref); },
    [=](fork_atom, const std::string& id, uint32_t count, const caf::actor& listener)
      -> caf::result<uint32_t> { return fork_one(self, id, count, listener); },
  };
}

// ---- warm pools and the function backend (actors/warm_pool.hpp) -----------------

// A warm pool of this session's (session::pool): the scheduler spreads it over
// the nodes; the nodes drop it when the session ends.
caf::result<uint32_t> set_pool(self_ptr self, environment env, uint32_t size) {
  auto& s = self->state;
  if (s.closing)
    return to_caf(make_error(errc::closed, "session " + s.cfg.id + " is closing"));
  if (auto v = env.validate(); !v)
    return to_caf(v.error_value());
  if (size > s.cfg.options.quota)
    return to_caf(make_error(errc::invalid_argument,
                             "session " + s.cfg.id + ": a pool of " + std::to_string(size)
                               + " is larger than its quota of "
                               + std::to_string(s.cfg.options.quota)));
  // Its pooled sandboxes count against the quota: the new size must fit
  // beside what is live, coming and in its other pools.
  auto key = pool_key(env);
  uint32_t was = 0;
  if (auto it = s.pools.find(key); it != s.pools.end())
    was = it->second;
  if (size > was) {
    if (auto e = over_quota(self, size - was))
      return to_caf(make_error(e->code, e->message + " (a pool of " + std::to_string(size) + ")"));
  }
  // Held from now on, so that creates in the meantime see it.
  auto hold = [self, key](uint32_t n) {
    auto& s = self->state;
    auto& p = s.pools[key];
    s.pooled = s.pooled - p + n;
    p = n;
    if (n == 0)
      s.pools.erase(key);
  };
  hold(size);
  auto rp = self->make_response_promise<uint32_t>();
  self
    ->request(s.cfg.scheduler, caf::infinite, pool_atom::value, process_key(), std::move(env),
              size, session_actor{self}, s.cfg.id)
    .then(
      [=](const internal_key& k, uint32_t n) mutable {
        if (genuine(k, self->state.cfg.key, "a reply to pool")) {
          hold(std::min(n, size)); // what the nodes took
          rp.deliver(n);
        } else {
          hold(was);
          rp.deliver(refuse("a reply to pool"));
        }
      },
      [=](caf::error& e) mutable {
        hold(was);
        rp.deliver(e);
      });
  return rp;
}

// The function backend (session::call): a sandbox of `env` from the session's
// create (a warm pool's when one has a ready one), the command, the
// sandbox destroyed; the reply is the command's result once it is gone. A
// helper actor does it through the session's own verbs (quota, lost nodes,
// closing all apply), and answers the caller.
caf::result<exec_result> function_call(self_ptr self, environment env, exec_request req) {
  auto& s = self->state;
  if (s.closing)
    return to_caf(make_error(errc::closed, "session " + s.cfg.id + " is closing"));
  if (auto v = env.validate(); !v)
    return to_caf(v.error_value());
  if (req.argv.empty() || req.argv[0].empty())
    return to_caf(make_error(errc::invalid_argument, "call: no command given"));
  if (req.detach || req.stream)
    return to_caf(make_error(errc::invalid_argument,
                             "call: a function call collects its output (no detach, no stream)"));
  env.backend = std::string{backend_container}; // what the node makes for it
  session_actor me = self;
  auto helper = self->spawn([me](caf::event_based_actor* h) -> caf::behavior {
    struct job {
      caf::response_promise rp;
      exec_request req;
      bool done = false;
    };
    auto j = std::make_shared<job>();
    auto finish = [=](caf::message m) {
      if (j->done)
        return;
      j->done = true;
      j->rp.deliver(std::move(m));
      h->quit();
    };
    return {
      [=](call_atom, environment& env, exec_request& req) {
        j->rp = h->make_response_promise();
        j->req = std::move(req);
        h->request(me, caf::infinite, create_atom::value, std::move(env), uint32_t{1},
                   caf::actor_cast<caf::actor>(h))
          .then([](uint32_t) {}, [=](caf::error& e) { finish(caf::make_message(e)); });
      },
      [=](ready_atom, const std::string& id) {
        auto destroy_then = [=](caf::message m) {
          h->request(me, caf::infinite, destroy_atom::value, id)
            .then([=](bool) { finish(m); }, [=](caf::error&) { finish(m); });
        };
        h->request(me, caf::infinite, exec_atom::value, id, j->req)
          .then([=](exec_result& r) { destroy_then(caf::make_message(std::move(r))); },
                [=](caf::error& e) { destroy_then(caf::make_message(e)); });
      },
      [=](failed_atom, const caf::error& e) { finish(caf::make_message(e)); },
    };
  });
  auto rp = self->make_response_promise<exec_result>();
  rp.delegate(helper, call_atom::value, std::move(env), std::move(req));
  return rp;
}

} // namespace session_detail

session_actor spawn_session(caf::actor_system& sys, session_config cfg) {
  return sys.spawn(session_detail::session_impl, std::move(cfg));
}

} // namespace dsec

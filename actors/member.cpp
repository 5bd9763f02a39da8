#include "actors/member.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <cstdio>
#include <functional>
#include <set>

#include "actors/transport.hpp"
#include "actors/types.hpp"
#include "runtime/metrics.hpp"

namespace dsec {

namespace {

// Members of this process joined to their coordinator now (readiness,
// docs/observability.md).
metrics::gauge& joined_gauge() {
  static auto& g = metrics::process_registry().get_gauge(
    "dsec_cluster_joined", "Nodes of this process joined to their coordinator now.");
  return g;
}
metrics::gauge& members_gauge() {
  static auto& g = metrics::process_registry().get_gauge(
    "dsec_cluster_members", "Nodes of this process that are members of a cluster.");
  return g;
}

struct member_state {
  static inline const char* name = "dsec.member";

  member_state() { members_gauge().add(1); }
  ~member_state() {
    members_gauge().add(-1);
    set_joined(false);
  }
  bool counted_joined = false;
  void set_joined(bool on) {
    joined = on;
    if (on != counted_joined)
      joined_gauge().add(on ? 1 : -1);
    counted_joined = on;
  }

  member_config cfg;
  scheduler_actor coordinator;
  std::string where;         // "host:port" of the coordinator, for messages
  bool joined = false;
  bool joining = false;
  bool beating = false;      // a heartbeat's report is being made
  uint64_t epoch = 0;        // coordinators lost so far
  std::string left_why;      // why the node left (for the reset's message)
  std::string left_sandbox_why; // what its sandboxes are told as they go
  std::vector<std::string> sent_layers;
  uint64_t beats = 0;
  std::string last_error;    // said once, not every retry
  uint64_t attempt = 0;      // connects started (a helper's answer names its own)
  std::chrono::milliseconds backoff{0}; // the next retry's delay (0: the first, 100 ms)
};

using self_ptr = member_actor::stateful_pointer<member_state>;

// When to try joining again: 100 ms, doubling to 2 s (reset once joined).
std::chrono::milliseconds next_retry(member_state& s) {
  using std::chrono::milliseconds;
  s.backoff = s.backoff.count() == 0 ? milliseconds(100)
                                     : std::min(milliseconds(2000), s.backoff * 2);
  return s.backoff;
}

void retry_join(member_actor::stateful_pointer<member_state> self) {
  self->delayed_send(self, next_retry(self->state), join_atom::value, process_key());
}

void say(const std::string& what) {
  std::printf("dsecd: %s\n", what.c_str());
  std::fflush(stdout);
}

// Says an error once until it changes (joins are retried every second).
void say_error(self_ptr self, const std::string& what) {
  if (self->state.last_error != what)
    say(what);
  self->state.last_error = what;
}

// The node's report: its statistics and, when they changed (or every 20th
// time, to correct the coordinator's guesses), its layers. If the node or
// its cache does not answer, `failed` runs instead.
void make_report(self_ptr self, bool all_layers, std::function<void(node_report)> then,
                 std::function<void()> failed) {
  auto& s = self->state;
  self->request(s.cfg.node, std::chrono::seconds(5), stats_atom::value, s.cfg.key)
    .then(
      [=](const internal_key& k, node_stats& ns) {
        auto& s = self->state;
        if (!genuine(k, s.cfg.key, "a reply to stats"))
          return failed();
        auto report = [=](std::vector<std::string> layers, uint64_t fetched,
                          uint64_t fetched_bytes) {
          auto& s = self->state;
          node_report r;
          r.name = s.cfg.name;
          r.slots = ns.slots;
          r.live = ns.live - std::min(ns.live, ns.pooled); // idle pooled ones give way
          r.pools = ns.pools;
          r.creating = ns.creating;
          r.created = ns.created;
          r.failed = ns.failed;
          r.destroyed = ns.destroyed;
          r.fetched_layers = fetched;
          r.fetched_bytes = fetched_bytes;
          r.backends = ns.backends;
          r.cordoned = ns.cordoned;
          r.create_buckets = ns.create_buckets;
          r.create_sum = ns.create_sum;
          if (all_layers || layers != s.sent_layers || s.beats % 20 == 0) {
            r.layers_sent = true;
            r.layers = layers;
            s.sent_layers = std::move(layers);
          }
          then(std::move(r));
        };
        if (!s.cfg.cache) // a simulated node: no layer cache, no layers
          return report({}, 0, 0);
        self->request(s.cfg.cache, std::chrono::seconds(5), list_atom::value, process_key())
          .then(
            [=](std::vector<std::string>& layers, uint64_t fetched, uint64_t fetched_bytes) {
              report(std::move(layers), fetched, fetched_bytes);
            },
            [=](caf::error&) { failed(); });
      },
      [=](caf::error&) { failed(); });
}

void join_with(self_ptr self, scheduler_actor coord, node_report r);

void join(self_ptr self, scheduler_actor coord) {
  make_report(self, true, [=](node_report r0) {
    // The sandboxes the node kept after losing its coordinator (by
    // session): a restarted coordinator adopts them.
    self->request(self->state.cfg.node, std::chrono::seconds(5), held_atom::value, process_key())
      .then(
        [=](const internal_key& k, std::vector<held_session>& held) mutable {
          auto r = std::move(r0);
          if (genuine(k, process_key(), "a reply to held"))
            r.held = std::move(held);
          join_with(self, coord, std::move(r));
        },
        [=](caf::error&) mutable { join_with(self, coord, std::move(r0)); });
  }, [=] {
    // The node did not answer (busy): try again.
    self->state.joining = false;
    retry_join(self);
  });
}

void join_with(self_ptr self, scheduler_actor coord, node_report r) {
  {
    auto& s = self->state;
    size_t kept = 0;
    for (const auto& h : r.held)
      kept += h.sandboxes.size();
    self
      ->request(coord, std::chrono::seconds(10), join_atom::value, s.cfg.key, std::move(r),
                s.cfg.node, s.cfg.store)
      .then(
        [=](const internal_key& k, layer_store_actor& src) {
          auto& s = self->state;
          if (!genuine(k, s.cfg.key, "a reply to join")) {
            s.joining = false;
            say_error(self, "joining the cluster of " + s.where
                              + ": the reply did not carry the cluster's key (retrying with "
                                "backoff)");
            retry_join(self);
            return;
          }
          s.joining = false;
          s.set_joined(true);
          s.coordinator = coord;
          s.last_error.clear();
          s.backoff = std::chrono::milliseconds(0);
          if (coord.node() != self->node()) {
            self->monitor(coord);
            if (src && s.cfg.cache)
              self->send(s.cfg.cache, source_atom::value, process_key(), std::move(src),
                         "the coordinator " + s.where);
            say("joined the cluster of " + s.where + " as " + s.cfg.name
                + (kept > 0 ? " (reporting the " + std::to_string(kept)
                                + " sandboxes it kept)"
                            : std::string{}));
          }
        },
        [=](caf::error& e) {
          auto& s = self->state;
          s.joining = false;
          auto err = from_caf(e);
          std::string hint;
          if (err.code == errc::unauthorized)
            hint = s.cfg.key_file.empty()
                     ? std::string{" (this node's key is not the cluster's)"}
                     : " (this node's key, from " + s.cfg.key_file
                         + ", is not the cluster's: give it a copy of the coordinator's)";
          say_error(self, "joining the cluster of " + s.where + ": " + err.message + hint
                            + " (retrying with backoff, up to every 2 s)");
          retry_join(self);
        });
  }
}

// The coordinator is gone (or forgot us): the node's sandboxes belonged to its
// sessions. After `delay`, destroy them, then join again.
void leave(self_ptr self, std::chrono::milliseconds delay, std::string why,
           std::string sandbox_why) {
  auto& s = self->state;
  s.set_joined(false);
  s.left_why = std::move(why);
  s.left_sandbox_why = std::move(sandbox_why);
  if (s.coordinator)
    self->demonitor(s.coordinator.address());
  s.coordinator = nullptr;
  ++s.epoch;
  self->delayed_send(self, delay, reset_atom::value, process_key(), s.epoch);
}

member_actor::behavior_type member_impl(self_ptr self, member_config cfg) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.where = st.cfg.coordinator ? std::string{"this process"}
                                : st.cfg.host + ":" + std::to_string(st.cfg.port);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    if (!s.coordinator || dm.source != s.coordinator.address()
        || !really_down(s.coordinator, "a down message of the coordinator"))
      return;
    // Its sandboxes are kept (each for --orphan-grace, actors/sandbox.cpp)
    // for a coordinator restarted on the same address, which this node joins
    // again as soon as it answers, reporting them (node_report.held).
    say("lost the coordinator " + s.where + " (" + in_words(dm.reason)
        + "): its ready sandboxes here are kept for " + std::to_string(s.cfg.grace.count())
        + " ms (--orphan-grace) for a coordinator restarted there; joining again");
    s.set_joined(false);
    self->demonitor(s.coordinator.address());
    s.coordinator = nullptr;
    ++s.epoch;
    s.backoff = std::chrono::milliseconds(0);
    retry_join(self);
  });
  self->send(self, join_atom::value, process_key());
  self->send(self, beat_atom::value, process_key());
  return {
    [=](join_atom, const internal_key& k) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "join (member)"))
        return;
      if (s.joined || s.joining)
        return;
      s.joining = true;
      if (s.cfg.coordinator)
        return join(self, s.cfg.coordinator);
      caf::actor mm = s.cfg.connector;
      if (!mm)
        mm = caf::actor_cast<caf::actor>(self->system().middleman().actor_handle());
      // The connect is asked by a helper that is never named over a
      // connection: a peer can send a message to the member (it sent its
      // handle to the coordinator), and so could pose as the middleman's
      // answer to a request of the member's, handing it a coordinator of its
      // own, to which the member would send the cluster's key.
      auto attempt = ++s.attempt;
      member_actor me = self;
      auto host = s.cfg.host;
      auto port = s.cfg.port;
      self->spawn([=](caf::event_based_actor* h) -> caf::behavior {
        h->request(caf::actor_cast<caf::io::middleman_actor>(mm), std::chrono::seconds(10),
                   caf::connect_atom::value, host, port)
          .then(
            [=](caf::node_id&, caf::strong_actor_ptr& p, std::set<std::string>&) {
              caf::anon_send(me, join_atom::value, process_key(), attempt,
                             caf::actor_cast<scheduler_actor>(p), std::string{});
              h->quit();
            },
            [=](caf::error& e) {
              caf::anon_send(me, join_atom::value, process_key(), attempt, scheduler_actor{},
                             connect_error(h->system(), e, host, port).message);
              h->quit();
            });
        return caf::behavior{}; // nothing else: it ends with the answer
      });
    },
    [=](join_atom, const internal_key& k, uint64_t attempt, scheduler_actor& coord,
        const std::string& why) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "join (member)") || attempt != s.attempt || !s.joining)
        return;
      if (!why.empty()) {
        s.joining = false;
        say_error(self, "cannot join the coordinator " + s.where + ": " + why
                          + " (retrying with backoff, up to every 2 s)");
        retry_join(self);
        return;
      }
      if (!coord) {
        s.joining = false;
        say_error(self, "joining the cluster of " + s.where
                          + ": nothing is published there (retrying with backoff, up to every 2 s)");
        retry_join(self);
        return;
      }
      join(self, std::move(coord));
    },
    [=](beat_atom, const internal_key& k) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "beat (member)"))
        return;
      self->delayed_send(self, s.cfg.interval, beat_atom::value, process_key());
      if (!s.joined || s.beating)
        return;
      s.beating = true;
      ++s.beats;
      make_report(self, false, [=](node_report r) {
        auto& s = self->state;
        if (!s.joined) {
          s.beating = false;
          return;
        }
        auto coord = s.coordinator;
        // The next beat does not wait for this one's reply: the reply comes
        // over the coordinator's side of the link, which may be busy with
        // layer bytes for this node (a slow link queues seconds of them), and
        // a beat held back for it would have the node declared lost.
        s.beating = false;
        self->request(coord, 3 * s.cfg.interval, beat_atom::value, s.cfg.key, std::move(r))
          .then(
            [=](const internal_key& k, bool known) {
              auto& s = self->state;
              if (!genuine(k, s.cfg.key, "a reply to beat"))
                return;
              if (!known && s.joined && s.coordinator == coord) {
                say("the coordinator " + s.where
                    + " no longer counts this node (it was declared lost): destroying its "
                      "sandboxes and joining again");
                leave(self, std::chrono::milliseconds(0),
                      "destroyed {} sandboxes of this node, which the coordinator declared lost",
                      "was destroyed: the coordinator " + s.where
                        + " declared its node lost (it missed its heartbeats), and its "
                          "session had reported it lost then");
              }
            },
            [](caf::error&) {});
      }, [=] { self->state.beating = false; });
    },
    [=](reset_atom, const internal_key& k, uint64_t epoch) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "reset (member)") || epoch != s.epoch || s.joined)
        return;
      self->request(s.cfg.node, caf::infinite, reset_atom::value, process_key(), s.left_sandbox_why)
        .then(
          [=](uint32_t n) {
            // After a lost coordinator most went already, as their sessions
            // became unreachable; this is for whatever did not.
            auto text = self->state.left_why;
            if (auto at = text.find("{}"); at != std::string::npos)
              text.replace(at, 2, std::to_string(n));
            say(text + "; joining again");
            self->send(self, join_atom::value, process_key());
          },
          [=](caf::error&) { self->send(self, join_atom::value, process_key()); });
    },
  };
}

} // namespace

member_actor spawn_member(caf::actor_system& sys, member_config cfg) {
  return sys.spawn(member_impl, std::move(cfg));
}

} // namespace dsec

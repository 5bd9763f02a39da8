// warm_pool: a node's warm pools, the bookkeeping the node actor
// (actors/node.cpp) keeps for them. A pool holds `target` READY sandboxes of
// one environment (every field but its TTL equal: pool_key), made in the
// background (containers, which the function backend's calls take too, or
// microVMs, booted before anyone asks), that no caller has
// touched: a pooled sandbox refuses every command, put, get and signal, and
// is reachable by nobody's lookup. A create on the node for an equal
// environment (of the pool's owning session, or of any session for a pool
// of the node's own) claims one in one message (claim_atom to the sandbox:
// its new session, create request and TTL), and the node makes another.
//
//   - Pools of a session (session::pool) end with it: its pooled sandboxes
//     monitor it, and the node monitors it to drop its pools.
//   - Pools of the node (dsecd --pool, `dsec pool set`) live with the node.
//   - Pooled sandboxes count against the node's slots; a create that finds
//     no free slot destroys idle pooled sandboxes (of any pool) to proceed.
//   - Under memory pressure (node_config.pool_pressure_file, PSI format: the
//     "some avg10=" figure at or over pool_pressure_avg10; or, without that
//     file, MemAvailable under 5% of MemTotal), checked on a timer, off the
//     create path: pools stop refilling and their idle sandboxes are
//     destroyed, before anything else on the node is touched. Refilled when
//     the pressure is gone.
#pragma once

#include <caf/actor_addr.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "actors/interfaces.hpp"
#include "runtime/error.hpp"

namespace dsec {

/// What makes two environments interchangeable for a pool: every field but
/// the TTL (layers, snapshot, limits, network and its policy, exposed ports,
/// host mounts, Chronus, and the backend, the function backend's being the
/// container's), after the node's defaults are filled in.
std::string pool_key(const environment& env);
/// Whether sandboxes of `env` can come from a pool: its backend is the
/// container, the function or the microvm backend.
bool poolable(const environment& env);

/// A pool spec NAME@V=N, with optional ",workdir=W@V", ",tool=T@V",
/// ",memory=SIZE", ",net", ",chronus", ",microvm" parts (dsecd --pool).
struct pool_spec {
  environment env;
  uint32_t size = 0;
};
expected<pool_spec> parse_pool_spec(const std::string& text);

/// Whether the node's memory is under pressure: `psi_file` (PSI format, as
/// /proc/pressure/memory) says "some avg10=" at least `avg10`; if it cannot
/// be read, MemAvailable of /proc/meminfo is under 5% of MemTotal.
bool memory_pressure(const std::string& psi_file, double avg10);

class warm_pools {
public:
  struct pool {
    uint64_t id = 0;
    std::string key;        ///< pool_key(env)
    std::string asked_key;  ///< pool_key of the environment before the node's defaults
    environment env;        ///< with the node's defaults
    session_actor owner;    ///< null: the node's own
    std::string owner_id;   ///< the session id, or "node"
    uint32_t target = 0;
    std::deque<std::string> ready;          ///< oldest first
    std::unordered_set<std::string> warming; ///< being created
    uint64_t claimed = 0, refills = 0, evicted = 0;
  };

  /// Sets (or with size 0 removes) the pool of `env` (the node's defaults
  /// filled in; `asked_key`: pool_key of it before) owned by `owner`.
  /// Returns the pool's id (0 when removed), and in `orphans` the ids of
  /// the sandboxes no pool keeps any more (to destroy).
  uint64_t set(const environment& env, const std::string& asked_key, const session_actor& owner,
               const std::string& owner_id, uint32_t size, std::vector<std::string>& orphans);
  /// Removes every pool owned by `owner`; their sandboxes go to `orphans`.
  void drop_owner(const caf::actor_addr& owner, std::vector<std::string>& orphans);
  /// Removes the pools of sessions (a node that lost its coordinator).
  void drop_sessions(std::vector<std::string>& orphans);

  /// A ready pooled sandbox a create of `env` by `session` may claim (its
  /// own pools first, then the node's), taken out of its pool; nullopt if none.
  std::optional<std::string> take(const environment& env, const caf::actor_addr& session);
  /// An idle pooled sandbox to destroy for a real create (the pool with the
  /// most ready first; with `only_microvm`, of a microVM pool, for a create
  /// that needs a microVM slot); nullopt if none. Counted as released until gone.
  std::optional<std::string> evict(bool only_microvm = false);
  /// Whether `id` was given up by its pool and is not gone yet.
  [[nodiscard]] bool releasing(const std::string& id) const { return released_.count(id) > 0; }

  /// A new pooled sandbox `id` of pool `pool` is being made.
  void warming(uint64_t pool, const std::string& id);
  /// `id` is ready: true if it is pooled (the node must not count it as a caller's).
  bool ready(const std::string& id);
  /// `id` is gone; true if it was pooled (or released from a pool).
  bool gone(const std::string& id);
  /// Whether `id` is pooled (warming or ready, not yet claimed).
  [[nodiscard]] bool pooled(const std::string& id) const { return member_.count(id) > 0; }

  /// The pools that want more sandboxes, most short first: (pool id, how
  /// many more), given `room` free slots. None under pressure.
  std::vector<std::pair<uint64_t, uint32_t>> wanted(uint32_t room) const;
  [[nodiscard]] const pool* find(uint64_t id) const;

  /// Memory pressure now: true shrinks every pool (its ready ones go to
  /// `orphans`) until it is set false again.
  void set_pressure(bool on, std::vector<std::string>& orphans);
  [[nodiscard]] bool pressure() const { return pressure_; }

  /// Pooled sandboxes destroyed and not yet gone: their slots count as free.
  [[nodiscard]] uint32_t releasing() const { return static_cast<uint32_t>(released_.size()); }
  /// Pooled sandboxes now (ready or warming).
  [[nodiscard]] uint32_t size() const { return static_cast<uint32_t>(member_.size()); }
  [[nodiscard]] bool empty() const { return pools_.empty(); }
  std::vector<pool_info> infos(const std::string& node) const;

private:
  void release(pool& p, std::vector<std::string>& orphans);
  /// Removes the pools `drop` picks, their sandboxes (ready or warming) to `orphans`.
  void drop_where(const std::function<bool(const pool&)>& drop, std::vector<std::string>& orphans);

  std::map<uint64_t, pool> pools_;
  std::unordered_map<std::string, uint64_t> member_; // sandbox id -> pool id
  std::unordered_set<std::string> released_;
  uint64_t next_ = 1;
  bool pressure_ = false;
};

} // namespace dsec

// cluster_map: the coordinator's picture of its nodes, and where the next
// sandboxes go. Plain C++ (no CAF), owned by the scheduler actor.
//
// Placement is power-of-k choices: for each piece of a create request it looks
// at k = 3 candidates, never at every node:
//   - a node that holds the environment's most specific layer (its workdir, else
//     its base), drawn from the index of holders, for locality;
//   - the next node in round-robin order, so that a batch reaches every node;
//   - a node drawn at random.
// Each candidate's score is led by its free fraction (free slots / slots,
// counting what was placed since its last heartbeat) divided by (1 + 2 x
// pieces of this batch it already got); locality only breaks near ties: a node
// holding the environment's layers (the most specific one counting twice)
// gains up to `locality_bonus` (0.03, i.e. 3% of its slots), and the
// coordinator's own node (the source of the layers, `fill_last`) loses
// `fill_last_penalty` (0.05): among nodes equally free it is chosen last, and
// it fills only once the others are 5% fuller than it. Free capacity
// dominates: a node missing a layer fetches it once, then holds it. A node
// never gets an environment with a layer it lacks that the source's reports
// do not list while another node's do (it could not fetch it); a layer no
// report lists yet (built on the source since its last report), or a cluster
// without a source (a simulated one), is taken to be fetchable.
//
// Warm pools come first: a node whose last report had ready pooled sandboxes
// of the batch's environment (the session's own pools, or the nodes' own) is
// a fourth candidate, and while it has such sandboxes left (its report's count
// less what was placed there since) it gains `pool_bonus`, more than anything
// else weighs: a claim takes one message, and the slot is the pool's already.
//
// The best candidate with a free slot takes the piece; when it is the
// coordinator's own node or already has a piece of this batch, the next two
// other nodes in round-robin order are looked at too (the three candidates may
// all have been the same node); only when all are full (or cannot run the
// environment) are more nodes looked at. A batch is cut into pieces of ceil(count / nodes), at most 64, so
// that it is spread rather than piled onto one node.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace dsec {

struct cluster_node {
  uint32_t id = 0;         ///< the map's id, stable while the node is up
  std::string name;
  uint32_t slots = 0;      ///< admission limit (reported)
  uint32_t live = 0;       ///< reported live sandboxes
  uint32_t placed = 0;     ///< placed since its last report
  std::unordered_set<std::string> layers; ///< NAME@VERSION it holds (or will: placed there)
  std::unordered_set<std::string> reported; ///< those its reports listed (in its store)
  std::chrono::steady_clock::time_point last_report;
  size_t pos = 0;          ///< its index in the map's dense list
  /// The coordinator's own node: its store is where the others fetch
  /// layers from; among equals it is chosen last.
  bool fill_last = false;
  /// The backends it offers (actors/backend.hpp): a sandbox goes only to a
  /// node that offers its environment's backend. Until its first report
  /// says otherwise, a node offers "container".
  std::vector<std::string> backends{"container"};
  /// Cordoned (`dsec node cordon`): nothing is placed there.
  bool cordoned = false;
  /// It refused a piece (full after all) since its last report.
  bool refused = false;
  /// Ready pooled sandboxes by pool ("OWNER\nKEY": the owning session's id or
  /// "node", and the pool's key), from its last report, less those placed
  /// there since.
  std::unordered_map<std::string, uint32_t> pooled;

  [[nodiscard]] bool offers(const std::string& backend) const {
    for (const auto& b : backends)
      if (b == backend)
        return true;
    return false;
  }

  [[nodiscard]] uint32_t free() const {
    uint64_t used = uint64_t{live} + placed;
    return used >= slots ? 0 : static_cast<uint32_t>(slots - used);
  }
  /// Whether it may have room although free() says none: `placed` counts
  /// every sandbox placed since its last report, also those destroyed since,
  /// so under churn (creates and destroys faster than reports) it runs out
  /// while the node has room. Its report had room and it has not refused
  /// since: the node, which admits by its own count, decides.
  [[nodiscard]] bool may_have_room() const { return !refused && live < slots; }
};

class cluster_map {
public:
  explicit cluster_map(uint64_t seed = std::random_device{}()) : rng_(seed) {}

  /// Adds a node; returns its id. `fill_last`: the coordinator's own node
  /// (the layers' source; chosen last among equals).
  uint32_t add(std::string name, uint32_t slots, uint32_t live,
               const std::vector<std::string>& layers, bool fill_last = false);
  /// Removes a node (lost or gone); its id is not reused.
  void remove(uint32_t id);
  /// A heartbeat: capacity, and the layers it holds when `layers` is given.
  void report(uint32_t id, uint32_t slots, uint32_t live,
              const std::vector<std::string>* layers);
  /// Counts `n` sandboxes placed on node `id` until its next report, and the
  /// layers as held there (they will be, once fetched).
  void placed(uint32_t id, uint32_t n, const std::vector<std::string>& refs);
  /// Marks a node as full until its next report (it refused sandboxes).
  void full(uint32_t id);
  /// A heartbeat's warm pools: ready sandboxes by "OWNER\nKEY" (see
  /// cluster_node::pooled); replaces what the node had.
  void pools(uint32_t id, std::unordered_map<std::string, uint32_t> ready);
  /// The backends node `id` offers (from its join and its reports).
  void offers(uint32_t id, std::vector<std::string> backends);
  /// Cordons (nothing is placed there) or uncordons node `id`.
  void cordon(uint32_t id, bool on);
  /// Whether any node up offers `backend`.
  [[nodiscard]] bool offered(const std::string& backend) const;

  [[nodiscard]] cluster_node* find(uint32_t id);
  [[nodiscard]] size_t size() const { return up_.size(); }
  [[nodiscard]] const std::vector<uint32_t>& up() const { return up_; }

  /// One batch being placed: which nodes already got pieces of it.
  struct batch {
    std::vector<std::string> refs; ///< the environment's layers
    std::string key;               ///< its most specific layer
    std::string backend = "container"; ///< only nodes offering it are picked
    uint32_t only = 0; ///< a node's id: only it is picked (placement.near); 0: any
    std::unordered_map<uint32_t, uint32_t> pieces;
    /// Warm pools it may claim from: "SESSION\nKEY" (the placing session's
    /// pools) and "node\nKEY" (the nodes' own); empty: none (a sandbox
    /// rebuilt from a log, another backend).
    std::string own_pool, node_pool;
  };
  /// `snapshot` (environment.snapshot): a diff whose recorded environment
  /// gives the base; it is then the batch's key.
  static batch make_batch(const std::string& base, const std::string& workdir,
                          const std::vector<std::string>& tools,
                          std::string backend = "container", const std::string& snapshot = {});

  /// `n` sandboxes of batch `b` placed on node `id`: that many fewer of its
  /// ready pooled ones are left for the next pieces (until its next report).
  void claimed(uint32_t id, const batch& b, uint32_t n);
  /// Whether any node's last report had a ready pooled sandbox (the
  /// scheduler computes a batch's pool keys only then).
  [[nodiscard]] bool any_pooled() const { return !pool_holders_.empty(); }
  /// Ready pooled sandboxes node `n` has for batch `b` (by its last report).
  [[nodiscard]] uint32_t pooled_for(const cluster_node& n, const batch& b) const;

  /// The size of each piece of a batch of `count`.
  [[nodiscard]] uint32_t piece_size(uint32_t count) const;

  /// Chooses the node for the next piece; 0 when no node has a free slot.
  /// When the k candidates are all full, `tries` more random ones are looked
  /// at, then the nodes in order (only a nearly full cluster pays for that).
  uint32_t pick(batch& b, unsigned tries = 3);

  /// The nodes holding a layer (for tests and `cluster status`).
  [[nodiscard]] size_t holders(const std::string& ref) const;

  /// What locality and being the coordinator's own node weigh against the
  /// free fraction (see the top of this file).
  static constexpr double locality_bonus = 0.03;
  static constexpr double fill_last_penalty = 0.05;
  /// What a ready pooled sandbox of the batch's environment weighs: more
  /// than a node's whole free fraction.
  static constexpr double pool_bonus = 1.0;

private:
  /// Whether node `n` is not cordoned, offers the backend of `b`, and holds,
  /// or can fetch from the source, every layer of it.
  bool can_run(const cluster_node& n, const batch& b) const;
  double score(const cluster_node& n, const batch& b) const;
  void index_layers(cluster_node& n, const std::vector<std::string>& layers);
  void unindex(cluster_node& n);
  void unindex_pools(cluster_node& n);

  std::unordered_map<uint32_t, cluster_node> nodes_;
  std::vector<uint32_t> up_; // dense, for drawing at random
  std::unordered_map<std::string, std::vector<uint32_t>> holders_;
  std::unordered_map<std::string, uint32_t> reporters_; // how many nodes' reports list a layer
  std::unordered_map<std::string, std::vector<uint32_t>> pool_holders_; // "OWNER\nKEY" -> nodes
  uint32_t next_id_ = 1;
  uint32_t source_ = 0; // the fill_last node's id, 0: none
  size_t cursor_ = 0;
  std::mt19937_64 rng_;
};

} // namespace dsec

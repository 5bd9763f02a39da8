#include "actors/cluster_map.hpp"

#include <algorithm>

namespace dsec {

namespace {

// Takes node `id` out of index[key], and the key out once nobody holds it.
void drop_holder(std::unordered_map<std::string, std::vector<uint32_t>>& index,
                 const std::string& key, uint32_t id) {
  auto it = index.find(key);
  if (it == index.end())
    return;
  std::erase(it->second, id);
  if (it->second.empty())
    index.erase(it);
}

} // namespace

uint32_t cluster_map::add(std::string name, uint32_t slots, uint32_t live,
                          const std::vector<std::string>& layers, bool fill_last) {
  uint32_t id = next_id_++;
  auto& n = nodes_[id];
  n.id = id;
  n.fill_last = fill_last;
  if (fill_last)
    source_ = id;
  n.name = std::move(name);
  n.slots = slots;
  n.live = live;
  n.last_report = std::chrono::steady_clock::now();
  n.pos = up_.size();
  up_.push_back(id);
  index_layers(n, layers);
  return id;
}

void cluster_map::remove(uint32_t id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end())
    return;
  unindex(it->second);
  unindex_pools(it->second);
  if (source_ == id)
    source_ = 0;
  size_t pos = it->second.pos;
  up_[pos] = up_.back();
  nodes_[up_[pos]].pos = pos;
  up_.pop_back();
  nodes_.erase(it);
}

void cluster_map::report(uint32_t id, uint32_t slots, uint32_t live,
                         const std::vector<std::string>* layers) {
  auto* n = find(id);
  if (!n)
    return;
  n->slots = slots;
  n->live = live;
  n->placed = 0;
  n->refused = false;
  n->last_report = std::chrono::steady_clock::now();
  if (layers) {
    unindex(*n);
    index_layers(*n, *layers);
  }
}

void cluster_map::placed(uint32_t id, uint32_t count, const std::vector<std::string>& refs) {
  auto* n = find(id);
  if (!n)
    return;
  n->placed += count;
  for (const auto& r : refs)
    if (n->layers.insert(r).second)
      holders_[r].push_back(id);
}

void cluster_map::pools(uint32_t id, std::unordered_map<std::string, uint32_t> ready) {
  auto* n = find(id);
  if (!n)
    return;
  unindex_pools(*n);
  for (auto it = ready.begin(); it != ready.end();)
    it = it->second == 0 ? ready.erase(it) : std::next(it);
  n->pooled = std::move(ready);
  for (const auto& [k, r] : n->pooled)
    pool_holders_[k].push_back(id);
}

void cluster_map::unindex_pools(cluster_node& n) {
  for (const auto& [k, r] : n.pooled)
    drop_holder(pool_holders_, k, n.id);
  n.pooled.clear();
}

uint32_t cluster_map::pooled_for(const cluster_node& n, const batch& b) const {
  uint32_t r = 0;
  for (const auto* k : {&b.own_pool, &b.node_pool})
    if (!k->empty())
      if (auto it = n.pooled.find(*k); it != n.pooled.end())
        r += it->second;
  return r;
}

void cluster_map::claimed(uint32_t id, const batch& b, uint32_t n) {
  auto* node = find(id);
  if (!node)
    return;
  for (const auto* k : {&b.own_pool, &b.node_pool}) { // its own pools first, as the node does
    if (k->empty() || n == 0)
      continue;
    auto it = node->pooled.find(*k);
    if (it == node->pooled.end())
      continue;
    auto took = std::min(n, it->second);
    it->second -= took;
    n -= took;
  }
}

void cluster_map::full(uint32_t id) {
  if (auto* n = find(id)) {
    n->placed = n->slots;
    n->refused = true;
  }
}

void cluster_map::offers(uint32_t id, std::vector<std::string> backends) {
  if (auto* n = find(id))
    n->backends = std::move(backends);
}

void cluster_map::cordon(uint32_t id, bool on) {
  if (auto* n = find(id))
    n->cordoned = on;
}

bool cluster_map::offered(const std::string& backend) const {
  for (const auto& [id, n] : nodes_)
    if (n.offers(backend))
      return true;
  return false;
}

cluster_node* cluster_map::find(uint32_t id) {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

cluster_map::batch cluster_map::make_batch(const std::string& base, const std::string& workdir,
                                           const std::vector<std::string>& tools,
                                           std::string backend, const std::string& snapshot) {
  batch b;
  b.backend = std::move(backend);
  if (!base.empty())
    b.refs.push_back(base);
  if (!snapshot.empty())
    b.refs.push_back(snapshot);
  if (!workdir.empty())
    b.refs.push_back(workdir);
  b.refs.insert(b.refs.end(), tools.begin(), tools.end());
  b.key = !snapshot.empty() ? snapshot : workdir.empty() ? base : workdir;
  return b;
}

uint32_t cluster_map::piece_size(uint32_t count) const {
  uint32_t n = std::max<uint32_t>(1, static_cast<uint32_t>(up_.size()));
  return std::clamp<uint32_t>((count + n - 1) / n, 1, 64);
}

bool cluster_map::can_run(const cluster_node& n, const batch& b) const {
  if (n.cordoned || !n.offers(b.backend) || (b.only != 0 && n.id != b.only))
    return false;
  if (!source_)
    return true;
  auto src = nodes_.find(source_);
  if (src == nodes_.end())
    return true;
  // A layer that some node's store has and the source's lacks stays where it
  // is; one that no report lists yet (built on the source since its last
  // report, or unknown) is left to the node to fetch or refuse.
  for (const auto& r : b.refs)
    if (!n.layers.count(r) && !src->second.reported.count(r) && reporters_.count(r))
      return false;
  return true;
}

double cluster_map::score(const cluster_node& n, const batch& b) const {
  if (n.slots == 0)
    return 0;
  double free_frac = static_cast<double>(n.free()) / n.slots;
  // The most specific layer (the key) counts twice: it is what sets
  // environments apart, a base is shared by many.
  size_t held = n.layers.count(b.key);
  for (const auto& r : b.refs)
    held += n.layers.count(r);
  double locality = b.refs.empty() ? 0 : static_cast<double>(held) / (b.refs.size() + 1);
  auto p = b.pieces.find(n.id);
  double pieces = p == b.pieces.end() ? 0 : p->second;
  // A piece of this batch already there weighs more than anything: a batch
  // is spread first. Then free capacity; locality and the coordinator's own
  // node only tip the balance between nodes about as free (a node fetches a
  // missing layer once, then holds it).
  return free_frac / (1 + 2 * pieces) + locality_bonus * locality
         - (n.fill_last ? fill_last_penalty : 0) + (pooled_for(n, b) > 0 ? pool_bonus : 0);
}

uint32_t cluster_map::pick(batch& b, unsigned tries) {
  if (up_.empty())
    return 0;
  uint32_t cand[4] = {0, 0, 0, 0};
  if (auto h = holders_.find(b.key); h != holders_.end() && !h->second.empty())
    cand[0] = h->second[rng_() % h->second.size()];
  // A node with a ready pooled sandbox for it (its own pools first).
  for (const auto* k : {&b.own_pool, &b.node_pool}) {
    if (cand[3] || k->empty())
      continue;
    if (auto h = pool_holders_.find(*k); h != pool_holders_.end())
      for (auto id : h->second)
        if (auto* n = find(id); n && pooled_for(*n, b) > 0) {
          cand[3] = id;
          break;
        }
  }
  // Round robin over nodes with room: a full (or zero-slot) node is stepped
  // over, a few at most.
  for (size_t i = 0; i < std::min<size_t>(8, up_.size()); ++i) {
    auto id = up_[cursor_++ % up_.size()];
    cand[1] = id;
    if (nodes_[id].free() > 0)
      break;
  }
  cand[2] = up_[rng_() % up_.size()];
  uint32_t best = 0;
  double best_score = -1;
  auto consider = [&](uint32_t id) {
    auto* n = find(id);
    if (!n || n->free() == 0 || !can_run(*n, b))
      return;
    double s = score(*n, b);
    if (s > best_score) {
      best_score = s;
      best = id;
    }
  };
  // Round robin first: a tie goes to it, which spreads batches.
  for (auto id : {cand[1], cand[0], cand[2], cand[3]})
    if (id)
      consider(id);
  // The three candidates may all have been one node. When the best is the
  // coordinator's own node (chosen last) or one that already has a piece of
  // this batch (spread first), the next two other nodes in round-robin order
  // get a look too.
  if (best && up_.size() > 1 && (best == source_ || b.pieces.count(best))) {
    auto first = best;
    for (size_t i = 0, seen = 0; seen < 2 && i < std::min<size_t>(8, up_.size()); ++i) {
      // (the cursor stays: the next pick's round-robin candidate is the next node)
      auto id = up_[(cursor_ + i) % up_.size()];
      if (id == first)
        continue;
      ++seen;
      consider(id);
    }
  }
  // All three full: a few more random draws, then (a nearly full cluster)
  // the first node with a free slot from the round-robin cursor on.
  for (unsigned i = 0; best == 0 && i < tries; ++i)
    consider(up_[rng_() % up_.size()]);
  for (size_t i = 0; best == 0 && i < up_.size(); ++i)
    consider(up_[(cursor_ + i) % up_.size()]);
  // None has room by the count since the reports: the first, from the
  // cursor on, whose report had room and that has not refused since (the
  // count also holds those destroyed since; the node admits by its own).
  for (size_t i = 0; best == 0 && i < up_.size(); ++i) {
    auto id = up_[(cursor_ + i) % up_.size()];
    auto& n = nodes_[id];
    if (n.may_have_room() && can_run(n, b))
      best = id;
  }
  if (best)
    ++b.pieces[best];
  return best;
}

size_t cluster_map::holders(const std::string& ref) const {
  auto it = holders_.find(ref);
  return it == holders_.end() ? 0 : it->second.size();
}

void cluster_map::index_layers(cluster_node& n, const std::vector<std::string>& layers) {
  for (const auto& r : layers) {
    if (n.layers.insert(r).second)
      holders_[r].push_back(n.id);
    if (n.reported.insert(r).second)
      ++reporters_[r];
  }
}

void cluster_map::unindex(cluster_node& n) {
  for (const auto& r : n.layers)
    drop_holder(holders_, r, n.id);
  n.layers.clear();
  for (const auto& r : n.reported)
    if (auto it = reporters_.find(r); it != reporters_.end() && --it->second == 0)
      reporters_.erase(it);
  n.reported.clear();
}

} // namespace dsec

#include "runtime/engine.hpp"

namespace dsec {

expected<std::unique_ptr<engine>> engine::start(const engine_options& opts) {
  std::unique_ptr<engine> e{new engine};
  DSEC_TRY(st, store::open(opts.state_dir));
  e->store_.emplace(std::move(st));
  spawner::options so;
  so.netns_prewarm = opts.netns_prewarm;
  for (unsigned i = 0; i < std::max(1u, opts.spawners); ++i) {
    DSEC_TRY(sp, spawner::start(so));
    e->spawners_.push_back(std::move(sp));
  }
  for (auto& sp : e->spawners_)
    DSEC_TRY_VOID(sp->ready());
  DSEC_TRY(r, reactor::start(4096));
  e->reactor_ = std::move(r);
  e->chronus_ = std::make_unique<chronus_endpoint>(*e->reactor_, opts.chronus);
  e->cgroup_pool_ = opts.cgroup_pool;
  return e;
}

spawner& engine::pick() {
  return *spawners_[next_.fetch_add(1, std::memory_order_relaxed) % spawners_.size()];
}

expected<const cgroup_root*> engine::cgroups() {
  std::lock_guard<std::mutex> guard{cgroups_mu_};
  if (cgroups_)
    return &*cgroups_;
  if (cgroups_error_)
    return *cgroups_error_;
  auto root = cgroup_root::detect();
  if (!root) {
    cgroups_error_ = root.error_value();
    return std::move(root).error_value();
  }
  cgroups_.emplace(std::move(*root));
  if (cgroup_pool_ > 0)
    cgroups_->enable_pool(cgroup_pool_);
  return &*cgroups_;
}

dsec::cgroup_pool_stats engine::cgroup_pool_stats() {
  std::lock_guard<std::mutex> guard{cgroups_mu_};
  return cgroups_ ? cgroups_->pool_stats() : dsec::cgroup_pool_stats{};
}

std::vector<std::string> engine::collect_garbage() {
  std::vector<std::string> removed;
  if (auto cg = cgroups()) {
    if (auto r = (*cg)->collect_garbage())
      for (auto& path : *r)
        removed.push_back("cgroup " + path);
  }
  return removed;
}

engine::~engine() {
  // The Chronus endpoint closes its sockets on the reactor thread; then the
  // reactor, whose callbacks post to actors that may reference us.
  chronus_.reset();
  reactor_.reset();
  spawners_.clear();
}

} // namespace dsec

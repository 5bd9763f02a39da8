#include "runtime/builder.hpp"
#include "runtime/snapshot.hpp"
#include "runtime/spawner.hpp"

namespace dsec {

container_options container_options_for(const environment& env, build_extras extras) {
  container_options o;
  o.id = std::move(extras.id);
  o.hostname = std::move(extras.hostname);
  o.net = env.net;
  o.chronus = env.chronus;
  o.disk_bytes = env.disk;
  o.lim = env.cgroup_limits();
  o.keep_upper = extras.keep_upper;
  o.seed_pack = std::move(extras.seed_pack);
  o.seed_manifest = std::move(extras.seed_manifest);
  o.seed_blobs = std::move(extras.seed_blobs);
  o.resolv_conf = std::move(extras.resolv_conf);
  o.netns = extras.netns;
  return o;
}

expected<std::unique_ptr<container>> build_sandbox(spawner& sp, const environment& env,
                                                   std::span<const int> lowers,
                                                   build_extras extras,
                                                   const cgroup_source& cgroups,
                                                   build_until until) {
  const auto* policy = extras.host_mounts;
  auto o = container_options_for(env, std::move(extras));
  if (!env.mounts.empty()) {
    static const host_mount_policy none;
    auto m = (policy ? *policy : none).prepare(env.mounts, sp.userns_fd());
    if (!m)
      return std::move(m).error_value().in_step("host_mounts");
    o.host_mounts = std::move(*m);
  }
  const cgroup_root* cg = nullptr;
  if (o.lim.any()) {
    auto root = cgroups();
    if (!root)
      return std::move(root).error_value().in_step("make_cgroup");
    cg = *root;
  }
  return until == build_until::ready ? container::create(sp, lowers, o, cg)
                                     : container::start(sp, lowers, o, cg);
}

expected<std::vector<layer_lease>> lease_layers(const store& st, const environment& env,
                                                const char* slot_prefix) {
  std::vector<layer_lease> out;
  // A snapshot's chain of diffs down to its base (runtime/snapshot.hpp).
  DSEC_TRY(slots, resolve_layers(env, [&](const std::string& text) -> expected<layer_record> {
    DSEC_TRY(parsed, parse_layer_ref(text));
    DSEC_TRY(info, st.find(parsed));
    return layer_record{info.kind, info.on};
  }));
  for (const auto& sl : slots) {
    DSEC_TRY(ref, parse_layer_ref(sl.ref));
    DSEC_TRY(l, st.lease(ref));
    if (auto k = check_layer_kind(std::string{slot_prefix} + sl.slot, sl.ref, l.info().kind,
                                  sl.kind);
        !k)
      return std::move(k).error_value();
    out.push_back(std::move(l));
  }
  return out;
}

} // namespace dsec

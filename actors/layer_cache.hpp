// layer_cache: one per node. Mounts each layer (EROFS image) once, shares the
// mount between every sandbox using it, counts its users, and unmounts unused
// layers, least recently used first, when the mounted bytes exceed a budget.
//
// While a sandbox uses a layer the cache holds a lease on its ref in the store,
// so `dsec layer rm` refuses to remove it; once unused the lease is dropped but
// the mount stays cached until evicted.
#pragma once

#include <cstdint>

#include "actors/interfaces.hpp"

namespace dsec {

class engine;

/// Spawns the cache. `budget` is in bytes of mounted images; 0 means no limit.
/// Its requests to a layer source carry `key`, the member key
/// (actors/surface.hpp), and it takes only replies that carry it too.
layer_cache_actor spawn_layer_cache(caf::actor_system& sys, engine& eng, uint64_t budget,
                                    internal_key key);

} // namespace dsec

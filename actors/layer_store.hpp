// layer_store: one per node. Serves the layers of the node's store to peers
// that lack them (docs/cluster.md, layer distribution): `describe` gives a
// layer's metadata by NAME@VERSION, `fetch` a chunk of an image by digest.
// It only reads the store.
#pragma once

#include <cstdint>

#include "actors/interfaces.hpp"
#include "runtime/store.hpp"

namespace dsec {

/// The most bytes one fetch may ask for, and get: 1 MiB.
inline constexpr uint32_t max_fetch_chunk = 1u << 20;

/// Spawns the layer store over `st`. Errors: describe of a malformed ref is
/// invalid_argument, of an unknown one not_found (the store's message); fetch
/// of a malformed digest or a length of 0 or over max_fetch_chunk is
/// invalid_argument, of an unknown digest not_found. A fetch past the end of
/// the image replies empty.
/// Every request must carry `key`, the member key (actors/surface.hpp), and
/// every reply carries it.
layer_store_actor spawn_layer_store(caf::actor_system& sys, store st, internal_key key);

} // namespace dsec

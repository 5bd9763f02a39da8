// Snapshots (issue 16): diff layers and the environments they sit on.
//
// `dsec snapshot ID --as NAME@VERSION` (store::pack_diff) makes a sandbox's
// writable layer an EROFS layer of kind diff. Its ref records the layers of
// the environment it sits on ("on=base=B workdir=W tool=T1 tool=T2
// snapshot=S", format_on). A new sandbox of environment{snapshot = NAME@V,
// tools = extra} gets, topmost first: the extra tools, the diff, then the
// layers of the recorded environment, resolved the same way (its own
// snapshot, if any: diffs stack), down to a base (resolve_layers).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/environment.hpp"
#include "runtime/error.hpp"
#include "runtime/layer.hpp"

namespace dsec {

/// The layers of `env` as a diff's record: "base=B workdir=W tool=T... snapshot=S",
/// the fields that are set, tools in order.
std::string format_on(const environment& env);

/// A record back into an environment's layer fields (the rest left default).
/// invalid_argument on a malformed record.
expected<environment> parse_on(std::string_view record);

/// One layer of a sandbox's root, topmost first, as resolve_layers gives it.
struct resolved_layer {
  std::string ref;   ///< NAME@VERSION
  layer_kind kind;   ///< the kind it must be
  std::string slot;  ///< how errors name the slot: "tool", "snapshot", "snapshot a@1: base"
};

/// What a resolver knows of one layer: its kind and, for a diff, its record.
struct layer_record {
  layer_kind kind = layer_kind::base;
  std::string on;
};

/// The most diffs one chain stacks.
inline constexpr size_t max_diff_depth = 64;

/// The layers of `env`, topmost first: environment::layer_slots() without a
/// snapshot; with one, env.tools (the last on top), the diff, then the layers
/// of its record, resolved again. `find` looks a layer up (a store's
/// find()/lease()). invalid_argument for a chain deeper than max_diff_depth,
/// a snapshot with a base or workdir beside it, or a record without a base.
expected<std::vector<resolved_layer>>
resolve_layers(const environment& env,
               const std::function<expected<layer_record>(const std::string& ref)>& find);

} // namespace dsec

// Layer names and kinds: the value types every part of dsec uses to name a layer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/error.hpp"

namespace dsec {

/// The slot a layer fills in a sandbox's root. Lower slots are overlaid by higher
/// ones: tool layers over the workdir layer over the base layer.
enum class layer_kind : uint8_t {
  base,    ///< an operating system image (docker export, debootstrap, busybox)
  workdir, ///< a task's working tree
  tool,    ///< a tool package (a grader, a compiler, a test runner)
  /// A sandbox's writable layer (`dsec snapshot`): made only by pack_diff,
  /// never by `layer build`; it records the environment it sits on
  /// (layer_info::on, runtime/snapshot.hpp).
  diff,
};

const char* to_string(layer_kind k) noexcept;

/// Parses "base", "workdir", "tool" or "diff".
expected<layer_kind> parse_layer_kind(std::string_view s);

/// NAME@VERSION. Names and versions are 1..128 characters of [A-Za-z0-9._+-],
/// starting with a letter or digit. Versions are immutable once built.
struct layer_ref {
  std::string name;
  std::string version;

  [[nodiscard]] std::string to_string() const { return name + '@' + version; }
  friend bool operator==(const layer_ref&, const layer_ref&) = default;
};

/// Parses NAME@VERSION; the error says which part is malformed and why.
expected<layer_ref> parse_layer_ref(std::string_view s);

} // namespace dsec

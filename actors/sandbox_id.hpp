// Sandbox ids that name their node (docs/cluster.md, "Sandbox ids"): 12 lower
// hex digits, the first 4 the node's tag (a hash of its name, its host:port),
// the other 8 random. A coordinator's by-id verbs ask only the nodes whose tag
// an id starts with (one, unless two names hash alike), and the others only if
// none of those has it (a sandbox rebuilt by a resumed session keeps the id it
// was first given, on whichever node it is rebuilt).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/container.hpp"

namespace dsec {

/// The 4 hex digits that start the ids of node `name`'s sandboxes.
inline std::string node_tag(std::string_view name) {
  uint32_t h = 2166136261u; // FNV-1a
  for (unsigned char c : name)
    h = (h ^ c) * 16777619u;
  h ^= h >> 16;
  static const char hex[] = "0123456789abcdef";
  std::string out(4, '0');
  for (size_t i = 0; i < 4; ++i)
    out[i] = hex[(h >> (12 - 4 * i)) & 15];
  return out;
}

/// A new sandbox id for node `name` (its tag, then 8 random hex digits).
inline std::string sandbox_id_on(std::string_view name) {
  auto id = new_sandbox_id();
  id.replace(0, 4, node_tag(name));
  return id;
}

/// Whether `s` has a sandbox id's form (12 lower hex digits): what the CLI
/// takes for an id rather than a name, and why a name of that form is refused.
inline bool is_sandbox_id(std::string_view s) {
  return s.size() == 12 && s.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

/// Whether `id` names node `name` (it may still live elsewhere: see above).
inline bool names_node(std::string_view id, std::string_view name) {
  return id.size() == 12 && id.substr(0, 4) == node_tag(name);
}

} // namespace dsec

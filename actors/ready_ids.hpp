// ready_ids: several sandboxes of one create request that became ready, told
// to a listener in another process in one message, (ready_atom, ready_ids),
// instead of one (ready_atom, id) each: a session coalesces what became ready
// while it worked through its mailbox. Listeners in the session's own process
// still get one message per sandbox, unless their create came with labels
// (create_labels): then every ready sandbox is told as a ready_ids with its key.
#pragma once

#include <caf/meta/type_name.hpp>

#include <string>
#include <vector>

namespace dsec {

struct ready_ids {
  std::vector<std::string> ids;
  /// Their keys (create_labels), one per id, for a create that came with
  /// labels; empty otherwise.
  std::vector<std::string> keys;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ready_ids& x) {
  return f(caf::meta::type_name("dsec.ready_ids"), x.ids, x.keys);
}

} // namespace dsec

// ready_ids: several sandboxes of one create request that became ready, told
// to a listener in another process in one message, (ready_atom, ready_ids),
// instead of one (ready_atom, id) each: a session coalesces what became ready
// while it worked through its mailbox. Listeners in the session's own process
// still get one message per sandbox.
#pragma once

#include <caf/meta/type_name.hpp>

#include <string>
#include <vector>

namespace dsec {

struct ready_ids {
  std::vector<std::string> ids;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ready_ids& x) {
  return f(caf::meta::type_name("dsec.ready_ids"), x.ids);
}

} // namespace dsec

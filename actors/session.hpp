// session: one per training run. It owns its sandboxes' ids, enforces its
// quota, gives sandboxes its default TTL, creates in batches (each sandbox is
// announced as soon as it is ready: a batch never waits for its slowest), and
// destroys all of them when it is closed or when its trainer disappears (it
// monitors the trainer's actor).
#pragma once

#include <string>

#include "actors/interfaces.hpp"

namespace dsec {

struct session_config {
  std::string id;
  session_options options;
  caf::actor trainer;          ///< monitored; null for the daemon's own session
  scheduler_actor scheduler;
};

session_actor spawn_session(caf::actor_system& sys, session_config cfg);

} // namespace dsec

// scheduler: the entry of a dsecd, published with CAF's middleman. Trainers
// open sessions here; sessions ask it to place sandboxes. On one node it admits
// everything to that node (the cluster will choose among nodes); by sandbox id
// it serves the command line, which has no session. It keeps one session of
// its own, "default", for sandboxes nobody owns (`dsec run --detach`).
#pragma once

#include <chrono>

#include <string>

#include "actors/interfaces.hpp"

namespace dsec {

struct scheduler_config {
  node_actor node;
  std::string name = "embedded";
  /// Where sessions keep trajectory logs (<state dir>/trajectories); empty: none.
  std::string trajectories;
  /// A log no session wrote to for this long is removed (checked at start and
  /// hourly); 0: never.
  std::chrono::milliseconds trajectory_keep{0};
};

scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_config cfg);

} // namespace dsec

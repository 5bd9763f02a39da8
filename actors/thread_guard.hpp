// caller_thread_guard: what CAF leaves on a thread that is not CAF's after a
// spawn, undone.
//
// CAF 0.17's spawn (so scoped_actor too) pins the actor system's logger in a
// thread-local strong reference of the calling thread, and ~actor_system waits
// until the logger is destroyed. A thread of the caller's (a trainer's worker,
// a Python thread, attach's signal thread) that made one call and outlived the
// actor system kept ~actor_system waiting forever. Every spawn dsec makes on a
// caller's thread sits inside one of these: on a thread that held no logger
// before (not one of CAF's, nor the one that made the actor system), it drops
// the reference again.
#pragma once

#include <caf/logger.hpp>

namespace dsec {

class caller_thread_guard {
public:
  caller_thread_guard() noexcept : foreign_(caf::logger::current_logger() == nullptr) {}
  ~caller_thread_guard() {
    if (foreign_)
      caf::logger::set_current_actor_system(nullptr);
  }
  caller_thread_guard(const caller_thread_guard&) = delete;
  caller_thread_guard& operator=(const caller_thread_guard&) = delete;

private:
  bool foreign_;
};

} // namespace dsec

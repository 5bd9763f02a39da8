// reactor: one thread that waits on many descriptors with io_uring and runs a
// callback when one is ready. dsecd uses it for what must not block an actor
// thread: sandbox control sockets, pidfds and command output pipes.
//
// Watches are one-shot: a callback runs once, on the reactor thread, and may
// re-arm its watch by calling watch() again. Callbacks must be short (read a
// message, post it to an actor); they must not block.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/error.hpp"
#include "runtime/fd.hpp"

struct io_uring;

namespace dsec {

class reactor {
public:
  /// The result of a watch: the poll(2) revents, or -errno (e.g. -ECANCELED).
  using callback = std::function<void(int result)>;

  /// Starts the reactor thread with a ring of `entries` submission slots.
  static expected<std::unique_ptr<reactor>> start(unsigned entries = 1024);

  /// Calls `cb` once `fd` has one of `events` (POLLIN, POLLOUT, ...). Returns a
  /// token for cancel(). Thread-safe. The fd must stay open until the callback
  /// ran (or was cancelled).
  uint64_t watch(int fd, uint32_t events, callback cb);

  /// Cancels a watch; its callback then runs with -ECANCELED unless it already
  /// ran. Thread-safe.
  void cancel(uint64_t token);

  /// Runs `fn` on the reactor thread. Thread-safe.
  void post(std::function<void()> fn);

  /// Number of watches armed (for stats and tests).
  [[nodiscard]] size_t armed() const;

  /// Stops the thread; pending callbacks run with -ECANCELED first.
  ~reactor();

  reactor(const reactor&) = delete;
  reactor& operator=(const reactor&) = delete;

private:
  reactor() = default;
  void run();
  void drain_requests();

  struct request {
    enum { watch, cancel, post, stop } kind;
    uint64_t token;
    int fd;
    uint32_t events;
    callback cb;
    std::function<void()> fn;
  };

  std::unique_ptr<io_uring> ring_;
  unique_fd wake_; // eventfd: tells the thread there are requests
  mutable std::mutex mu_;
  std::vector<request> requests_;  // guarded by mu_
  std::vector<request> draining_;  // reactor thread only
  uint64_t next_token_ = 1;        // guarded by mu_
  std::unordered_map<uint64_t, callback> armed_; // reactor thread only
  size_t armed_count_ = 0;         // guarded by mu_ (a copy for armed())
  uint64_t wake_buf_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

} // namespace dsec

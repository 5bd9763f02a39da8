#include "runtime/reactor.hpp"

#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dsec {

namespace {

// user_data values below this are the reactor's own; tokens start above.
constexpr uint64_t wake_tag = 1;
constexpr uint64_t ignore_tag = 2;
constexpr uint64_t first_token = 16;

io_uring_sqe* get_sqe(io_uring* ring) {
  auto* sqe = io_uring_get_sqe(ring);
  while (!sqe) {
    io_uring_submit(ring);
    sqe = io_uring_get_sqe(ring);
  }
  return sqe;
}

} // namespace

expected<std::unique_ptr<reactor>> reactor::start(unsigned entries) {
  std::unique_ptr<reactor> r{new reactor};
  r->ring_ = std::make_unique<io_uring>();
  if (int rc = io_uring_queue_init(entries, r->ring_.get(), 0); rc < 0) {
    r->ring_.reset();
    return sys_error("io_uring_queue_init", "", -rc);
  }
  r->wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!r->wake_) {
    io_uring_queue_exit(r->ring_.get());
    r->ring_.reset();
    return sys_error("eventfd for the reactor");
  }
  r->next_token_ = first_token;
  r->thread_ = std::thread{[p = r.get()] { p->run(); }};
  return r;
}

uint64_t reactor::watch(int fd, uint32_t events, callback cb) {
  std::lock_guard<std::mutex> guard{mu_};
  uint64_t token = next_token_++;
  bool was_empty = requests_.empty();
  requests_.push_back({request::watch, token, fd, events, std::move(cb), {}});
  ++armed_count_;
  if (was_empty) {
    uint64_t one = 1;
    (void) !::write(wake_.get(), &one, sizeof one);
  }
  return token;
}

void reactor::cancel(uint64_t token) {
  std::lock_guard<std::mutex> guard{mu_};
  bool was_empty = requests_.empty();
  requests_.push_back({request::cancel, token, -1, 0, {}, {}});
  if (was_empty) {
    uint64_t one = 1;
    (void) !::write(wake_.get(), &one, sizeof one);
  }
}

void reactor::post(std::function<void()> fn) {
  std::lock_guard<std::mutex> guard{mu_};
  bool was_empty = requests_.empty();
  requests_.push_back({request::post, 0, -1, 0, {}, std::move(fn)});
  if (was_empty) {
    uint64_t one = 1;
    (void) !::write(wake_.get(), &one, sizeof one);
  }
}

size_t reactor::armed() const {
  std::lock_guard<std::mutex> guard{mu_};
  return armed_count_;
}

void reactor::drain_requests() {
  {
    std::lock_guard<std::mutex> guard{mu_};
    draining_.swap(requests_);
  }
  for (auto& rq : draining_) {
    switch (rq.kind) {
      case request::watch: {
        auto* sqe = get_sqe(ring_.get());
        io_uring_prep_poll_add(sqe, rq.fd, rq.events);
        io_uring_sqe_set_data64(sqe, rq.token);
        armed_.emplace(rq.token, std::move(rq.cb));
        break;
      }
      case request::cancel: {
        if (armed_.count(rq.token) == 0)
          break; // already ran
        auto* sqe = get_sqe(ring_.get());
        io_uring_prep_poll_remove(sqe, rq.token);
        io_uring_sqe_set_data64(sqe, ignore_tag);
        break;
      }
      case request::post:
        rq.fn();
        break;
      case request::stop:
        stopping_ = true;
        break;
    }
  }
  draining_.clear();
}

void reactor::run() {
  auto arm_wake = [this] {
    auto* sqe = get_sqe(ring_.get());
    io_uring_prep_read(sqe, wake_.get(), &wake_buf_, sizeof wake_buf_, 0);
    io_uring_sqe_set_data64(sqe, wake_tag);
  };
  arm_wake();
  while (!stopping_) {
    int rc = io_uring_submit_and_wait(ring_.get(), 1);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
      break; // the ring is unusable; the destructor still cleans up
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(ring_.get(), head, cqe) {
      ++seen;
      uint64_t tag = io_uring_cqe_get_data64(cqe);
      int res = cqe->res;
      if (tag == wake_tag) {
        drain_requests();
        if (!stopping_)
          arm_wake();
        continue;
      }
      if (tag < first_token)
        continue;
      auto it = armed_.find(tag);
      if (it == armed_.end())
        continue;
      auto cb = std::move(it->second);
      armed_.erase(it);
      {
        std::lock_guard<std::mutex> guard{mu_};
        --armed_count_;
      }
      cb(res);
    }
    io_uring_cq_advance(ring_.get(), seen);
  }
  // Stopping: everything still armed learns that it will never run.
  for (auto& [token, cb] : armed_)
    cb(-ECANCELED);
  armed_.clear();
}

reactor::~reactor() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> guard{mu_};
      requests_.push_back({request::stop, 0, -1, 0, {}, {}});
      uint64_t one = 1;
      (void) !::write(wake_.get(), &one, sizeof one);
    }
    thread_.join();
  }
  if (ring_)
    io_uring_queue_exit(ring_.get());
}

} // namespace dsec

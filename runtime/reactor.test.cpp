#include "runtime/reactor.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <doctest/doctest.h>

using namespace dsec;

namespace {

// Waits (without a wall-clock assertion: a generous cap only stops a hung test)
// until `pred` holds.
template <class Pred>
bool eventually(Pred pred) {
  for (int i = 0; i < 10'000; ++i) {
    if (pred())
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

} // namespace

TEST_CASE("a watch fires once when its descriptor becomes readable") {
  auto r = reactor::start();
  REQUIRE(r);
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  std::atomic<int> fired{0}, revents{0};
  (*r)->watch(sv[0], POLLIN, [&](int res) {
    revents = res;
    ++fired;
  });
  CHECK(eventually([&] { return (*r)->armed() == 1; }));
  CHECK(fired == 0);
  REQUIRE(::write(sv[1], "x", 1) == 1);
  REQUIRE(eventually([&] { return fired == 1; }));
  CHECK((revents & POLLIN) != 0);
  CHECK((*r)->armed() == 0);
  ::close(sv[0]);
  ::close(sv[1]);
}

TEST_CASE("a callback can re-arm its watch and cancel runs with ECANCELED") {
  auto r = reactor::start();
  REQUIRE(r);
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  std::atomic<int> reads{0};
  std::function<void(int)> on_ready = [&](int res) {
    if (res < 0)
      return;
    char c;
    if (::read(sv[0], &c, 1) == 1 && ++reads < 3)
      (*r)->watch(sv[0], POLLIN, on_ready);
  };
  (*r)->watch(sv[0], POLLIN, on_ready);
  for (int i = 0; i < 3; ++i)
    REQUIRE(::write(sv[1], "x", 1) == 1);
  CHECK(eventually([&] { return reads == 3; }));
  std::atomic<int> result{1};
  auto token = (*r)->watch(sv[0], POLLIN, [&](int res) { result = res; });
  (*r)->cancel(token);
  CHECK(eventually([&] { return result.load() == -ECANCELED; }));
  ::close(sv[0]);
  ::close(sv[1]);
}

TEST_CASE("post runs on the reactor thread; stopping cancels what is armed") {
  std::atomic<int> result{1};
  std::thread::id reactor_thread;
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  {
    auto r = reactor::start();
    REQUIRE(r);
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    (*r)->post([&] {
      std::lock_guard<std::mutex> g{mu};
      reactor_thread = std::this_thread::get_id();
      done = true;
      cv.notify_one();
    });
    std::unique_lock<std::mutex> lk{mu};
    cv.wait(lk, [&] { return done; });
    CHECK(reactor_thread != std::this_thread::get_id());
    (*r)->watch(sv[0], POLLIN, [&](int res) { result = res; });
  }
  CHECK(result.load() == -ECANCELED);
  ::close(sv[0]);
  ::close(sv[1]);
}

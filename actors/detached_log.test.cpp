// The log of a sandbox's detached commands (actors/detached_log.hpp): positions,
// bounds, filters and records, without a sandbox.
#include <doctest/doctest.h>

#include <string>

#include "actors/detached_log.hpp"

using dsec::detached_log;
using dsec::logs_reply;
using dsec::logs_request;

namespace {

std::string text_of(const logs_reply& r, uint8_t stream = 0) {
  std::string out;
  for (const auto& p : r.pieces)
    if (stream == 0 || p.stream == stream)
      out += p.data;
  return out;
}

logs_request from(uint64_t since, uint64_t exec = 0, uint64_t max_bytes = 0) {
  logs_request q;
  q.since = since;
  q.exec = exec;
  q.max_bytes = max_bytes;
  return q;
}

} // namespace

TEST_CASE("detached_log: output in order, read from a position, by command, in pieces") {
  detached_log log;
  log.begin(1, {"sh", "-c", "echo a"}, 1000);
  log.begin(2, {"other"}, 1001);
  log.append(1, 1, "hello ");
  log.append(1, 2, "oops\n");
  log.append(2, 1, "two\n");
  log.append(1, 1, "world\n");
  auto r = log.read(from(0));
  CHECK(text_of(r) == "hello oops\ntwo\nworld\n");
  CHECK(text_of(r, 1) == "hello two\nworld\n");
  CHECK(text_of(r, 2) == "oops\n");
  CHECK(r.next == 21);
  CHECK(r.dropped == 0);
  CHECK(r.live);
  REQUIRE(r.commands.size() == 2);
  CHECK(r.commands[0].command == "sh -c echo a");
  CHECK(r.commands[0].started_ms == 1000);
  // From a position inside a piece; nothing after the end.
  CHECK(text_of(log.read(from(3))) == "lo oops\ntwo\nworld\n");
  r = log.read(from(21));
  CHECK(r.pieces.empty());
  CHECK(r.next == 21);
  CHECK(log.read(from(500)).next == 21); // a position past the end is the end
  // One command's: the others' bytes are passed over, and `next` moves on.
  r = log.read(from(0, 2));
  CHECK(text_of(r) == "two\n");
  REQUIRE(r.commands.size() == 1);
  CHECK(r.commands[0].exec == 2);
  // At most max_bytes at a time, and `next` lets the reader go on.
  r = log.read(from(0, 0, 4));
  CHECK(text_of(r) == "hell");
  CHECK(r.next == 4);
  r = log.read(from(r.next, 0, 8));
  CHECK(text_of(r) == "o oops\nt");
  CHECK(r.next == 12);
}

TEST_CASE("detached_log: bounded, oldest first, pieces charged so tiny writes cannot pile up") {
  detached_log log{1000};
  log.begin(1, {"a"}, 0);
  log.begin(2, {"b"}, 0);
  for (int i = 0; i < 600; ++i)
    log.append(i % 2 ? 1 : 2, 1, std::string(1, static_cast<char>('0' + i % 10)));
  CHECK(log.charged() <= 1000);
  CHECK(log.held() < 20); // 1 byte + 64 of overhead each: few are kept
  auto r = log.read(from(0));
  CHECK(r.dropped == 600 - log.held());
  CHECK(r.next == 600);
  CHECK(text_of(r).size() == log.held());
  CHECK(text_of(r).back() == '9');
  // One command's consecutive output joins into pieces: 900 bytes stay.
  detached_log big{2000};
  big.begin(1, {"x"}, 0);
  for (int i = 0; i < 900; ++i)
    big.append(1, 1, "y");
  CHECK(big.held() == 900);
  CHECK(big.read(from(0)).dropped == 0);
  // The oldest bytes go, to the byte (here from the front of a joined piece).
  big.append(1, 1, std::string(1500, 'z'));
  CHECK(big.charged() == 2000);
  auto b = big.read(from(0));
  CHECK(b.dropped == 2400 + 64 - 2000);
  CHECK(text_of(b) == (std::string(900, 'y') + std::string(1500, 'z')).substr(464));
  CHECK(text_of(big.read(from(1000))) == (std::string(900, 'y') + std::string(1500, 'z')).substr(1000));
}

TEST_CASE("detached_log: records, live until exited and closed, the first kept") {
  detached_log log;
  log.begin(7, {"sleep", "1"}, 10);
  CHECK(log.first() == 7);
  CHECK(log.owns(7));
  CHECK_FALSE(log.owns(8));
  logs_request any;
  logs_request ends_only;
  ends_only.output = false;
  CHECK(log.live(any));
  log.exited(7, 137, 9, true, 20);
  CHECK(log.live(any));            // its pipes are still open (a background child)
  CHECK_FALSE(log.live(ends_only)); // but it exited
  CHECK(log.has_news(ends_only));
  CHECK_FALSE(log.has_news(any));
  log.closed(7, 1);
  log.closed(7, 2);
  CHECK_FALSE(log.live(any));
  auto r = log.read(ends_only);
  REQUIRE(r.commands.size() == 1);
  CHECK_FALSE(r.commands[0].running);
  CHECK_FALSE(r.commands[0].open);
  CHECK(r.commands[0].exit_code == 137);
  CHECK(r.commands[0].signal == 9);
  CHECK(r.commands[0].timed_out);
  CHECK(r.commands[0].ended_ms == 20);
  // Many more: the first stays, the latest are kept, ended ones go first.
  for (uint64_t e = 100; e < 200; ++e) {
    log.begin(e, {"true"}, 0);
    if (e != 150) {
      log.exited(e, 0, 0, false, 0);
      log.closed(e, 1);
      log.closed(e, 2);
    }
  }
  r = log.read(ends_only);
  CHECK(r.commands.size() == detached_log::max_records);
  CHECK(r.commands.front().exec == 7);
  CHECK(log.owns(150)); // live: kept however old
  CHECK(log.owns(199));
  CHECK_FALSE(log.owns(100));
  // A command that never started is forgotten.
  log.forget(199);
  CHECK_FALSE(log.owns(199));
  // A long command line is cut.
  log.begin(300, {std::string(1000, 'q')}, 0);
  auto one = log.read(from(0, 300));
  REQUIRE(one.commands.size() == 1);
  CHECK(one.commands[0].command.size() == 256);
}

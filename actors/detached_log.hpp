// What a sandbox keeps of its detached commands (exec_request.detach; issue
// 23; docs/actors.md, "Logs"): their output, interleaved in the order the
// sandbox read it, bounded to the latest detached_log_bytes, and a record of
// each command (its first one and the 63 latest). Plain data, no actor: the
// sandbox actor owns one, feeds it from its pipe readers and answers the logs
// verb from it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "actors/messages.hpp"

namespace dsec {

class detached_log {
public:
  /// Each piece costs its bytes and `piece_overhead` against `cap`, so that
  /// a command writing a byte at a time cannot make the log hold millions of
  /// pieces.
  static constexpr uint64_t piece_overhead = 64;
  /// Records kept: the first command's and the latest ones (live ones always).
  static constexpr size_t max_records = 64;

  explicit detached_log(uint64_t cap = detached_log_bytes) : cap_(cap) {}

  /// Detached command `exec` began (argv: its command line).
  void begin(uint64_t exec, const std::vector<std::string>& argv, uint64_t now_ms);
  /// It did not start after all (the caller heard why): forgotten.
  void forget(uint64_t exec);
  /// Whether `exec` is a detached command the log has a record of.
  [[nodiscard]] bool owns(uint64_t exec) const;
  /// Output of `exec` on `stream` (1 stdout, 2 stderr); the oldest pieces go
  /// once the log holds more than its bound.
  void append(uint64_t exec, uint8_t stream, std::string_view data);
  /// Its `stream` reached its end (every writer closed it).
  void closed(uint64_t exec, uint8_t stream);
  void exited(uint64_t exec, int32_t exit_code, int32_t signal, bool timed_out,
              uint64_t now_ms);
  /// Whether a command `q` asks about is live (logs_request.wait).
  [[nodiscard]] bool live(const logs_request& q) const;
  /// What the log holds for `q` (its `wait` is the caller's business).
  [[nodiscard]] logs_reply read(const logs_request& q) const;
  /// Whether a waiting `q` has something to be told: output after its
  /// position, or none of its commands live any more.
  [[nodiscard]] bool has_news(const logs_request& q) const;
  /// The first command's id, 0 if there was none.
  [[nodiscard]] uint64_t first() const { return first_; }
  /// Bytes of output held, and what they cost against the bound.
  [[nodiscard]] uint64_t held() const { return held_; }
  [[nodiscard]] uint64_t charged() const { return charged_; }

private:
  struct piece_at {
    uint64_t pos; // the position of its first byte
    log_piece p;
  };
  struct record {
    detached_command c;
    bool out_open = true, err_open = true;
  };
  record* find(uint64_t exec);
  [[nodiscard]] const record* find(uint64_t exec) const;
  [[nodiscard]] bool live(const record& r, bool output) const;

  uint64_t cap_;
  std::deque<piece_at> pieces_;
  uint64_t end_ = 0;     // the position after the last byte taken
  uint64_t held_ = 0;    // bytes in pieces_
  uint64_t charged_ = 0; // held_ + piece_overhead a piece
  std::vector<record> records_; // oldest first, at most max_records (+ live ones)
  uint64_t first_ = 0;
};

} // namespace dsec

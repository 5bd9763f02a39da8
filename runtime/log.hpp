// log: the daemon's log lines (docs/observability.md, "Logs"). Each line has a
// time, a level, the component, what happened and the ids involved (sandbox,
// session, node, ...), as text or as one JSON object a line
// (`dsecd --log-format text|json`), so an operator can follow one sandbox or
// one session through a node's log with grep or jq.
//
// No caller ever waits on the log's file descriptor: lines go into a bounded
// queue that a thread of the log's own writes out. When the queue is full (a
// reader of stderr that stopped reading, a terminal scrolled back), lines are
// dropped and counted, and the next line written says how many were lost.
//
// Refusals (an unknown layer, a quota, an OOM kill, a refused peer) are logged
// through `refusal`: the first of each cause at once, then at most one line per
// cause every 10 s, which counts the ones not logged meanwhile.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace dsec::log {

enum class level : uint8_t { debug, info, warn, error };
enum class format : uint8_t { text, json };

/// "debug", "info", "warn", "error"; nullopt-like false for another word.
bool parse_level(std::string_view text, level& out);
bool parse_format(std::string_view text, format& out);
std::string_view to_string(level l);

/// One id or value of a line: `sandbox=ID`, `"sandbox":"ID"`.
struct field {
  std::string_view key;
  std::string value;
};

struct options {
  format fmt = format::text;
  level min = level::info;
  int fd = 2;                          ///< where lines go (not owned)
  size_t max_queued_bytes = 4u << 20;  ///< beyond: dropped, counted
  int64_t refusal_interval_ms = 10'000; ///< one line per refusal cause this often
};

/// Starts the log's writer with `o` (replacing an earlier configuration; the
/// lines queued until then are written first). Without a call, lines at warn
/// and above go to stderr as text, written by the caller (a tool that embeds a
/// daemon and never configures one still sees its errors).
void configure(const options& o);

/// Writes what is queued and stops the writer (at exit; configure starts it
/// again).
void flush_and_stop();

/// True when a line of level `l` would be written (to skip building fields).
bool enabled(level l);

/// One line.
void write(level l, std::string_view component, std::string_view message,
           std::initializer_list<field> fields = {});

/// A refusal of `cause` (a short, fixed key such as "unknown_layer" or
/// "quota"): written at warn the first time, then at most once per 10 s per
/// cause, with `suppressed=N` for those not written meanwhile.
void refusal(std::string_view component, std::string_view cause, std::string_view message,
             std::initializer_list<field> fields = {});

/// Lines dropped because the queue was full, since the start.
uint64_t dropped();

/// The line `write` would produce (no newline), for tests.
std::string format_line(format fmt, int64_t unix_ms, level l, std::string_view component,
                        std::string_view message, std::initializer_list<field> fields);

} // namespace dsec::log

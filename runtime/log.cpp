// log (see log.hpp): lines formatted by the caller, queued, and written by a
// thread of the log's own.
#include "runtime/log.hpp"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/io.hpp"
#include "runtime/json.hpp"

namespace dsec::log {

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

void append_time(std::string& out, int64_t unix_ms) {
  time_t secs = static_cast<time_t>(unix_ms / 1000);
  struct tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[40];
  auto n = std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                         tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                         static_cast<int>(unix_ms % 1000));
  out.append(buf, static_cast<size_t>(n));
}

// A text value as it is when it is one plain word, else JSON-quoted (so that
// spaces, quotes and newlines in it cannot forge another field or line).
void append_text_value(std::string& out, std::string_view v) {
  bool plain = !v.empty();
  for (unsigned char c : v)
    if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c >= 0x7f) {
      plain = false;
      break;
    }
  if (plain)
    out.append(v);
  else
    json_string(out, v);
}

// Lines that cannot be written (nowhere to write to) are lost, nothing else.
void write_fully(int fd, const std::string& data) { (void) write_all(fd, data, "the log"); }

struct cause_state {
  int64_t last_ms = 0;
  uint64_t suppressed = 0;
};

struct sink {
  std::mutex mu;
  std::condition_variable cv;
  options opts;
  bool configured = false;
  bool stopping = false;
  std::deque<std::string> queue;
  size_t queued_bytes = 0;
  uint64_t dropped_unreported = 0;
  std::thread writer;
  std::map<std::string, cause_state, std::less<>> causes;
  std::atomic<uint8_t> min{static_cast<uint8_t>(level::warn)};
  std::atomic<uint64_t> dropped{0};
  std::atomic<uint8_t> fmt{static_cast<uint8_t>(format::text)};

  // At exit (a main that returns without flush_and_stop): what is queued is
  // written, and the thread joined rather than left to std::terminate.
  ~sink() {
    {
      std::lock_guard lk{mu};
      if (!writer.joinable())
        return;
      stopping = true;
    }
    cv.notify_all();
    writer.join();
  }

  void run() {
    std::unique_lock lk{mu};
    std::string batch;
    while (true) {
      cv.wait(lk, [&] { return stopping || !queue.empty(); });
      if (queue.empty() && stopping)
        return;
      batch.clear();
      if (dropped_unreported > 0) {
        std::initializer_list<field> f = {{"dropped", std::to_string(dropped_unreported)}};
        batch = format_line(opts.fmt, now_ms(), level::warn, "log",
                            "lines were dropped: the log's reader was too slow", f);
        batch += '\n';
        dropped_unreported = 0;
      }
      while (!queue.empty()) {
        batch += queue.front();
        queued_bytes -= queue.front().size();
        queue.pop_front();
      }
      int fd = opts.fd;
      lk.unlock();
      write_fully(fd, batch);
      lk.lock();
    }
  }
};

sink& the_sink() {
  static sink s;
  return s;
}

} // namespace

bool parse_level(std::string_view t, level& out) {
  if (t == "debug")
    out = level::debug;
  else if (t == "info")
    out = level::info;
  else if (t == "warn")
    out = level::warn;
  else if (t == "error")
    out = level::error;
  else
    return false;
  return true;
}

bool parse_format(std::string_view t, format& out) {
  if (t == "text")
    out = format::text;
  else if (t == "json")
    out = format::json;
  else
    return false;
  return true;
}

std::string_view to_string(level l) {
  switch (l) {
    case level::debug:
      return "debug";
    case level::info:
      return "info";
    case level::warn:
      return "warn";
    case level::error:
      return "error";
  }
  return "info";
}

namespace {

std::string format_span(format fmt, int64_t unix_ms, level l, std::string_view component,
                        std::string_view message, const field* b, const field* e) {
  std::string out;
  out.reserve(96 + message.size());
  if (fmt == format::json) {
    out += "{\"time\":\"";
    append_time(out, unix_ms);
    out += "\",\"level\":\"";
    out += to_string(l);
    out += "\",\"component\":";
    json_string(out, component);
    out += ",\"msg\":";
    json_string(out, message);
    for (const field* f = b; f != e; ++f) {
      out += ',';
      json_string(out, f->key);
      out += ':';
      json_string(out, f->value);
    }
    out += '}';
    return out;
  }
  append_time(out, unix_ms);
  out += ' ';
  out += to_string(l);
  out += ' ';
  out += component;
  out += ": ";
  for (char c : message) // one line, whatever the message holds
    out += c == '\n' || c == '\r' ? ' ' : c;
  for (const field* f = b; f != e; ++f) {
    out += ' ';
    out += f->key;
    out += '=';
    append_text_value(out, f->value);
  }
  return out;
}

} // namespace

std::string format_line(format fmt, int64_t unix_ms, level l, std::string_view component,
                        std::string_view message, std::initializer_list<field> fields) {
  return format_span(fmt, unix_ms, l, component, message, fields.begin(), fields.end());
}

void configure(const options& o) {
  auto& s = the_sink();
  flush_and_stop();
  std::lock_guard lk{s.mu};
  s.opts = o;
  s.causes.clear();
  s.dropped_unreported = 0;
  s.configured = true;
  s.stopping = false;
  s.min.store(static_cast<uint8_t>(o.min));
  s.fmt.store(static_cast<uint8_t>(o.fmt));
  s.writer = std::thread([&s] { s.run(); });
}

void flush_and_stop() {
  auto& s = the_sink();
  std::thread t;
  {
    std::lock_guard lk{s.mu};
    if (!s.writer.joinable())
      return;
    s.stopping = true;
    t = std::move(s.writer);
  }
  s.cv.notify_all();
  t.join();
  std::lock_guard lk{s.mu};
  s.configured = false;
  s.min.store(static_cast<uint8_t>(level::warn));
}

bool enabled(level l) {
  return static_cast<uint8_t>(l) >= the_sink().min.load(std::memory_order_relaxed);
}

namespace {

void write_span(level l, std::string_view component, std::string_view message, const field* b,
                const field* e) {
  auto& s = the_sink();
  auto line = format_span(static_cast<format>(s.fmt.load(std::memory_order_relaxed)), now_ms(), l,
                          component, message, b, e);
  line += '\n';
  std::unique_lock lk{s.mu};
  if (!s.configured) {
    lk.unlock();
    write_fully(2, line);
    return;
  }
  if (s.queued_bytes + line.size() > s.opts.max_queued_bytes) {
    ++s.dropped_unreported;
    s.dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  s.queued_bytes += line.size();
  s.queue.push_back(std::move(line));
  lk.unlock();
  s.cv.notify_one();
}

} // namespace

void write(level l, std::string_view component, std::string_view message,
           std::initializer_list<field> fields) {
  if (enabled(l))
    write_span(l, component, message, fields.begin(), fields.end());
}

void refusal(std::string_view component, std::string_view cause, std::string_view message,
             std::initializer_list<field> fields) {
  if (!enabled(level::warn))
    return;
  auto& s = the_sink();
  uint64_t suppressed = 0;
  {
    std::lock_guard lk{s.mu};
    auto key = std::string{component} + '/' + std::string{cause};
    auto it = s.causes.find(key);
    auto now = now_ms();
    if (it == s.causes.end()) {
      if (s.causes.size() >= 4096) // causes are fixed words; a bound all the same
        s.causes.clear();
      s.causes.emplace(std::move(key), cause_state{now, 0});
    } else if (now - it->second.last_ms < s.opts.refusal_interval_ms) {
      ++it->second.suppressed;
      return;
    } else {
      suppressed = it->second.suppressed;
      it->second = cause_state{now, 0};
    }
  }
  // The fields, then cause= and suppressed=.
  std::vector<field> all(fields.begin(), fields.end());
  all.push_back(field{"cause", std::string{cause}});
  if (suppressed > 0)
    all.push_back(field{"suppressed", std::to_string(suppressed)});
  write_span(level::warn, component, message, all.data(), all.data() + all.size());
}

uint64_t dropped() { return the_sink().dropped.load(std::memory_order_relaxed); }

} // namespace dsec::log

#include "runtime/log.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

using namespace dsec;

namespace {

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    auto nl = text.find('\n', pos);
    out.push_back(text.substr(pos, nl - pos));
    pos = nl == std::string::npos ? text.size() : nl + 1;
  }
  return out;
}

// The log configured onto a pipe whose other end a thread reads to the end.
struct captured {
  int fds[2]{-1, -1};
  std::string text;
  std::thread reader;

  explicit captured(log::options o, bool read_now = true) {
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    o.fd = fds[1];
    log::configure(o);
    if (read_now)
      start();
  }
  void start() {
    reader = std::thread([this] {
      char buf[65536];
      ssize_t n;
      while ((n = ::read(fds[0], buf, sizeof buf)) > 0)
        text.append(buf, static_cast<size_t>(n));
    });
  }
  // Everything written, the pipe closed, the reader done.
  std::vector<std::string> finish() {
    log::flush_and_stop();
    ::close(fds[1]);
    reader.join();
    ::close(fds[0]);
    return lines(text);
  }
};

} // namespace

TEST_CASE("a text line: time, level, component, message, then key=value; odd values quoted") {
  auto line = log::format_line(log::format::text, 1764662400123, log::level::warn, "sandbox",
                               "creation failed\nsecond line",
                               {{"sandbox", "n1-abc"}, {"error", "no such layer \"x@1\""},
                                {"empty", ""}});
  CHECK(line == "2025-12-02T08:00:00.123Z warn sandbox: creation failed second line "
                "sandbox=n1-abc error=\"no such layer \\\"x@1\\\"\" empty=\"\"");
}

TEST_CASE("a JSON line is one object with the fields as strings") {
  auto line = log::format_line(log::format::json, 1764662400123, log::level::info, "session",
                               "opened \"x\"\n", {{"session", "s-1"}, {"quota", "8"}});
  CHECK(line.find('\n') == std::string::npos);
  auto j = nlohmann::json::parse(line);
  CHECK(j["time"] == "2025-12-02T08:00:00.123Z");
  CHECK(j["level"] == "info");
  CHECK(j["component"] == "session");
  CHECK(j["msg"] == "opened \"x\"\n");
  CHECK(j["session"] == "s-1");
  CHECK(j["quota"] == "8");
}

TEST_CASE("levels below the minimum are not written; words are parsed") {
  log::level l{};
  CHECK(log::parse_level("debug", l));
  CHECK(l == log::level::debug);
  CHECK_FALSE(log::parse_level("verbose", l));
  log::format f{};
  CHECK(log::parse_format("json", f));
  CHECK(f == log::format::json);
  CHECK_FALSE(log::parse_format("xml", f));

  captured c{{.fmt = log::format::json, .min = log::level::warn}};
  CHECK_FALSE(log::enabled(log::level::info));
  CHECK(log::enabled(log::level::error));
  log::write(log::level::info, "t", "not me");
  log::write(log::level::error, "t", "me", {{"k", "v"}});
  auto out = c.finish();
  REQUIRE(out.size() == 1);
  auto j = nlohmann::json::parse(out[0]);
  CHECK(j["msg"] == "me");
  CHECK(j["k"] == "v");
}

TEST_CASE("a reader that does not read never blocks a writer: lines beyond the queue are "
          "dropped, counted, and the count is logged") {
  auto before = log::dropped();
  // Nobody reads the pipe yet: the writer thread fills it (64 KiB) and waits;
  // the queue (16 KiB) fills behind it.
  captured c{{.fmt = log::format::text, .min = log::level::info, .max_queued_bytes = 16384},
             false};
  for (int i = 0; i < 20000; ++i)
    log::write(log::level::info, "flood", "line", {{"i", std::to_string(i)}});
  auto lost = log::dropped() - before;
  CHECK(lost > 0);
  c.start();
  auto out = c.finish();
  // Every line was written or counted, and each count was said.
  uint64_t said = 0, written = 0;
  for (const auto& l : out) {
    auto at = l.find("lines were dropped");
    if (at == std::string::npos) {
      ++written;
      CHECK(l.find("flood: line i=") != std::string::npos);
      continue;
    }
    auto d = l.find("dropped=", at);
    REQUIRE(d != std::string::npos);
    said += std::stoull(l.substr(d + 8));
  }
  CHECK(written + lost == 20000);
  CHECK(said == lost);
}

TEST_CASE("refusals: the first of a cause at once, then one line per interval with the "
          "number suppressed") {
  captured c{{.fmt = log::format::json, .min = log::level::info, .refusal_interval_ms = 1000}};
  for (int i = 0; i < 5; ++i)
    log::refusal("door", "peer", "refused a connection", {{"why", "uid 65534"}});
  log::refusal("session", "quota", "over quota", {{"session", "s-1"}});
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  log::refusal("door", "peer", "refused a connection", {{"why", "uid 65534"}});
  auto out = c.finish();
  REQUIRE(out.size() == 3);
  auto first = nlohmann::json::parse(out[0]);
  CHECK(first["level"] == "warn");
  CHECK(first["cause"] == "peer");
  CHECK(first["why"] == "uid 65534");
  CHECK_FALSE(first.contains("suppressed"));
  CHECK(nlohmann::json::parse(out[1])["cause"] == "quota");
  auto third = nlohmann::json::parse(out[2]);
  CHECK(third["cause"] == "peer");
  CHECK(third["suppressed"] == "4");
}

#include "runtime/units.hpp"

#include <doctest/doctest.h>

using namespace dsec;
using namespace std::chrono_literals;

TEST_CASE("parse_size understands units") {
  CHECK(*parse_size("512", "--memory") == 512);
  CHECK(*parse_size("4k", "--memory") == 4096);
  CHECK(*parse_size("64m", "--memory") == 64ULL << 20);
  CHECK(*parse_size("64MiB", "--memory") == 64ULL << 20);
  CHECK(*parse_size("2G", "--memory") == 2ULL << 30);
  CHECK(*parse_size("1.5g", "--memory") == 3ULL << 29);
  CHECK(*parse_size("1t", "--disk") == 1ULL << 40);
}

TEST_CASE("parse_size names the option and the bad value") {
  auto e = parse_size("lots", "--memory");
  REQUIRE_FALSE(e);
  CHECK(e.error_value().code == errc::invalid_argument);
  CHECK(e.error_value().message.find("--memory") != std::string::npos);
  CHECK(e.error_value().message.find("'lots'") != std::string::npos);
  CHECK_FALSE(parse_size("12x", "--memory"));
  CHECK_FALSE(parse_size("12mbx", "--memory"));
  CHECK_FALSE(parse_size("-1", "--memory"));
  CHECK_FALSE(parse_size("", "--memory"));
}

TEST_CASE("parse_duration understands units") {
  CHECK(*parse_duration("30", "--timeout") == 30s);
  CHECK(*parse_duration("30s", "--timeout") == 30s);
  CHECK(*parse_duration("500ms", "--timeout") == 500ms);
  CHECK(*parse_duration("1.5s", "--timeout") == 1500ms);
  CHECK(*parse_duration("2m", "--timeout") == 2min);
  CHECK(*parse_duration("1h", "--timeout") == 1h);
  CHECK_FALSE(parse_duration("soon", "--timeout"));
  CHECK_FALSE(parse_duration("5d", "--timeout"));
  // Compound, larger units first.
  CHECK(*parse_duration("1h30m", "--ttl") == 90min);
  CHECK(*parse_duration("2m30s", "--ttl") == 150s);
  CHECK(*parse_duration("1s500ms", "--ttl") == 1500ms);
  CHECK(*parse_duration("1h0m5s", "--ttl") == 3605s);
  CHECK_FALSE(parse_duration("30m1h", "--ttl"));
  CHECK_FALSE(parse_duration("1m1m", "--ttl"));
  CHECK_FALSE(parse_duration("1h30", "--ttl"));
  CHECK_FALSE(parse_duration("1h-5m", "--ttl"));
}

TEST_CASE("formatting") {
  CHECK(format_size(512) == "512 B");
  CHECK(format_size(64ULL << 20) == "64 MiB");
  CHECK(format_size(3ULL << 29) == "1.5 GiB");
  CHECK(format_duration(250ms) == "250ms");
  CHECK(format_duration(2s) == "2s");
  CHECK(format_duration(1500ms) == "1.5s");
  CHECK(format_duration(3min) == "3m");
}

#include "runtime/endpoint.hpp"

#include <doctest/doctest.h>

using namespace dsec;

namespace {

bool says(const expected<endpoint>& r, std::string_view text) {
  return !r && r.error_value().message.find(text) != std::string::npos;
}

} // namespace

TEST_CASE("parse_endpoint: IPv4 addresses and names") {
  auto r = parse_endpoint("127.0.0.1:7070", "--connect");
  REQUIRE(r);
  CHECK(r->host == "127.0.0.1");
  CHECK(r->port == 7070);
  r = parse_endpoint("node-3.example:65535", "--connect");
  REQUIRE(r);
  CHECK(r->host == "node-3.example");
  CHECK(r->port == 65535);
  r = parse_endpoint("localhost:1", "--connect");
  REQUIRE(r);
  CHECK(r->port == 1);
}

TEST_CASE("parse_endpoint: IPv6 in brackets, and without them") {
  auto r = parse_endpoint("[::1]:7070", "--connect");
  REQUIRE(r);
  CHECK(r->host == "::1");
  CHECK(r->port == 7070);
  r = parse_endpoint("[fe80::1%eth0]:80", "--connect");
  REQUIRE(r);
  CHECK(r->host == "fe80::1%eth0");
  // The port is after the last colon.
  r = parse_endpoint("::1:7070", "--connect");
  REQUIRE(r);
  CHECK(r->host == "::1");
  CHECK(r->port == 7070);
  CHECK(says(parse_endpoint("[::1:7070", "--connect"), "bracket"));
  CHECK(says(parse_endpoint("::1]:7070", "--connect"), "bracket"));
}

TEST_CASE("parse_endpoint: errors name the input, the value and what is wrong") {
  auto r = parse_endpoint("somewhere", "--join");
  REQUIRE_FALSE(r);
  CHECK(r.error_value().code == errc::invalid_argument);
  CHECK(says(r, "--join: expected HOST:PORT (a port from 1 to 65535), got 'somewhere'"));
  CHECK(says(r, "no ':'"));
  CHECK(says(parse_endpoint("host:", "--connect"), "'host:': the port is missing"));
  CHECK(says(parse_endpoint(":7070", "--connect"), "the host is empty"));
  CHECK(says(parse_endpoint("[]:7070", "--connect"), "the host is empty"));
  CHECK(says(parse_endpoint("h:0", "--connect"), "port 0"));
  CHECK(says(parse_endpoint("h:65536", "--connect"), "'65536' is larger than 65535"));
  CHECK(says(parse_endpoint("h:99999999999999999999", "--connect"), "larger than 65535"));
  CHECK(says(parse_endpoint("h:70x", "--connect"), "'70x' is not a number"));
  CHECK(says(parse_endpoint("h:-1", "--connect"), "not a number"));
  CHECK(says(parse_endpoint("h:+80", "--connect"), "not a number"));
}

TEST_CASE("parse_endpoint: port 0 only where it is allowed") {
  auto r = parse_endpoint("127.0.0.1:0", "--listen", port_zero::allowed);
  REQUIRE(r);
  CHECK(r->port == 0);
  CHECK(says(parse_endpoint("127.0.0.1:x", "--listen", port_zero::allowed),
             "(a port from 0 to 65535)"));
  CHECK(says(parse_endpoint("127.0.0.1:0", "--connect"), "(a port from 1 to 65535)"));
}

TEST_CASE("format_endpoint: brackets around IPv6, and it parses back") {
  CHECK(format_endpoint("127.0.0.1", 7070) == "127.0.0.1:7070");
  CHECK(format_endpoint("::1", 7070) == "[::1]:7070");
  CHECK(endpoint{"::1", 80}.to_string() == "[::1]:80");
  for (auto s : {"127.0.0.1:7070", "[::1]:7070", "name:1"}) {
    auto r = parse_endpoint(s, "x");
    REQUIRE(r);
    CHECK(r->to_string() == s);
  }
}

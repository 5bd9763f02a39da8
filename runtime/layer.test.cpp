#include "runtime/layer.hpp"

#include <doctest/doctest.h>

using namespace dsec;

TEST_CASE("parse_layer_ref accepts NAME@VERSION") {
  auto r = parse_layer_ref("python@3.11");
  REQUIRE(r);
  CHECK(r->name == "python");
  CHECK(r->version == "3.11");
  CHECK(r->to_string() == "python@3.11");
  CHECK(parse_layer_ref("django-14493@2"));
  CHECK(parse_layer_ref("a_b+c@1.0-rc1"));
}

TEST_CASE("parse_layer_ref names what is malformed") {
  auto no_at = parse_layer_ref("python");
  REQUIRE_FALSE(no_at);
  CHECK(no_at.error_value().code == errc::invalid_argument);
  CHECK(no_at.error_value().message.find("NAME@VERSION") != std::string::npos);
  auto empty_version = parse_layer_ref("python@");
  REQUIRE_FALSE(empty_version);
  CHECK(empty_version.error_value().message.find("version is empty") != std::string::npos);
  auto slash = parse_layer_ref("../etc@1");
  REQUIRE_FALSE(slash);
  CHECK(slash.error_value().message.find("name must start") != std::string::npos);
  auto bad_char = parse_layer_ref("py@3/11");
  REQUIRE_FALSE(bad_char);
  CHECK(bad_char.error_value().message.find("contains '/'") != std::string::npos);
  CHECK_FALSE(parse_layer_ref("a@b@c"));
  CHECK_FALSE(parse_layer_ref(std::string(129, 'a') + "@1"));
}

TEST_CASE("layer kinds round-trip") {
  for (auto k : {layer_kind::base, layer_kind::workdir, layer_kind::tool}) {
    auto p = parse_layer_kind(to_string(k));
    REQUIRE(p);
    CHECK(*p == k);
  }
  auto bad = parse_layer_kind("image");
  REQUIRE_FALSE(bad);
  CHECK(bad.error_value().message.find("'image'") != std::string::npos);
}

// Diff records and the resolution of a snapshot's layers (runtime/snapshot.hpp).
#include "runtime/snapshot.hpp"

#include <doctest/doctest.h>

#include <map>

using namespace dsec;

namespace {

// A store of layers by ref: kind and record.
struct fake_store {
  std::map<std::string, layer_record> layers;
  expected<layer_record> operator()(const std::string& ref) const {
    auto it = layers.find(ref);
    if (it == layers.end())
      return make_error(errc::not_found, "unknown layer " + ref);
    return it->second;
  }
};

std::vector<std::string> refs(const std::vector<resolved_layer>& v) {
  std::vector<std::string> out;
  for (const auto& l : v)
    out.push_back(l.ref + ":" + to_string(l.kind));
  return out;
}

} // namespace

TEST_CASE("format_on and parse_on round-trip an environment's layers") {
  environment env;
  env.base = "debian@12";
  env.workdir = "task@3";
  env.tools = {"a@1", "b@2"};
  CHECK(format_on(env) == "base=debian@12 workdir=task@3 tool=a@1 tool=b@2");
  auto back = parse_on(format_on(env));
  REQUIRE(back);
  CHECK(back->base == env.base);
  CHECK(back->workdir == env.workdir);
  CHECK(back->tools == env.tools);
  environment on_diff;
  on_diff.snapshot = "d@1";
  on_diff.tools = {"t@1"};
  CHECK(format_on(on_diff) == "tool=t@1 snapshot=d@1");
  CHECK(parse_on("base=x@1 color=red").error_value().message.find("unknown key 'color'")
        != std::string::npos);
  CHECK(parse_on("base=../x").error_value().code == errc::invalid_argument);
  CHECK(parse_on("base").error_value().message.find("not KEY=VALUE") != std::string::npos);
}

TEST_CASE("resolve_layers stacks the extra tools, the diffs and the recorded layers") {
  fake_store st;
  st.layers["d1@1"] = {layer_kind::diff, "base=os@1 workdir=w@1 tool=t@1"};
  st.layers["d2@1"] = {layer_kind::diff, "tool=x@1 snapshot=d1@1"};
  st.layers["os@1"] = {layer_kind::base, ""};
  environment env;
  env.snapshot = "d2@1";
  env.tools = {"top@1"};
  auto r = resolve_layers(env, std::cref(st));
  REQUIRE(r);
  CHECK(refs(*r) == std::vector<std::string>{"top@1:tool", "d2@1:diff", "x@1:tool", "d1@1:diff",
                                             "t@1:tool", "w@1:workdir", "os@1:base"});
  // Without a snapshot: layer_slots() as it was.
  environment plain;
  plain.base = "os@1";
  plain.tools = {"a@1", "b@1"};
  auto p = resolve_layers(plain, std::cref(st));
  REQUIRE(p);
  CHECK(refs(*p) == std::vector<std::string>{"b@1:tool", "a@1:tool", "os@1:base"});
  // A snapshot that is not a diff, a base beside a snapshot, a missing one.
  env.snapshot = "os@1";
  env.tools.clear();
  CHECK(resolve_layers(env, std::cref(st)).error_value().code == errc::wrong_kind);
  env.snapshot = "d1@1";
  env.base = "os@1";
  CHECK(resolve_layers(env, std::cref(st)).error_value().code == errc::invalid_argument);
  env.base.clear();
  env.snapshot = "nope@1";
  CHECK(resolve_layers(env, std::cref(st)).error_value().code == errc::not_found);
  // A cycle (a ref removed and made again) ends at the depth bound.
  st.layers["loop@1"] = {layer_kind::diff, "snapshot=loop@1"};
  env.snapshot = "loop@1";
  auto l = resolve_layers(env, std::cref(st));
  REQUIRE_FALSE(l);
  CHECK(l.error_value().message.find("stacks more than") != std::string::npos);
}

// Layers end to end through the CLI: the order in which they are merged, where
// writes go, and what a tool update changes.
#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

#include "test/support/fixture.hpp"

using namespace dsec::test;

namespace {

// The file every shared layer has its own copy of.
const std::vector<std::string> cat_layer_file = {"probe", "cat", "/etc/layer-file"};

std::string layer_file_with(const std::vector<std::string>& options) {
  auto r = suite::get().run(options, cat_layer_file);
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  return r.out;
}

// The sandbox's view of the layer directories: path, type, mode, size, hash.
std::string tree_with(const std::vector<std::string>& options) {
  auto r = suite::get().run(options, {"sh", "-c", "probe tree /etc; probe tree /opt; probe tree /work; probe tree /bin"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  return r.out;
}

} // namespace

TEST_CASE("layers are merged base, workdir, tools, with the last --tool on top") {
  auto& s = suite::get();
  CHECK(layer_file_with({}) == "base\n");
  CHECK(layer_file_with({"--workdir", workdir_layer}) == "workdir\n");
  CHECK(layer_file_with({"--workdir", workdir_layer, "--tool", tool_a}) == "tool-a\n");
  CHECK(layer_file_with({"--workdir", workdir_layer, "--tool", tool_a, "--tool", tool_b})
        == "tool-b\n");
  CHECK(layer_file_with({"--workdir", workdir_layer, "--tool", tool_b, "--tool", tool_a})
        == "tool-a\n");
  CHECK(layer_file_with({"--tool", tool_a}) == "tool-a\n");

  // What no upper layer shadows comes through from each layer.
  auto r = s.run({"--workdir", workdir_layer, "--tool", tool_a, "--tool", tool_b},
                 {"sh", "-c",
                  "probe cat /etc/base-only; probe cat /work/marker; probe cat /opt/ta/bin/ta; "
                  "probe cat /opt/tb/marker"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "base only\nworkdir marker\ntool a\ntool b\n");

  // A layer that is not asked for is not there.
  r = s.run({}, {"sh", "-c", "probe cat /work/marker; probe cat /opt/ta/bin/ta"});
  CHECK(r.out == "ENOENT\nENOENT\n");
}

TEST_CASE("writes land in the sandbox's upper layer and vanish with it") {
  auto& s = suite::get();
  auto opts = std::vector<std::string>{"--workdir", workdir_layer, "--tool", tool_a};
  auto r = s.run(opts, {"sh", "-c",
                        "probe write /etc/layer-file changed && probe write /work/new created && "
                        "probe write /tmp/scratch tmp && probe write /etc/base-only '' && "
                        "probe cat /etc/layer-file; echo; probe cat /work/new; echo; "
                        "probe cat /tmp/scratch; echo; probe cat /etc/base-only; echo .; "
                        "mkdir /made && probe ls /"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto lines = lines_of(r.out);
  REQUIRE(lines.size() >= 8);
  CHECK(lines[0] == "ok");
  CHECK(lines[1] == "ok");
  CHECK(lines[2] == "ok");
  CHECK(lines[3] == "ok");
  CHECK(lines[4] == "changed");
  CHECK(lines[5] == "created");
  CHECK(lines[6] == "tmp");
  CHECK(lines[7] == ".");
  CHECK(r.out.find("\nmade\n") != std::string::npos);

  SUBCASE("the next sandbox starts clean") {
    auto again = s.run(opts, {"sh", "-c",
                              "probe cat /etc/layer-file; probe cat /work/new; "
                              "probe cat /tmp/scratch; probe cat /etc/base-only; probe ls /made"});
    CHECK(again.out == "tool-a\nENOENT\nENOENT\nbase only\nENOENT\n");
  }
  SUBCASE("deleting a lower file hides it in this sandbox only") {
    auto del = s.run(opts, {"sh", "-c", "rm /etc/base-only && probe cat /etc/base-only"});
    CHECK(del.out == "ENOENT\n");
    auto again = s.run(opts, {"probe", "cat", "/etc/base-only"});
    CHECK(again.out == "base only\n");
  }
}

TEST_CASE("a tool update changes only that tool's files") {
  auto& s = suite::get();
  s.build_layer("tool", "upd@1",
                s.make_tree("upd-1", {{"opt/upd/version", "1\n"}, {"opt/upd/same", "same\n"}}));
  auto before_base = s.digest_of(base_layer);
  auto before_wd = s.digest_of(workdir_layer);
  auto before_ta = s.digest_of(tool_a);
  auto opts1 = std::vector<std::string>{"--workdir", workdir_layer, "--tool", tool_a, "--tool",
                                        "upd@1"};
  auto tree1 = tree_with(opts1);

  s.build_layer("tool", "upd@2",
                s.make_tree("upd-2", {{"opt/upd/version", "2\n"}, {"opt/upd/same", "same\n"}}));
  CHECK(s.digest_of(base_layer) == before_base);
  CHECK(s.digest_of(workdir_layer) == before_wd);
  CHECK(s.digest_of(tool_a) == before_ta);
  CHECK(s.digest_of("upd@1") != s.digest_of("upd@2"));

  auto opts2 = opts1;
  opts2.back() = "upd@2";
  auto tree2 = tree_with(opts2);
  // Every line of the two views is the same except the changed file's.
  auto l1 = lines_of(tree1), l2 = lines_of(tree2);
  REQUIRE(l1.size() == l2.size());
  std::vector<std::string> changed;
  for (size_t i = 0; i < l1.size(); ++i)
    if (l1[i] != l2[i])
      changed.push_back(l1[i] + " => " + l2[i]);
  REQUIRE(changed.size() == 1);
  CHECK(changed[0].rfind("/opt/upd/version f ", 0) == 0);

  auto v = s.run(opts2, {"probe", "cat", "/opt/upd/version"});
  CHECK(v.out == "2\n");
  // The old version still works for whoever uses it.
  v = s.run(opts1, {"probe", "cat", "/opt/upd/version"});
  CHECK(v.out == "1\n");
  // The same tree built again under another version is stored once.
  auto blobs = [&] { return lines_of(s.store_snapshot()).size(); };
  auto n = blobs();
  s.build_layer("tool", "upd@3", s.root() + "/src/upd-2");
  CHECK(s.digest_of("upd@3") == s.digest_of("upd@2"));
  CHECK(blobs() == n + 2); // one more ref line in `layer ls` and one ref file, no blob
}

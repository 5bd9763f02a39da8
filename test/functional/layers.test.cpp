// Layers end to end through the CLI: the order in which they are merged, where
// writes go, and what a tool update changes.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "test/support/fixture.hpp"
#include "test/support/process.hpp"

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

// Issue 12 §3 for layer import: a fifo in the source (which nothing ever
// writes) must not hang `dsec layer build`, whether the source is a directory
// or a tar archive of one; it is kept as a fifo. Device nodes (a door to the
// host's devices wherever an image is mounted) and sockets are left out, each
// named on stderr.
TEST_CASE("layer build: a fifo in the source is kept and never opened; devices and sockets are left out") {
  auto& s = suite::get();
  auto src = s.make_tree("specials", {{"opt/sp/file", "regular\n"}});
  REQUIRE(::mkfifo((src + "/opt/sp/fifo").c_str(), 0644) == 0);
  REQUIRE(::mknod((src + "/opt/sp/null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0);
  REQUIRE(::mknod((src + "/opt/sp/disk").c_str(), S_IFBLK | 0666, makedev(8, 0)) == 0);
  {
    int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(sock >= 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    auto path = src + "/opt/sp/sock";
    REQUIRE(path.size() < sizeof a.sun_path);
    std::strcpy(a.sun_path, path.c_str());
    REQUIRE(::bind(sock, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    ::close(sock);
  }
  auto tar = s.root() + "/src/specials.tar";
  auto packed = run_process({"/usr/bin/tar", "-cf", tar, "-C", src, "."});
  REQUIRE_MESSAGE(packed.status == 0, packed.describe());
  for (const auto& [ref, from] : std::vector<std::pair<std::string, std::string>>{
         {"specials@dir", src}, {"specials@tar", tar}}) {
    CAPTURE(ref);
    auto r = s.dsec({"layer", "build", "--kind", "tool", ref, from});
    CHECK_FALSE_MESSAGE(r.safety_killed, "the build hung: " << r.describe());
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    CHECK_MESSAGE(r.err.find("left out /opt/sp/null (a character device)") != std::string::npos,
                  r.describe());
    CHECK_MESSAGE(r.err.find("left out /opt/sp/disk (a block device)") != std::string::npos,
                  r.describe());
    if (from == src) // GNU tar does not archive sockets
      CHECK_MESSAGE(r.err.find("left out /opt/sp/sock (a socket)") != std::string::npos,
                    r.describe());
    auto in = s.run({"--tool", ref}, {"sh", "-c", "ls /opt/sp; ls -l /opt/sp/fifo | cut -c1"});
    REQUIRE_MESSAGE(in.status == 0, in.describe());
    CHECK(in.out == "fifo\nfile\np\n");
  }
  for (const auto& ref : {"specials@dir", "specials@tar"})
    CHECK(s.dsec({"layer", "rm", ref}).status == 0);
}

namespace {

// "sha256:<12 hex>" from `layer build`'s "built KIND REF sha256:... (...)" line.
std::string built_digest(const proc_result& r) {
  auto at = r.out.find("sha256:");
  return at == std::string::npos ? std::string{} : r.out.substr(at, 7 + 12);
}

} // namespace

TEST_CASE("layer build: which mtimes are kept, and when a tar of a tree has its digest") {
  auto& s = suite::get();
  auto src = s.make_tree("times", {{"opt/t/frac", "a\n"}, {"opt/t/old", "b\n"},
                                   {"opt/t/future", "c\n"}});
  auto set = [&](const std::string& rel, int64_t sec, long nsec) {
    struct timespec t[2] = {{sec, nsec}, {sec, nsec}};
    REQUIRE(::utimensat(AT_FDCWD, (src + "/" + rel).c_str(), t, AT_SYMLINK_NOFOLLOW) == 0);
  };
  set("opt/t/frac", 1577836800, 123456789);  // 2020-01-01 00:00:00.123456789
  set("opt/t/old", -305812800, 0);           // 1960-04-22
  set("opt/t/future", 10413792000, 0);       // 2300-01-01
  auto dir = s.dsec({"layer", "build", "--kind", "tool", "times@dir", src});
  REQUIRE_MESSAGE(dir.status == 0, dir.describe());
  auto in = s.run({"--tool", "times@dir"},
                  {"sh", "-c", "cd /opt/t && stat -c '%n %y' frac old future"});
  REQUIRE_MESSAGE(in.status == 0, in.describe());
  CHECK(in.out == "frac 2020-01-01 00:00:00.123456789 +0000\n"
                  "old 2100-01-01 00:00:00.000000000 +0000\n"
                  "future 2100-01-01 00:00:00.000000000 +0000\n");
  // The same tree again: nothing changes, and it says so.
  auto again = s.dsec({"layer", "build", "--kind", "tool", "times@dir", src});
  CHECK_MESSAGE(again.status == 0, again.describe());
  CHECK_MESSAGE(again.out.rfind("unchanged tool times@dir " + built_digest(dir), 0) == 0,
                again.describe());
  // A pax tar keeps the sub-second mtimes: the same digest; GNU tar's default
  // format does not: another one.
  auto pax = s.root() + "/src/times-pax.tar", gnu = s.root() + "/src/times-gnu.tar";
  REQUIRE(run_process({"/usr/bin/tar", "--format=posix", "-cf", pax, "-C", src, "."}).status == 0);
  REQUIRE(run_process({"/usr/bin/tar", "-cf", gnu, "-C", src, "."}).status == 0);
  auto from_pax = s.dsec({"layer", "build", "--kind", "tool", "times@pax", pax});
  auto from_gnu = s.dsec({"layer", "build", "--kind", "tool", "times@gnu", gnu});
  REQUIRE_MESSAGE(from_pax.status == 0, from_pax.describe());
  REQUIRE_MESSAGE(from_gnu.status == 0, from_gnu.describe());
  CHECK(built_digest(from_pax) == built_digest(dir));
  CHECK(built_digest(from_gnu) != built_digest(dir));
  // Other content under a taken name: refused, naming both images.
  auto other = s.dsec({"layer", "build", "--kind", "tool", "times@dir", gnu});
  CHECK_MESSAGE(other.status == 1, other.describe());
  CHECK_MESSAGE(other.err.find("already exists as a tool layer with image") != std::string::npos,
                other.describe());
  for (const auto& ref : {"times@dir", "times@pax", "times@gnu"})
    CHECK(s.dsec({"layer", "rm", ref}).status == 0);
}

TEST_CASE("layer build: a whiteout in a tool layer is refused unless --whiteouts says it is meant") {
  auto& s = suite::get();
  auto src = s.make_tree("hider", {{"opt/h/file", "x\n"}});
  REQUIRE(::mkdir((src + "/etc").c_str(), 0755) == 0);
  // A 0/0 character device: overlayfs's whiteout, which would delete the
  // base's /etc/layer-file from every sandbox using this tool.
  REQUIRE(::mknod((src + "/etc/layer-file").c_str(), S_IFCHR | 0600, makedev(0, 0)) == 0);
  auto r = s.dsec({"layer", "build", "--kind", "tool", "hider@1", src});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(r.err.find("/etc/layer-file is a 0/0 character device") != std::string::npos,
                r.describe());
  CHECK_MESSAGE(r.err.find("--whiteouts") != std::string::npos, r.describe());
  r = s.dsec({"layer", "build", "--kind", "workdir", "hider@1", src});
  CHECK_MESSAGE(r.status == 1, r.describe());
  // Meant: then it hides the base's file, as overlayfs does.
  r = s.dsec({"layer", "build", "--kind", "tool", "--whiteouts", "hider@1", src});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto in = s.run({"--tool", "hider@1"}, {"sh", "-c", "ls /etc/layer-file 2>&1; cat /opt/h/file"});
  CHECK_MESSAGE(in.out.find("No such file") != std::string::npos, in.describe());
  CHECK(s.dsec({"layer", "rm", "hider@1"}).status == 0);
}

TEST_CASE("layer build: a name mkfs.erofs cannot hold is named; a sparse file stays sparse") {
  auto& s = suite::get();
  auto src = s.make_tree("longname", {{"opt/l/ok", "x\n"}});
  auto name = std::string(255, 'n');
  auto touch = run_process({"/usr/bin/touch", src + "/opt/l/" + name});
  REQUIRE_MESSAGE(touch.status == 0, touch.describe());
  auto r = s.dsec({"layer", "build", "--kind", "tool", "long@1", src});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(r.err.find("the name of /opt/l/" + name + " is 255 bytes long") != std::string::npos,
                r.describe());
  CHECK(r.err.find("Could not format") == std::string::npos);

  auto sparse = s.make_tree("sparse", {{"opt/s/small", "y\n"}});
  auto big = sparse + "/opt/s/big";
  REQUIRE(run_process({"/usr/bin/truncate", "-s", "100M", big}).status == 0);
  REQUIRE(run_process({"/bin/sh", "-c", "echo end >> " + big}).status == 0);
  r = s.dsec({"layer", "build", "--kind", "tool", "sparse@1", sparse});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto ls = s.dsec({"layer", "ls"});
  auto line = ls.out.substr(ls.out.find("sparse@1"));
  line = line.substr(0, line.find('\n'));
  // The image holds the 4 bytes of data, not the 100 MiB of holes.
  CHECK_MESSAGE(line.find("MiB") == std::string::npos, line);
  auto in = s.run({"--tool", "sparse@1"}, {"sh", "-c", "wc -c < /opt/s/big; tail -c 4 /opt/s/big"});
  CHECK_MESSAGE(in.out == "104857604\nend\n", in.describe());
  CHECK(s.dsec({"layer", "rm", "sparse@1"}).status == 0);
}

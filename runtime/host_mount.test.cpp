#include "runtime/host_mount.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "runtime/environment.hpp"
#include "runtime/userns.hpp"
#include "test/support/fixture.hpp"

using namespace dsec;
using dsec::test::temp_dir;

namespace {

bool says(const error& e, std::string_view what) {
  return e.message.find(what) != std::string::npos;
}

environment with_mounts(std::vector<host_mount> m) {
  environment e;
  e.base = "debian@12";
  e.mounts = std::move(m);
  return e;
}

// A user namespace to idmap into, as a sandbox's (sandbox 0 is host 1e9).
unique_fd sandbox_userns() {
  auto ns = make_userns(id_range{});
  REQUIRE_MESSAGE(ns, ns.error_value().to_string());
  return std::move(*ns);
}

} // namespace

TEST_CASE("-v: HOST:SANDBOX[:ro|:rw] parses, with the default mode when none is given") {
  auto m = parse_host_mount("/data:/work", true);
  REQUIRE(m);
  CHECK(m->host == "/data");
  CHECK(m->target == "/work");
  CHECK(m->read_only);
  CHECK(m->to_string() == "/data:/work:ro");
  m = parse_host_mount("/data:/work", false);
  REQUIRE(m);
  CHECK_FALSE(m->read_only);
  m = parse_host_mount("/data:/work:ro", false);
  REQUIRE(m);
  CHECK(m->read_only);
  m = parse_host_mount("/data:/work:rw", true);
  REQUIRE(m);
  CHECK_FALSE(m->read_only);
  // Options: a comma-separated list.
  m = parse_host_mount("/data:/work:rbind", true);
  REQUIRE(m);
  CHECK(m->recursive);
  CHECK(m->read_only);
  CHECK(m->idmap);
  CHECK(m->to_string() == "/data:/work:ro,rbind");
  m = parse_host_mount("/data:/work:noidmap,rw,rbind", true);
  REQUIRE(m);
  CHECK_FALSE(m->read_only);
  CHECK(m->recursive);
  CHECK_FALSE(m->idmap);
  CHECK(m->to_string() == "/data:/work:rw,rbind,noidmap");
  CHECK(*parse_host_mount(m->to_string(), true) == *m);
  m = parse_host_mount("/srv/x", true); // the same path inside
  REQUIRE(m);
  CHECK(m->target == "/srv/x");

  struct bad_case {
    const char* text;
    const char* says;
  };
  for (auto c : {bad_case{"/a:/b:rx", "none of ro, rw, rbind and noidmap"},
                 bad_case{"/a:/b:ro,rw", "one of ro and rw"}, bad_case{"data:/b", "absolute"},
                 bad_case{"/a:b", "absolute"}, bad_case{":/b", "HOST:SANDBOX"},
                 bad_case{"/a:", "HOST:SANDBOX"}, bad_case{"/a/../etc:/b", "'..'"},
                 bad_case{"/a:/b/./c", "'.'"}, bad_case{"/a://b", "empty component"},
                 bad_case{"/a:/", "root"}, bad_case{"/a:/proc/x", "/proc"},
                 bad_case{"/a:/dev", "/dev"}, bad_case{"/a:/sys/fs", "/sys"},
                 bad_case{"/a:/.dsec/bin", "/.dsec"}}) {
    auto r = parse_host_mount(c.text, true);
    REQUIRE_MESSAGE(!r, c.text);
    CHECK(r.error_value().code == errc::invalid_argument);
    CHECK_MESSAGE(says(r.error_value(), c.says), r.error_value().message);
  }
  // A trailing slash is the same place; /procfs is not /proc.
  CHECK(parse_host_mount("/a/:/procfs/", true));
}

TEST_CASE("an environment's host mounts: at most 16, none nested, container backends only") {
  CHECK(with_mounts({{"/a", "/x", true}, {"/b", "/y", false}}).validate());
  auto r = with_mounts({{"/a", "/x", true}, {"/b", "/x", true}}).validate();
  REQUIRE_FALSE(r);
  CHECK(says(r.error_value(), "is that of /a:/x:ro"));
  r = with_mounts({{"/a", "/x", true}, {"/b", "/x/y", true}}).validate();
  REQUIRE_FALSE(r);
  CHECK(says(r.error_value(), "nests with"));
  CHECK(with_mounts({{"/a", "/x", true}, {"/b", "/xy", true}}).validate());
  std::vector<host_mount> many;
  for (int i = 0; i < 17; ++i)
    many.push_back({"/a", "/m" + std::to_string(i), true});
  r = with_mounts(many).validate();
  REQUIRE_FALSE(r);
  CHECK(says(r.error_value(), "at most 16"));
  auto vm = with_mounts({{"/a", "/x", true}});
  vm.backend = "microvm";
  r = vm.check_mounts();
  REQUIRE_FALSE(r);
  CHECK(r.error_value().code == errc::unsupported);
  // What is listed and compared carries them.
  auto e = with_mounts({{"/a", "/x", true}});
  CHECK(e.to_json().find(R"("mounts": [{"host": "/a", "target": "/x", "read_only": true, "recursive": false, "idmap": true}])")
        != std::string::npos);
  CHECK(e.difference(with_mounts({}), "A", "B").find("mounts /a:/x:ro A, (none) B") != std::string::npos);
}

TEST_CASE("a node's policy: beneath its directories, read-only unless :rw, never out by a symlink") {
  temp_dir t{"/tmp", "dsec-host-mount"};
  auto allowed = t.path() + "/allowed";
  REQUIRE(::mkdir(allowed.c_str(), 0755) == 0);
  REQUIRE(::mkdir((allowed + "/sub").c_str(), 0755) == 0);
  std::ofstream{allowed + "/file"} << "hello";
  REQUIRE(::mkdir((t.path() + "/secret").c_str(), 0700) == 0);
  REQUIRE(::symlink((t.path() + "/secret").c_str(), (allowed + "/out").c_str()) == 0);
  REQUIRE(::symlink("sub", (allowed + "/in").c_str()) == 0);
  REQUIRE(::mkfifo((allowed + "/fifo").c_str(), 0644) == 0);
  auto ns = sandbox_userns();

  SUBCASE("a node that allows nothing refuses every mount, saying how to allow one") {
    host_mount_policy none;
    auto r = none.prepare({{allowed, "/x", true}}, ns.get());
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == errc::invalid_argument);
    CHECK(says(r.error_value(), "--allow-host-mount"));
  }
  SUBCASE("allowed directories must exist; a writable one must be on a nosuid mount") {
    auto r = host_mount_policy::open({t.path() + "/missing"});
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == errc::not_found);
    r = host_mount_policy::open({"relative"});
    REQUIRE_FALSE(r);
    struct statvfs vfs{};
    REQUIRE(::statvfs(allowed.c_str(), &vfs) == 0);
    r = host_mount_policy::open({allowed + ":rw"});
    if (vfs.f_flag & ST_NOSUID) {
      CHECK(r);
    } else {
      REQUIRE_FALSE(r);
      CHECK(says(r.error_value(), "nosuid"));
    }
  }
  SUBCASE("beneath an allowed directory: directories and files, read-only") {
    auto p = host_mount_policy::open({allowed});
    REQUIRE(p);
    CHECK(p->describe() == allowed);
    auto r = p->prepare({{allowed, "/a", true}, {allowed + "/sub", "/b", true},
                         {allowed + "/file", "/etc/motd", true}, {allowed + "/in", "/c", true}},
                        ns.get());
    REQUIRE_MESSAGE(r, r.error_value().to_string());
    REQUIRE(r->size() == 4);
    CHECK((*r)[0].directory);
    CHECK((*r)[0].target == "/a");
    CHECK_FALSE((*r)[2].directory);
    CHECK((*r)[3].directory); // a symlink that stays beneath is followed
    for (const auto& m : *r) {
      // Detached clones, read-only: nothing can be made through them.
      CHECK(m.tree);
      if (m.directory)
        CHECK(::mkdirat(m.tree.get(), "new", 0755) < 0);
    }
    CHECK(::access((allowed + "/new").c_str(), F_OK) != 0);
  }
  SUBCASE("what is refused, each naming the mount") {
    auto p = host_mount_policy::open({allowed});
    REQUIRE(p);
    struct refused {
      host_mount m;
      errc code;
      const char* says;
    };
    for (const auto& c : {
           refused{{t.path() + "/secret", "/x", true}, errc::invalid_argument, "outside"},
           refused{{t.path(), "/x", true}, errc::invalid_argument, "outside"},
           refused{{allowed + "x", "/x", true}, errc::invalid_argument, "outside"},
           refused{{allowed + "/out", "/x", true}, errc::invalid_argument, "through a symlink"},
           refused{{allowed + "/sub", "/x", false}, errc::invalid_argument, "read-only only"},
           refused{{allowed + "/none", "/x", true}, errc::not_found, "does not exist"},
           refused{{allowed + "/fifo", "/x", true}, errc::wrong_kind, "neither a directory"},
         }) {
      auto r = p->prepare({c.m}, ns.get());
      REQUIRE_MESSAGE(!r, c.m.to_string());
      CHECK(r.error_value().code == c.code);
      CHECK_MESSAGE(says(r.error_value(), c.says), r.error_value().message);
      CHECK_MESSAGE(says(r.error_value(), c.m.to_string()), r.error_value().message);
    }
  }
  SUBCASE("anything (a local run as root): every path, writable") {
    auto p = host_mount_policy::anything();
    REQUIRE(p);
    auto r = p->prepare({{allowed + "/out", "/x", false}}, ns.get());
    REQUIRE_MESSAGE(r, r.error_value().to_string());
    CHECK((*r)[0].directory);
  }
}

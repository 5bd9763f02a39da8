// Tests of the layer store. Each test gets its own state dir under /tmp, removed
// at the end whatever happens. They need root (tar --same-owner, mknod) and the
// erofs-utils binaries (mkfs.erofs, dump.erofs).
#include "runtime/store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include <doctest/doctest.h>

#include "test/support/fixture.hpp"
#include "test/support/skip.hpp"

namespace {

namespace fs = std::filesystem;

using dsec::test::temp_dir;

// A test fixture: a scratch dir for inputs and an opened store in it.
struct fixture {
  temp_dir scratch{"/tmp", "dsec-store-test"};
  std::string state = scratch / "state";
  dsec::store st = open_store(state);

  static dsec::store open_store(const std::string& dir) {
    auto s = dsec::store::open(dir);
    REQUIRE_MESSAGE(s, s.error_value().to_string());
    return std::move(*s);
  }
};

void write_file(const std::string& path, const std::string& content) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  REQUIRE(out.good());
}

void set_mtime(const std::string& path, time_t seconds) {
  struct timespec times[2] = {{seconds, 0}, {seconds, 0}};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW) == 0);
}

// A small tree with a fixed mtime everywhere, so two copies build the same image.
void make_tree(const std::string& root, const std::string& flavour = "one") {
  write_file(root + "/hello.txt", "hello " + flavour + "\n");
  write_file(root + "/bin/tool", "#!/bin/sh\necho tool\n");
  REQUIRE(::chmod((root + "/bin/tool").c_str(), 0755) == 0);
  REQUIRE(::symlink("hello.txt", (root + "/link").c_str()) == 0);
  for (auto p : {"/hello.txt", "/bin/tool", "/link", "/bin", ""})
    set_mtime(root + p, 1600000000);
}

// Runs argv (no shell) and returns its exit status and combined output.
struct run_result {
  int status = -1;
  std::string output;
};
run_result run(std::vector<std::string> argv) {
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    std::vector<char*> cargv;
    for (auto& a : argv)
      cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execvp(cargv[0], cargv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  run_result r;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0)
    r.output.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string dump(const std::string& image, const std::string& path) {
  auto r = run({"dump.erofs", "--path=" + path, image});
  REQUIRE_MESSAGE(r.status == 0, r.output);
  return r.output;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  return out;
}

dsec::layer_ref ref(const std::string& s) {
  auto r = dsec::parse_layer_ref(s);
  REQUIRE(r);
  return *r;
}

dsec::build_result build_ok(dsec::store& st, dsec::layer_kind kind, const std::string& r,
                            const std::string& src, const dsec::build_options& o = {}) {
  auto res = st.build(kind, ref(r), src, o);
  REQUIRE_MESSAGE(res, res.error_value().to_string());
  return std::move(*res);
}

// The store holds exactly these refs and blobs, and nothing is left in tmp/.
void check_store(const std::string& state, size_t refs, size_t blobs) {
  CHECK(entries(state + "/refs").size() == refs);
  CHECK(entries(state + "/blobs/sha256").size() == blobs);
  CHECK(entries(state + "/tmp").empty());
}

} // namespace

TEST_CASE("store: open creates the layout") {
  fixture f;
  for (auto sub : {"lock", "blobs/sha256", "refs", "tmp", "system"})
    CHECK(fs::exists(f.state + "/" + sub));
  CHECK(f.st.dir() == f.state);
  auto again = dsec::store::open(f.state + "/"); // existing layout, trailing slash
  REQUIRE(again);
  CHECK(again->dir() == f.state);
}

TEST_CASE("store: open removes stale staging entries but not live ones") {
  fixture f;
  write_file(f.state + "/tmp/build-crashed/root/file", "x");
  write_file(f.state + "/tmp/leftover-file", "x");
  auto live = f.state + "/tmp/build-live";
  REQUIRE(::mkdir(live.c_str(), 0700) == 0);
  dsec::unique_fd live_fd{::open(live.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  REQUIRE(::flock(live_fd.get(), LOCK_EX) == 0);

  auto s = dsec::store::open(f.state);
  REQUIRE(s);
  CHECK(entries(f.state + "/tmp") == std::vector<std::string>{"build-live"});
}

TEST_CASE("store: build from a directory") {
  fixture f;
  auto src = f.scratch / "src";
  make_tree(src);
  auto res = build_ok(f.st, dsec::layer_kind::tool, "grader@2", src);
  CHECK_FALSE(res.deduplicated);
  CHECK(res.seconds >= 0);
  const auto& info = res.info;
  CHECK(info.ref.to_string() == "grader@2");
  CHECK(info.kind == dsec::layer_kind::tool);
  REQUIRE(info.digest.size() == 7 + 64);
  CHECK(info.digest.rfind("sha256:", 0) == 0);
  CHECK(info.source == src);
  CHECK(info.blob_path == f.state + "/blobs/sha256/" + info.digest.substr(7));
  CHECK(std::abs(info.created - static_cast<int64_t>(::time(nullptr))) < 60);

  struct stat st{};
  REQUIRE(::stat(info.blob_path.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0444);
  CHECK(static_cast<uint64_t>(st.st_size) == info.size);
  CHECK(dump(info.blob_path, "/bin/tool").find("regular file") != std::string::npos);
  CHECK(dump(info.blob_path, "/link").find("symlink") != std::string::npos);

  auto ref_text = std::ifstream(f.state + "/refs/grader@2");
  std::string all((std::istreambuf_iterator<char>(ref_text)), {});
  CHECK(all.find("kind=tool\n") != std::string::npos);
  CHECK(all.find("digest=" + info.digest + "\n") != std::string::npos);
  CHECK(all.find("source=" + src + "\n") != std::string::npos);

  auto found = f.st.find(ref("grader@2"));
  REQUIRE(found);
  CHECK(found->digest == info.digest);
  CHECK(found->size == info.size);
  CHECK(found->created == info.created);
  CHECK(found->source == src);
  CHECK(found->kind == dsec::layer_kind::tool);
  check_store(f.state, 1, 1);
}

TEST_CASE("store: a relative source is recorded as an absolute path") {
  fixture f;
  make_tree(f.scratch / "src");
  auto cwd = fs::current_path();
  fs::current_path(f.scratch.path());
  auto res = f.st.build(dsec::layer_kind::base, ref("rel@1"), "src");
  fs::current_path(cwd);
  REQUIRE_MESSAGE(res, res.error_value().to_string());
  CHECK(res->info.source == f.scratch / "src");
}

TEST_CASE("store: build from tar archives keeps owners and modes") {
  fixture f;
  auto src = f.scratch / "src";
  make_tree(src);
  REQUIRE(::chown((src + "/hello.txt").c_str(), 1234, 5678) == 0);
  REQUIRE(::chmod((src + "/hello.txt").c_str(), 0640) == 0);
  REQUIRE(run({"tar", "-cf", f.scratch / "layer.tar", "-C", src, "."}).status == 0);
  REQUIRE(run({"tar", "-czf", f.scratch / "layer.tar.gz", "-C", src, "."}).status == 0);

  auto plain = build_ok(f.st, dsec::layer_kind::base, "os@1", f.scratch / "layer.tar");
  auto text = dump(plain.info.blob_path, "/hello.txt");
  CHECK(text.find("Uid: 1234") != std::string::npos);
  CHECK(text.find("Gid: 5678") != std::string::npos);
  CHECK(text.find("0640") != std::string::npos);
  CHECK(dump(plain.info.blob_path, "/bin/tool").find("0755") != std::string::npos);
  CHECK(plain.info.source == f.scratch / "layer.tar");
  // The archive has a "./" member: the root keeps its own mtime.
  CHECK(dump(plain.info.blob_path, "/").find("2020-09-13") != std::string::npos);

  // The compressed archive holds the same tree: same image, stored once.
  auto gz = build_ok(f.st, dsec::layer_kind::base, "os@2", f.scratch / "layer.tar.gz");
  CHECK(gz.info.digest == plain.info.digest);
  CHECK(gz.deduplicated);
  check_store(f.state, 2, 1);
}

TEST_CASE("store: an archive without a ./ member builds the same digest every time") {
  fixture f;
  auto src = f.scratch / "src";
  make_tree(src);
  // Like docker export: members are "bin", "hello.txt", ..., not "./bin".
  REQUIRE(run({"tar", "-cf", f.scratch / "export.tar", "-C", src, "bin", "hello.txt", "link"})
            .status
          == 0);
  auto a = build_ok(f.st, dsec::layer_kind::base, "exp@1", f.scratch / "export.tar");
  ::usleep(20 * 1000); // a later extraction time must not change the digest
  auto b = build_ok(f.st, dsec::layer_kind::base, "exp@2", f.scratch / "export.tar");
  CHECK(a.info.digest == b.info.digest);
  CHECK(b.deduplicated);
  auto root = dump(a.info.blob_path, "/");
  CHECK(root.find("0755") != std::string::npos);
  CHECK(root.find("1970-01-01") != std::string::npos); // pinned, see store::build
}

TEST_CASE("store: the same content under two names is stored once") {
  fixture f;
  auto src = f.scratch / "src";
  make_tree(src);
  auto a = build_ok(f.st, dsec::layer_kind::tool, "a@1", src);
  auto b = build_ok(f.st, dsec::layer_kind::workdir, "b@1", src);
  CHECK_FALSE(a.deduplicated);
  CHECK(b.deduplicated);
  CHECK(a.info.digest == b.info.digest);
  CHECK(a.info.blob_path == b.info.blob_path);
  check_store(f.state, 2, 1);
}

TEST_CASE("store: the digest is deterministic") {
  fixture f;
  // Two separately created trees (other inode numbers, other creation order) with
  // the same names, contents, modes and mtimes.
  auto one = f.scratch / "one";
  auto two = f.scratch / "two";
  make_tree(one);
  write_file(two + "/bin/tool", "#!/bin/sh\necho tool\n");
  REQUIRE(::chmod((two + "/bin/tool").c_str(), 0755) == 0);
  REQUIRE(::symlink("hello.txt", (two + "/link").c_str()) == 0);
  write_file(two + "/hello.txt", "hello one\n");
  for (auto p : {"/hello.txt", "/bin/tool", "/link", "/bin", ""})
    set_mtime(two + p, 1600000000);

  auto a = build_ok(f.st, dsec::layer_kind::base, "x@1", one);
  REQUIRE(f.st.remove(ref("x@1")));
  check_store(f.state, 0, 0);
  ::usleep(1100 * 1000); // a later build time must not show in the image
  auto b = build_ok(f.st, dsec::layer_kind::base, "x@1", one);
  CHECK(a.info.digest == b.info.digest);
  CHECK_FALSE(b.deduplicated); // the first blob was removed with its ref
  auto c = build_ok(f.st, dsec::layer_kind::base, "y@1", two);
  CHECK(c.info.digest == a.info.digest);

  auto lz = build_ok(f.st, dsec::layer_kind::base, "x@lz4", one, {"lz4"});
  auto lz2 = build_ok(f.st, dsec::layer_kind::base, "y@lz4", two, {"lz4"});
  CHECK(lz.info.digest == lz2.info.digest);
  CHECK(lz.info.digest != a.info.digest);
}

TEST_CASE("store: per-file mtimes are kept") {
  fixture f;
  auto src = f.scratch / "src";
  make_tree(src);
  set_mtime(src + "/hello.txt", 978307200); // 2001-01-01T00:00:00Z
  auto a = build_ok(f.st, dsec::layer_kind::base, "m@1", src);
  CHECK(dump(a.info.blob_path, "/hello.txt").find("2001-01-01 00:00:00")
        != std::string::npos);
  CHECK(dump(a.info.blob_path, "/bin/tool").find("2020-09-13") != std::string::npos);

  // Only an mtime differs: a different image.
  set_mtime(src + "/hello.txt", 978307201);
  auto b = build_ok(f.st, dsec::layer_kind::base, "m@2", src);
  CHECK(a.info.digest != b.info.digest);
}

TEST_CASE("store: list is sorted by name, then version in natural order") {
  fixture f;
  auto empty = f.st.list();
  REQUIRE(empty);
  CHECK(empty->empty());

  auto src = f.scratch / "src";
  make_tree(src);
  for (auto r : {"python@10", "base@1", "python@9", "python@3.11", "python@3.9", "zz@1"})
    build_ok(f.st, dsec::layer_kind::base, r, src);
  write_file(f.state + "/refs/not-a-ref", "ignored");
  auto all = f.st.list();
  REQUIRE_MESSAGE(all, all.error_value().to_string());
  std::vector<std::string> names;
  for (auto& l : *all)
    names.push_back(l.ref.to_string());
  CHECK(names
        == std::vector<std::string>{"base@1", "python@3.9", "python@3.11", "python@9",
                                    "python@10", "zz@1"});
}

TEST_CASE("store: find of an unknown layer is not_found") {
  fixture f;
  auto r = f.st.find(ref("nope@1"));
  REQUIRE_FALSE(r);
  CHECK(r.error_value().code == dsec::errc::not_found);
  CHECK(r.error_value().message == "unknown layer nope@1 (see 'dsec layer ls')");
  CHECK(f.st.lease(ref("nope@1")).error_value().code == dsec::errc::not_found);
  CHECK(f.st.remove(ref("nope@1")).error_value().code == dsec::errc::not_found);
}

TEST_CASE("store: a hand-made ref that could escape refs/ is refused") {
  fixture f;
  dsec::layer_ref bad{"../../etc", "1"};
  CHECK(f.st.find(bad).error_value().code == dsec::errc::invalid_argument);
  CHECK(f.st.remove(bad).error_value().code == dsec::errc::invalid_argument);
  CHECK(f.st.build(dsec::layer_kind::base, bad, f.scratch.path()).error_value().code
        == dsec::errc::invalid_argument);
}

TEST_CASE("store: build errors name the bad input and leave the store unchanged") {
  fixture f;
  SUBCASE("missing source") {
    auto missing = f.scratch / "does-not-exist";
    auto r = f.st.build(dsec::layer_kind::base, ref("a@1"), missing);
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == dsec::errc::not_found);
    CHECK(r.error_value().message.find(missing) != std::string::npos);
  }
  SUBCASE("a file that is not a tar archive") {
    auto junk = f.scratch / "junk.bin";
    write_file(junk, std::string(10000, 'j'));
    auto r = f.st.build(dsec::layer_kind::base, ref("a@1"), junk);
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == dsec::errc::tool_failed);
    auto msg = r.error_value().message;
    CHECK(msg.find("tar") != std::string::npos);
    CHECK(msg.find(junk) != std::string::npos);
    CHECK(msg.find("does not look like a tar archive") != std::string::npos);
  }
  SUBCASE("neither a directory nor a regular file") {
    auto r = f.st.build(dsec::layer_kind::base, ref("a@1"), "/dev/null");
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == dsec::errc::invalid_argument);
    CHECK(r.error_value().message.find("/dev/null") != std::string::npos);
  }
  SUBCASE("unknown compression") {
    make_tree(f.scratch / "src");
    auto r = f.st.build(dsec::layer_kind::base, ref("a@1"), f.scratch / "src", {"zstd"});
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == dsec::errc::invalid_argument);
    CHECK(r.error_value().message.find("zstd") != std::string::npos);
  }
  check_store(f.state, 0, 0);
}

TEST_CASE("store: versions are immutable") {
  fixture f;
  make_tree(f.scratch / "one", "one");
  make_tree(f.scratch / "two", "two");
  auto first = build_ok(f.st, dsec::layer_kind::base, "os@1", f.scratch / "one");
  auto again = f.st.build(dsec::layer_kind::base, ref("os@1"), f.scratch / "two");
  REQUIRE_FALSE(again);
  CHECK(again.error_value().code == dsec::errc::already_exists);
  CHECK(again.error_value().message.find("os@1") != std::string::npos);
  // Both images are named.
  CHECK(again.error_value().message.find(first.info.digest) != std::string::npos);
  // The same content as another kind is refused too.
  auto as_tool = f.st.build(dsec::layer_kind::tool, ref("os@1"), f.scratch / "one");
  REQUIRE_FALSE(as_tool);
  CHECK(as_tool.error_value().code == dsec::errc::already_exists);
  // The same content as the same kind is a no-op that says so.
  auto same = f.st.build(dsec::layer_kind::base, ref("os@1"), f.scratch / "one");
  REQUIRE(same);
  CHECK(same->existed);
  CHECK(same->info.digest == first.info.digest);
  CHECK(same->info.created == first.info.created);
  auto found = f.st.find(ref("os@1"));
  REQUIRE(found);
  CHECK(found->digest == first.info.digest);
  check_store(f.state, 1, 1);
}

TEST_CASE("store: remove is refused while a lease is held") {
  fixture f;
  make_tree(f.scratch / "src");
  auto built = build_ok(f.st, dsec::layer_kind::tool, "t@1", f.scratch / "src");
  {
    auto lease = f.st.lease(ref("t@1"));
    REQUIRE_MESSAGE(lease, lease.error_value().to_string());
    CHECK(lease->blob_path() == built.info.blob_path);
    CHECK(lease->info().digest == built.info.digest);
    auto moved = std::move(*lease); // the hold moves with the lease
    CHECK_FALSE(*lease);
    auto second = f.st.lease(ref("t@1")); // leases are shared
    REQUIRE(second);

    auto r = f.st.remove(ref("t@1"));
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == dsec::errc::in_use);
    CHECK(r.error_value().message.find("t@1") != std::string::npos);
    CHECK(f.st.find(ref("t@1")));
    CHECK(fs::exists(built.info.blob_path));
  }
  auto r = f.st.remove(ref("t@1"));
  REQUIRE_MESSAGE(r, r.error_value().to_string());
  CHECK(f.st.find(ref("t@1")).error_value().code == dsec::errc::not_found);
  check_store(f.state, 0, 0);
}

TEST_CASE("store: a lease held by another process blocks remove") {
  fixture f;
  make_tree(f.scratch / "src");
  build_ok(f.st, dsec::layer_kind::tool, "t@1", f.scratch / "src");
  int ready[2], done[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(done) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    auto lease = f.st.lease(ref("t@1"));
    char c = lease ? 'y' : 'n';
    (void) !::write(ready[1], &c, 1);
    (void) !::read(done[0], &c, 1); // hold the lease until the parent says so
    ::_exit(0);
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  CHECK(c == 'y');
  CHECK(f.st.remove(ref("t@1")).error_value().code == dsec::errc::in_use);
  REQUIRE(::write(done[1], "x", 1) == 1);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  for (int fd : {ready[0], ready[1], done[0], done[1]})
    ::close(fd);
  CHECK(f.st.remove(ref("t@1")));
}

TEST_CASE("store: a shared blob goes with its last ref") {
  fixture f;
  make_tree(f.scratch / "src");
  auto a = build_ok(f.st, dsec::layer_kind::base, "a@1", f.scratch / "src");
  auto b = build_ok(f.st, dsec::layer_kind::base, "b@1", f.scratch / "src");
  REQUIRE(a.info.blob_path == b.info.blob_path);
  REQUIRE(f.st.remove(ref("a@1")));
  CHECK(fs::exists(a.info.blob_path));
  check_store(f.state, 1, 1);
  auto lease = f.st.lease(ref("b@1")); // still usable
  REQUIRE(lease);
  lease = f.st.lease(ref("b@1")); // replacing a lease releases the old hold
  REQUIRE(lease);
  {
    auto drop = std::move(*lease);
  }
  REQUIRE(f.st.remove(ref("b@1")));
  CHECK_FALSE(fs::exists(a.info.blob_path));
  check_store(f.state, 0, 0);
}

TEST_CASE("store: the system layer has the device nodes and is built once") {
  fixture f;
  auto path = f.st.system_layer();
  REQUIRE_MESSAGE(path, path.error_value().to_string());
  // Named after the version and the chronus client it carries.
  CHECK(path->rfind(f.state + "/system/system-v4-", 0) == 0);
  CHECK(path->size() == (f.state + "/system/system-v4-").size() + 16 + 6);
  // dsec's own copy, which Chronus sandboxes mount read-only at /.dsec, and the
  // usual place, one file in the image.
  auto chronus = dump(*path, "/.dsec/bin/chronus");
  CHECK(chronus.find("regular file") != std::string::npos);
  CHECK(chronus.find("0755") != std::string::npos);
  CHECK(chronus.find("Links: 2") != std::string::npos);
  auto linked = dump(*path, "/usr/local/bin/chronus");
  CHECK(linked.find("regular file") != std::string::npos);
  CHECK(dump(*path, "/.dsec/agent").find("directory") != std::string::npos);
  // dsec-watch, the watcher of Sandbox.files.watch and WatchDir.
  auto watch = dump(*path, "/.dsec/libexec/watch");
  CHECK(watch.find("regular file") != std::string::npos);
  CHECK(watch.find("0755") != std::string::npos);
  // The static busybox (tools/setup installs busybox-static), with the tar
  // that put and get fall back on.
  auto bb = dsec::store::find_busybox();
  REQUIRE_MESSAGE(bb, bb.error_value().to_string());
  if (*bb) {
    auto copy = dump(*path, "/.dsec/libexec/busybox");
    CHECK(copy.find("regular file") != std::string::npos);
    CHECK(copy.find("0755") != std::string::npos);
    CHECK(dump(*path, "/.dsec/libexec/tar").find("symlink") != std::string::npos);
  } else {
    MESSAGE("no static busybox on this machine: the system layer has no tar of its own");
    CHECK(dump(*path, "/.dsec/libexec/busybox").find("regular file") == std::string::npos);
  }

  auto null = dump(*path, "/dev/null");
  CHECK(null.find("char dev") != std::string::npos);
  CHECK(null.find("0666") != std::string::npos);
  CHECK(null.find("Uid: 0   Gid: 0") != std::string::npos);
  CHECK(null.find("1970-01-01") != std::string::npos);
  CHECK(dump(*path, "/proc").find("0555") != std::string::npos);
  CHECK(dump(*path, "/dev/fd").find("symlink") != std::string::npos);
  CHECK(dump(*path, "/dev/tty").find("char dev") != std::string::npos);
  struct stat before{}, after{};
  REQUIRE(::stat(path->c_str(), &before) == 0);
  CHECK((before.st_mode & 07777) == 0444);
  auto again = f.st.system_layer();
  REQUIRE(again);
  CHECK(*again == *path);
  REQUIRE(::stat(again->c_str(), &after) == 0);
  CHECK(before.st_ino == after.st_ino);
  CHECK(entries(f.state + "/tmp").empty());

  // Deterministic: a second store builds the same bytes.
  temp_dir other{"/tmp", "dsec-store-test"};
  auto other_store = fixture::open_store(other / "state");
  auto other_path = other_store.system_layer();
  REQUIRE(other_path);
  CHECK(run({"cmp", *path, *other_path}).status == 0);
}

// ---- import: layers whose image was made elsewhere ----------------------------

// dump.erofs 1.5 prints only the low 9 mode bits, so the sticky bit of /tmp
// and /dev/shm (and the device nodes) are checked on a loop mount.
TEST_CASE("store: the system layer's /tmp and /dev/shm are sticky, its nodes real, on a mount"
          * dsec::test::skip_unless(dsec::test::loop_erofs_mounts(),
                                    "the system layer on a loop mount: no loop devices or no "
                                    "EROFS on this machine")) {
  fixture f;
  auto path = f.st.system_layer();
  REQUIRE_MESSAGE(path, path.error_value().to_string());
  auto mnt = f.scratch / "mnt";
  fs::create_directories(mnt);
  auto m = run({"mount", "-t", "erofs", "-o", "loop,ro", *path, mnt});
  REQUIRE_MESSAGE(m.status == 0, m.output);
  struct unmount_at_exit {
    std::string dir;
    ~unmount_at_exit() { (void) run({"umount", dir}); }
  } unmount{mnt};
  struct stat s{};
  REQUIRE(::stat((mnt + "/tmp").c_str(), &s) == 0);
  CHECK((s.st_mode & 07777) == 01777);
  REQUIRE(::stat((mnt + "/dev/shm").c_str(), &s) == 0);
  CHECK((s.st_mode & 07777) == 01777);
  REQUIRE(::stat((mnt + "/dev/zero").c_str(), &s) == 0);
  CHECK(S_ISCHR(s.st_mode));
  CHECK(s.st_rdev == makedev(1, 5));
  char target[64] = {};
  REQUIRE(::readlink((mnt + "/dev/stderr").c_str(), target, sizeof target - 1) > 0);
  CHECK(std::string{target} == "/proc/self/fd/2");
}

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// A staged file in `st` holding `bytes`, appended in pieces of `piece`.
dsec::staged_file staged(dsec::store& st, const std::string& bytes, size_t piece = 4096) {
  auto f = st.stage("import");
  REQUIRE_MESSAGE(f, f.error_value().to_string());
  for (size_t at = 0; at < bytes.size(); at += piece) {
    auto r = f->append(bytes.data() + at, std::min(piece, bytes.size() - at));
    REQUIRE_MESSAGE(r, r.error_value().to_string());
  }
  return std::move(*f);
}

// Imports into `to` the layer `info` (of another store) with the image `bytes`.
dsec::expected<dsec::import_result> import_as(dsec::store& to, const dsec::layer_info& info,
                                              const std::string& bytes,
                                              const std::string& as = {}) {
  return to.import(info.kind, as.empty() ? info.ref : ref(as), info.digest, info.size,
                   info.created, info.source, staged(to, bytes));
}

// Two stores: `from` with a layer built in it, `to` empty.
struct two_stores {
  fixture from;
  temp_dir other{"/tmp", "dsec-store-test"};
  std::string to_state = other / "state";
  dsec::store to = fixture::open_store(to_state);
  dsec::layer_info built;
  std::string image;

  two_stores() {
    make_tree(from.scratch / "src");
    built = build_ok(from.st, dsec::layer_kind::tool, "grader@3", from.scratch / "src").info;
    image = slurp(built.blob_path);
    REQUIRE(image.size() == built.size);
  }
};

} // namespace

TEST_CASE("store: import installs a layer built elsewhere, byte for byte") {
  two_stores s;
  // The store's own staging convention: a locked directory of its own in tmp/.
  {
    auto f = s.to.stage("fetch");
    REQUIRE(f);
    CHECK(f->path().rfind(s.to_state + "/tmp/fetch-", 0) == 0);
    CHECK(fs::exists(f->path()));
  }
  CHECK(entries(s.to_state + "/tmp").empty()); // an unused staged file goes

  auto r = import_as(s.to, s.built, s.image);
  REQUIRE_MESSAGE(r, r.error_value().to_string());
  CHECK_FALSE(r->deduplicated);
  CHECK_FALSE(r->existed);
  auto found = s.to.find(ref("grader@3"));
  REQUIRE_MESSAGE(found, found.error_value().to_string());
  CHECK(found->digest == s.built.digest);
  CHECK(found->size == s.built.size);
  CHECK(found->kind == dsec::layer_kind::tool);
  CHECK(found->created == s.built.created); // as where it was built
  CHECK(found->source == s.built.source);
  CHECK(found->blob_path == s.to_state + "/blobs/sha256/" + s.built.digest.substr(7));
  CHECK(slurp(found->blob_path) == s.image);
  struct stat st{};
  REQUIRE(::stat(found->blob_path.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0444);
  CHECK(s.to.lease(ref("grader@3"))); // usable like a built layer
  check_store(s.to_state, 1, 1);

  // The same layer again: nothing to do. Another digest under its name: refused.
  auto again = import_as(s.to, s.built, s.image);
  REQUIRE_MESSAGE(again, again.error_value().to_string());
  CHECK(again->existed);
  make_tree(s.from.scratch / "other", "two");
  auto other =
    build_ok(s.from.st, dsec::layer_kind::tool, "other@1", s.from.scratch / "other").info;
  auto clash = other;
  clash.ref = ref("grader@3");
  auto refused = import_as(s.to, clash, slurp(other.blob_path));
  REQUIRE_FALSE(refused);
  CHECK(refused.error_value().code == dsec::errc::already_exists);
  CHECK(refused.error_value().message.find("grader@3") != std::string::npos);
  CHECK(s.to.find(ref("grader@3"))->digest == s.built.digest);
  check_store(s.to_state, 1, 1);
}

TEST_CASE("store: import refuses an image whose sha256 is not the digest, leaving nothing") {
  two_stores s;
  SUBCASE("one byte changed") {
    auto bad = s.image;
    bad[bad.size() / 2] ^= 0x01;
    auto r = import_as(s.to, s.built, bad);
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == dsec::errc::invalid_argument);
    const auto& msg = r.error_value().message;
    CHECK(msg.find("digest mismatch") != std::string::npos);
    CHECK(msg.find("grader@3") != std::string::npos);
    CHECK(msg.find(s.built.digest) != std::string::npos);
  }
  SUBCASE("a malformed digest never reaches a path") {
    for (std::string d : std::vector<std::string>{"sha256:../../../etc/passwd", "sha256:" + std::string(64, 'A'),
                          "sha512:" + std::string(64, 'a'), "sha256:" + std::string(63, 'a'),
                          std::string(64, 'a'), std::string{}}) {
      auto info = s.built;
      info.digest = d;
      auto r = import_as(s.to, info, s.image);
      REQUIRE_FALSE(r);
      CHECK(r.error_value().code == dsec::errc::invalid_argument);
      CHECK(r.error_value().message.find("malformed digest") != std::string::npos);
    }
  }
  SUBCASE("a newline in the source") {
    auto info = s.built;
    info.source = "/src\nkind=base";
    auto r = import_as(s.to, info, s.image);
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == dsec::errc::invalid_argument);
  }
  check_store(s.to_state, 0, 0);
  CHECK(s.to.find(ref("grader@3")).error_value().code == dsec::errc::not_found);
}

TEST_CASE("store: import refuses an image of another size, leaving nothing") {
  two_stores s;
  SUBCASE("short") {
    auto r = import_as(s.to, s.built, s.image.substr(0, s.image.size() - 1));
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == dsec::errc::invalid_argument);
    CHECK(r.error_value().message.find("size mismatch") != std::string::npos);
    CHECK(r.error_value().message.find(std::to_string(s.built.size)) != std::string::npos);
  }
  SUBCASE("long") {
    auto r = import_as(s.to, s.built, s.image + "x");
    REQUIRE_FALSE(r);
    CHECK(r.error_value().message.find("size mismatch") != std::string::npos);
  }
  check_store(s.to_state, 0, 0);
}

TEST_CASE("store: an imported image already stored under another name is shared") {
  two_stores s;
  auto first = import_as(s.to, s.built, s.image);
  REQUIRE_MESSAGE(first, first.error_value().to_string());
  auto second = import_as(s.to, s.built, s.image, "copy@1");
  REQUIRE_MESSAGE(second, second.error_value().to_string());
  CHECK(second->deduplicated);
  CHECK(second->info.blob_path == first->info.blob_path);
  check_store(s.to_state, 2, 1);
  // A built layer with the same bytes shares it too.
  auto built = build_ok(s.to, dsec::layer_kind::tool, "local@1", s.from.scratch / "src");
  CHECK(built.deduplicated);
  check_store(s.to_state, 3, 1);
  // And it goes with the last ref.
  for (auto r : {"grader@3", "copy@1", "local@1"})
    REQUIRE(s.to.remove(ref(r)));
  check_store(s.to_state, 0, 0);
}

TEST_CASE("store: a staged file its process left behind is removed by open()") {
  fixture f;
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    auto st = dsec::store::open(f.state);
    auto file = st ? st->stage("fetch") : dsec::expected<dsec::staged_file>{dsec::error{}};
    bool ok = file && file->append("half an image", 13);
    ::_exit(ok ? 0 : 1); // no destructors: as if it crashed
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  CHECK(entries(f.state + "/tmp").size() == 1);
  auto reopened = dsec::store::open(f.state);
  REQUIRE(reopened);
  CHECK(entries(f.state + "/tmp").empty());
}

TEST_CASE("store: open_blob reads a blob by a strictly checked digest") {
  two_stores s;
  auto fd = s.from.st.open_blob(s.built.digest);
  REQUIRE_MESSAGE(fd, fd.error_value().to_string());
  std::string head(16, '\0');
  REQUIRE(::pread(fd->get(), head.data(), head.size(), 0) == 16);
  CHECK(head == s.image.substr(0, 16));
  CHECK(dsec::store::is_digest(s.built.digest));

  auto unknown = s.to.open_blob(s.built.digest);
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error_value().code == dsec::errc::not_found);
  CHECK(unknown.error_value().message.find(s.built.digest) != std::string::npos);

  auto hex = s.built.digest.substr(7);
  for (std::string d : std::vector<std::string>{"sha256:../" + hex.substr(3), "sha256:" + hex + "/", "SHA256:" + hex,
                        "sha256:" + hex.substr(0, 63) + "G", "sha256:" + hex + "0",
                        "sha256:" + std::string(64, 'F'), std::string{"sha256:"}, hex,
                        std::string("sha256:\0", 8) + hex.substr(1)}) {
    CHECK_FALSE(dsec::store::is_digest(d));
    auto r = s.from.st.open_blob(d);
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == dsec::errc::invalid_argument);
  }
}

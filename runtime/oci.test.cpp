// OCI documents, references and one layer's unpacking (test/oci has the rest,
// end to end with a real registry).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "runtime/fd.hpp"
#include "runtime/oci.hpp"
#include "runtime/registry.hpp"

using namespace dsec;

namespace {

// A tar in memory: (name, type, content/target).
std::string make_tar(const std::vector<std::tuple<std::string, int, std::string>>& entries) {
  std::string out;
  struct archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  archive_write_open(
    a, &out, nullptr,
    [](struct archive*, void* d, const void* buf, size_t n) -> la_ssize_t {
      static_cast<std::string*>(d)->append(static_cast<const char*>(buf), n);
      return static_cast<la_ssize_t>(n);
    },
    nullptr);
  for (const auto& [name, type, content] : entries) {
    struct archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, name.c_str());
    archive_entry_set_filetype(e, static_cast<unsigned>(type));
    archive_entry_set_perm(e, type == AE_IFDIR ? 0755 : 0644);
    archive_entry_set_mtime(e, 1000, 0);
    if (type == AE_IFLNK)
      archive_entry_set_symlink(e, content.c_str());
    if (type == AE_IFREG)
      archive_entry_set_size(e, static_cast<la_int64_t>(content.size()));
    archive_write_header(a, e);
    if (type == AE_IFREG)
      archive_write_data(a, content.data(), content.size());
    archive_entry_free(e);
  }
  archive_write_close(a);
  archive_write_free(a);
  return out;
}

struct tmp_tree {
  std::string path;
  tmp_tree() {
    char t[] = "/tmp/dsec-oci-unit-XXXXXX";
    path = ::mkdtemp(t);
  }
  ~tmp_tree() { std::filesystem::remove_all(path); }
};

expected<oci::unpack_result> unpack(const std::string& tar, const std::string& root) {
  auto file = root + ".tar";
  {
    unique_fd fd{::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
    REQUIRE(::write(fd.get(), tar.data(), tar.size()) == static_cast<ssize_t>(tar.size()));
  }
  unique_fd fd{::open(file.c_str(), O_RDONLY | O_CLOEXEC)};
  auto r = oci::unpack_layer(fd.get(), "test.tar", root);
  ::unlink(file.c_str());
  return r;
}

} // namespace

TEST_CASE("registry references: hosts, Docker Hub, tags, digests, http only for loopback") {
  auto r = registry::reference::parse("127.0.0.1:5000/a/b:1.2");
  REQUIRE(r);
  CHECK(r->host == "127.0.0.1:5000");
  CHECK(r->repository == "a/b");
  CHECK(r->tag == "1.2");
  CHECK(r->default_layer() == "b@1.2");
  r = registry::reference::parse("debian:12");
  REQUIRE(r);
  CHECK(r->host == "registry-1.docker.io");
  CHECK(r->repository == "library/debian");
  r = registry::reference::parse("localhost:1/x");
  REQUIRE(r);
  CHECK(r->tag == "latest");
  auto d = "sha256:" + std::string(64, 'a');
  r = registry::reference::parse("http://[::1]:80/x@" + d);
  REQUIRE(r);
  CHECK(r->digest == d);
  CHECK(r->default_layer() == "x@aaaaaaaaaaaa");
  auto bad = registry::reference::parse("http://10.0.0.1/x:1");
  REQUIRE(!bad);
  CHECK(bad.error_value().message.find("loopback") != std::string::npos);
  CHECK(!registry::reference::parse("h.io/UPPER:1"));
  CHECK(!registry::reference::parse("h.io/x@sha256:12"));
  CHECK(registry::is_loopback_host("127.1.2.3:99"));
  CHECK(!registry::is_loopback_host("127.0.0.1.evil.com"));
  CHECK(!registry::is_loopback_host("128.0.0.1"));
}

TEST_CASE("OCI documents: platforms, unsupported media types, the config kept") {
  auto p = oci::platform::parse("linux/arm64/v8");
  REQUIRE(p);
  CHECK(p->variant == "v8");
  CHECK(!oci::platform::parse("linux"));
  auto dg = [](char c) { return "sha256:" + std::string(64, c); };
  std::string index = R"({"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":")"
                      + dg('a') + R"(","size":1,"platform":{"os":"linux","architecture":"amd64"}},
    {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":")"
                      + dg('b') + R"(","size":1,"platform":{"os":"linux","architecture":"arm64"}}]})";
  auto entries = oci::parse_index(index, "idx");
  REQUIRE(entries);
  auto pick = oci::pick_platform(*entries, oci::platform{}, "idx");
  REQUIRE(pick);
  CHECK(pick->digest == dg('a'));
  auto none = oci::pick_platform(*entries, *oci::platform::parse("linux/riscv64"), "idx");
  REQUIRE(!none);
  CHECK(none.error_value().code == errc::not_found);
  CHECK(none.error_value().message.find("linux/amd64, linux/arm64") != std::string::npos);

  std::string manifest = R"({"schemaVersion":2,"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":")"
                         + dg('c') + R"(","size":2},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+foo","digest":")"
                         + dg('d') + R"(","size":3}]})";
  auto m = oci::parse_manifest(manifest, "m");
  REQUIRE(!m);
  CHECK(m.error_value().code == errc::unsupported);
  CHECK(m.error_value().message.find("tar+foo") != std::string::npos);
  CHECK(!oci::parse_manifest("[1]", "m"));
  CHECK(!oci::parse_manifest("{not json", "m"));

  auto cfg = oci::parse_config(
    R"({"os":"linux","config":{"Env":["A=1","B=two words"],"WorkingDir":"/w","User":"1:2","Cmd":["x","y\nz"]},"rootfs":{"diff_ids":[]}})",
    "c");
  REQUIRE(cfg);
  CHECK(cfg->config.env.size() == 2);
  CHECK(cfg->config.working_dir == "/w");
  auto line = cfg->config.to_json();
  CHECK(line.find('\n') == std::string::npos);
  auto back = dsec::image_config::from_json(line);
  REQUIRE(back);
  CHECK(*back == cfg->config);
}

TEST_CASE("unpack_layer: whiteouts become 0/0 devices, opaque markers an xattr, escapes refused") {
  tmp_tree t;
  auto root = t.path + "/root";
  REQUIRE(::mkdir(root.c_str(), 0755) == 0);
  auto r = unpack(make_tar({{"d", AE_IFDIR, ""},
                            {"d/.wh..wh..opq", AE_IFREG, ""},
                            {"d/kept", AE_IFREG, "k"},
                            {"e/.wh.gone", AE_IFREG, ""},
                            {"./f", AE_IFREG, "f"}}),
                  root);
  REQUIRE_MESSAGE(r, r.error_value().message);
  CHECK(r->whiteouts == 1);
  CHECK(r->opaque_dirs == 1);
  struct stat st{};
  REQUIRE(::lstat((root + "/e/gone").c_str(), &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
  CHECK(st.st_rdev == ::makedev(0, 0));
  CHECK(::lstat((root + "/e/.wh.gone").c_str(), &st) != 0);
  CHECK(::lstat((root + "/d/.wh..wh..opq").c_str(), &st) != 0);
  char v[4] = {0};
  CHECK(::lgetxattr((root + "/d").c_str(), "trusted.overlay.opaque", v, sizeof v) == 1);
  CHECK(v[0] == 'y');
  // An implied directory and the root without an entry get the epoch.
  REQUIRE(::lstat((root + "/e").c_str(), &st) == 0);
  CHECK(st.st_mtime == 0);
  REQUIRE(::lstat(root.c_str(), &st) == 0);
  CHECK(st.st_mtime == 0);
  REQUIRE(::lstat((root + "/d").c_str(), &st) == 0);
  CHECK(st.st_mtime == 1000);

  auto root2 = t.path + "/root2";
  REQUIRE(::mkdir(root2.c_str(), 0755) == 0);
  auto esc = unpack(make_tar({{"a/../../x", AE_IFREG, "x"}}), root2);
  REQUIRE(!esc);
  CHECK(esc.error_value().message.find("escapes the image's root") != std::string::npos);
  auto through = unpack(make_tar({{"l", AE_IFLNK, t.path}, {"l/planted", AE_IFREG, "x"}}), root2);
  REQUIRE(!through);
  CHECK(::access((t.path + "/planted").c_str(), F_OK) != 0);
}

TEST_CASE("a pull's overall bar: percent, MiB done of all, rate and time left") {
  auto half = dsec::registry::progress_bar(50u << 20, 100u << 20, 10);
  CHECK(half == "[============>           ]  50% 50.0/100.0 MiB, 5.0 MiB/s, 0m10s left");
  auto done = dsec::registry::progress_bar(100u << 20, 100u << 20, 20);
  CHECK(done == "[========================] 100% 100.0/100.0 MiB, 5.0 MiB/s, -- left");
  auto start = dsec::registry::progress_bar(0, 3u << 20, 0);
  CHECK(start == "[>                       ]   0% 0.0/3.0 MiB, 0.0 MiB/s, -- left");
  // Nothing to download (every layer stored): full, not a division by zero.
  CHECK(dsec::registry::progress_bar(0, 0, 1).find("100%") != std::string::npos);
}

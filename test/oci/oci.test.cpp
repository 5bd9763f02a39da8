// OCI images end to end, with real parts: image layouts built by hand
// (test/oci/make_layout.py: python's tarfile, sha256, the spec's JSON), pushed
// with skopeo into Debian's docker-registry (the distribution registry) that
// each case starts on a free loopback port with its own storage and config,
// pulled and imported with the real dsec, and run in sandboxes whose view is
// compared with umoci's unpacking of the same image.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "test/microvm/guest.hpp"
#include "test/support/fixture.hpp"
#include "test/support/process.hpp"
#include "test/support/skip.hpp"

using namespace dsec::test;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

bool have(const char* tool) {
  for (const char* dir : {"/usr/bin/", "/usr/sbin/", "/bin/", "/sbin/"})
    if (::access((std::string{dir} + tool).c_str(), X_OK) == 0)
      return true;
  return false;
}

bool have_registry_tools() {
  return have("docker-registry") && have("skopeo") && have("python3");
}

std::string make_layout_script() {
  return std::string{DSEC_SOURCE_DIR} + "/test/oci/make_layout.py";
}

// busybox and a few applets, /etc/passwd with an unprivileged user: enough to
// look around in a sandbox.
json busybox_layer(const std::string& tag = {}) {
  json e = json::array();
  if (!tag.empty())
    e.push_back({{"name", "etc-tag"}, {"type", "file"}, {"content", tag}});
  e.push_back({{"name", "bin"}, {"type", "dir"}});
  e.push_back({{"name", "bin/busybox"}, {"type", "file"}, {"source", "/bin/busybox"},
               {"mode", 0755}});
  for (const char* a : {"sh", "ls", "cat", "find", "sort", "id", "pwd", "echo", "test", "stat",
                        "readlink", "wc", "sleep"})
    e.push_back({{"name", std::string{"bin/"} + a}, {"type", "symlink"}, {"target", "busybox"}});
  e.push_back({{"name", "etc"}, {"type", "dir"}});
  e.push_back({{"name", "etc/passwd"},
               {"type", "file"},
               {"content", "root:x:0:0:root:/root:/bin/sh\nagent:x:1234:1235::/home:/bin/sh\n"}});
  e.push_back({{"name", "etc/shadow"}, {"type", "file"}, {"content", "the image's shadow\n"}});
  return {{"compress", "gzip"}, {"entries", e}};
}

json file(const std::string& name, const std::string& content) {
  return {{"name", name}, {"type", "file"}, {"content", content}};
}
json dir(const std::string& name) { return {{"name", name}, {"type", "dir"}}; }
json layer(json entries, const char* compress = "gzip") {
  return {{"compress", compress}, {"entries", std::move(entries)}};
}

// The data layer of the whiteout image: on top of `lower_data`.
json lower_data() {
  return layer(json::array({dir("data"), file("data/keep", "kept\n"), file("data/gone", "gone\n"),
                            dir("data/dir"), file("data/dir/old", "old\n"),
                            dir("data/gonedir"), file("data/gonedir/f", "f\n")}));
}
json upper_data() {
  return layer(json::array(
    {file("data/.wh.gone", ""), file("data/.wh.gonedir", ""), file("data/dir/.wh..wh..opq", ""),
     file("data/dir/new", "new\n"), file("data/added", "added\n"),
     {{"name", "data/linked"}, {"type", "hardlink"}, {"target", "data/added"}},
     {{"name", "data/shadow"}, {"type", "symlink"}, {"target", "/etc/shadow"}}}));
}

// Builds an OCI layout from `images`; returns make_layout.py's lines.
std::vector<std::string> make_layout(const std::string& layout, const json& images) {
  fs::create_directories(fs::path{layout}.parent_path());
  auto spec = layout + ".spec.json";
  write_file(spec, json{{"dir", layout}, {"images", images}}.dump());
  auto r = run_process({"/usr/bin/python3", make_layout_script(), spec});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  return lines_of(r.out);
}

std::vector<std::string> lowers_of(const std::string& ref) {
  auto r = suite::get().dsec({"layer", "inspect", ref});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  std::vector<std::string> out;
  for (const auto& l : lines_of(r.out))
    if (l.rfind("  sha256:", 0) == 0)
      out.push_back(l.substr(2));
  return out;
}

size_t blob_count() {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(suite::get().state() + "/blobs/sha256"))
    n += e.is_regular_file() ? 1 : 0;
  return n;
}

// What a sandbox of `base` sees under /data: every path with its type, then
// each regular file's content.
std::string sandbox_view(const std::string& base) {
  auto r = suite::get().run(
    {"--base", base},
    {"sh", "-c",
     "cd / && find data | sort | while read p; do if test -L \"$p\"; then echo \"$p -> "
     "$(readlink \"$p\")\"; elif test -d \"$p\"; then echo \"$p/\"; else echo \"$p: $(cat \"$p\")\"; "
     "fi; done"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  return r.out;
}

// The same listing of a host directory holding data/ (umoci's rootfs).
std::string host_view(const std::string& root) {
  auto r = run_process(
    {"/bin/sh", "-c",
     "cd '" + root
       + "' && find data | LC_ALL=C sort | while read p; do if test -L \"$p\"; then echo \"$p -> "
         "$(readlink \"$p\")\"; elif test -d \"$p\"; then echo \"$p/\"; else echo \"$p: $(cat "
         "\"$p\")\"; fi; done"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  return r.out;
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

bool port_open(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// docker-registry on a free loopback port, its storage and config in a temp dir;
// with `user`, basic auth (htpasswd, bcrypt) or, with `token`, the bearer-token
// flow against test/oci/token_server.py.
struct registry {
  temp_dir dir{suite::get().root(), "registry"};
  int port = free_port();
  std::unique_ptr<background> tokens;
  std::unique_ptr<background> proc;
  std::string creds;

  explicit registry(const std::string& user = {}, const std::string& password = {},
                    bool token = false) {
    std::string cfg = "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: "
                      + dir / "storage" + "\nhttp:\n  addr: 127.0.0.1:" + std::to_string(port)
                      + "\n  secret: dsec-test\n";
    if (!user.empty() && !token) {
      auto h = run_process({"/usr/bin/htpasswd", "-Bbn", user, password});
      REQUIRE_MESSAGE(h.status == 0, h.describe());
      write_file(dir / "htpasswd", h.out);
      cfg += "auth:\n  htpasswd:\n    realm: dsec-test\n    path: " + dir / "htpasswd" + "\n";
    }
    if (token) {
      auto k = run_process({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                            "-keyout", dir / "token.key", "-out", dir / "token.crt", "-days", "2",
                            "-subj", "/CN=dsec-test-token"});
      REQUIRE_MESSAGE(k.status == 0, k.describe());
      tokens = std::make_unique<background>(std::vector<std::string>{
        "/usr/bin/python3", std::string{DSEC_SOURCE_DIR} + "/test/oci/token_server.py",
        dir / "token.key", dir / "token.crt", user, password, "dsec-registry", "dsec-issuer"});
      REQUIRE_MESSAGE(tokens->wait_for_output("\n"), tokens->err());
      auto tport = tokens->out().substr(tokens->out().find(' ') + 1);
      tport.resize(tport.find('\n'));
      cfg += "auth:\n  token:\n    realm: http://127.0.0.1:" + tport
             + "/token\n    service: dsec-registry\n    issuer: dsec-issuer\n    rootcertbundle: "
             + dir / "token.crt" + "\n";
    }
    if (!user.empty())
      creds = user + ":" + password;
    write_file(dir / "config.yml", cfg);
    write_file(dir / "policy.json", R"({"default":[{"type":"insecureAcceptAnything"}]})");
    proc = std::make_unique<background>(
      std::vector<std::string>{"/usr/bin/docker-registry", "serve", dir / "config.yml"});
    for (int i = 0; i < 200 && !port_open(port); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    REQUIRE_MESSAGE(port_open(port), (std::string{"docker-registry did not start: "} + proc->err()));
  }

  [[nodiscard]] std::string host() const { return "127.0.0.1:" + std::to_string(port); }

  // skopeo copy oci:LAYOUT:TAG docker://HOST/REPO:TAG
  void push(const std::string& layout, const std::string& tag, const std::string& repo,
            bool all = false) {
    std::vector<std::string> argv{"/usr/bin/skopeo", "--policy", dir / "policy.json", "copy",
                                  "--quiet", "--dest-tls-verify=false"};
    if (all)
      argv.push_back("--all");
    if (!creds.empty()) {
      argv.push_back("--dest-creds");
      argv.push_back(creds);
    }
    argv.push_back("oci:" + layout + ":" + tag);
    argv.push_back("docker://" + host() + "/" + repo);
    auto r = run_process(argv);
    REQUIRE_MESSAGE(r.status == 0, r.describe());
  }

  // The file the registry serves for blob `digest`.
  [[nodiscard]] std::string blob_file(const std::string& digest) const {
    auto hex = digest.substr(7);
    return dir / ("storage/docker/registry/v2/blobs/sha256/" + hex.substr(0, 2) + "/" + hex + "/data");
  }
};

// The HOST:PORT a dsecd started with --listen 127.0.0.1:0 says it listens on.
std::string address_of(background& d) {
  // Its first line may be another (a microvm backend's).
  REQUIRE_MESSAGE(d.wait_for_output(" (state "), d.err());
  auto addr = d.out().substr(d.out().find("listening on ") + 13);
  addr.resize(addr.find(' '));
  return addr;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    auto e = s.find(' ', i);
    out.push_back(s.substr(i, e == std::string::npos ? std::string::npos : e - i));
    if (e == std::string::npos)
      break;
    i = e + 1;
  }
  return out;
}


// put and get of sandbox `id` (through `remote`, a `dsec --connect` call) run
// as its root: a file copied into /data (root's, 0755), which the image's
// User cannot write, and back out.
template <class Remote>
void check_put_get_as_root(Remote& remote, const std::string& id, const temp_dir& work) {
  auto local = work / "hello.txt";
  write_file(local, "hello\n");
  auto r = remote({"cp", local, id + ":/data/"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  r = remote({"exec", id, "--", "sh", "-c", "cat /data/hello.txt; touch /data/mine || echo denied"});
  CHECK(r.out.find("hello\n") == 0);
  CHECK_MESSAGE(r.out.find("denied") != std::string::npos, r.describe());
  auto back = work / "back";
  fs::create_directories(back);
  r = remote({"cp", id + ":/data/hello.txt", back});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(read_file(back + "/hello.txt") == "hello\n");
}

// The Debian mirror this machine's apt uses (the first http URI of its sources
// that serves bookworm), for debootstrap; empty if none is found.
std::string debian_mirror() {
  std::vector<std::string> files{"/etc/apt/sources.list"};
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/etc/apt/sources.list.d", ec))
    files.push_back(e.path().string());
  for (const auto& f : files) {
    std::ifstream in(f);
    std::string uri;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("URIs:", 0) == 0) // deb822: URIs, then Suites
        uri = line.substr(line.find_first_not_of(' ', 5));
      else if (line.rfind("Suites:", 0) == 0 && line.find(" bookworm") != std::string::npos
               && uri.rfind("http://", 0) == 0 && uri.find("security") == std::string::npos)
        return uri.substr(0, uri.find(' '));
      else if (line.rfind("deb http://", 0) == 0 && line.find(" bookworm ") != std::string::npos)
        return line.substr(4, line.find(' ', 4) - 4);
    }
  }
  return {};
}

// Whether the mirror's host answers on port 80 within a few seconds (decided
// once, when the case registers: without it, the case is skipped).
bool mirror_reachable() {
  auto m = debian_mirror();
  if (m.empty())
    return false;
  auto host = m.substr(7, m.find('/', 7) - 7);
  auto r = run_process({"/usr/bin/timeout", "10", "/usr/bin/python3", "-c",
                        "import socket,sys; socket.create_connection((sys.argv[1], 80), 5)", host});
  return r.status == 0;
}
} // namespace

TEST_CASE("import oci: each image layer is a lower, whiteouts and opaque dirs merge as umoci "
          "unpacks them, a shared layer is one blob" * skip_unless(have("python3"), "needs python3")) {
  auto& s = suite::get();
  auto work = s.scratch();
  auto layout = work / "layout";
  make_layout(layout, json::array({
    {{"tag", "a"}, {"layers", json::array({busybox_layer(), lower_data(), upper_data()})}},
    {{"tag", "b"}, {"layers", json::array({busybox_layer(), lower_data(),
                                           layer(json::array({file("data/b-only", "b\n")}), "none")})}},
  }));

  auto before = blob_count();
  auto r = s.dsec({"layer", "import", "wh@1", "oci:" + layout + ":a"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out.find("3 layers (3 converted, 0 already stored), 3 lowers") != std::string::npos);
  CHECK(blob_count() == before + 3);
  auto a = lowers_of("wh@1");
  REQUIRE(a.size() == 3);

  // b shares a's two lowest layers: only its own top layer is new.
  r = s.dsec({"layer", "import", "wb@1", "oci:" + layout + ":b"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out.find("3 layers (1 converted, 2 already stored)") != std::string::npos);
  CHECK(blob_count() == before + 4);
  auto b = lowers_of("wb@1");
  REQUIRE(b.size() == 3);
  CHECK(b[1] == a[1]);
  CHECK(b[2] == a[2]);
  CHECK(b[0] != a[0]);

  // The merged tree, against umoci's unpacking of the same image.
  auto view = sandbox_view("wh@1");
  CHECK(view == "data/\ndata/added: added\ndata/dir/\ndata/dir/new: new\ndata/keep: kept\n"
                "data/linked: added\ndata/shadow -> /etc/shadow\n");
  if (have("umoci")) {
    auto u = run_process({"/usr/bin/umoci", "unpack", "--image", layout + ":a", work / "bundle"});
    REQUIRE_MESSAGE(u.status == 0, u.describe());
    CHECK(view == host_view(work / "bundle/rootfs"));
  }
  // The symbolic link to /etc/shadow is the image's, never the host's.
  r = s.run({"--base", "wh@1"}, {"cat", "/data/shadow"});
  CHECK(r.out == "the image's shadow\n");
  CHECK(sandbox_view("wb@1") == "data/\ndata/b-only: b\ndata/dir/\ndata/dir/old: old\n"
                                "data/gone: gone\ndata/gonedir/\ndata/gonedir/f: f\ndata/keep: kept\n");

  // Removing one image keeps the blobs the other still has.
  r = s.dsec({"layer", "rm", "wh@1"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(blob_count() == before + 3);
  CHECK(sandbox_view("wb@1").find("data/b-only: b") != std::string::npos);
  r = s.dsec({"layer", "rm", "wb@1"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(blob_count() == before);
}

TEST_CASE("import: the image config is kept, shown and honoured by dsec run, options win" *
          skip_unless(have("python3"), "needs python3")) {
  auto& s = suite::get();
  auto work = s.scratch();
  auto layout = work / "layout";
  json config = {{"Env", {"FOO=from-image", "PATH=/bin"}},
                 {"WorkingDir", "/data"},
                 {"User", "agent"},
                 {"Entrypoint", {"sh", "-c"}},
                 {"Cmd", {"echo $FOO; pwd; id -u; id -g"}}};
  make_layout(layout, json::array({{{"tag", "c"}, {"config", config},
                                    {"layers", json::array({busybox_layer(), lower_data()})}}}));
  auto r = s.dsec({"layer", "import", "cfg@1", "oci:" + layout + ":c"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  r = s.dsec({"layer", "inspect", "cfg@1"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out.find("\"WorkingDir\": \"/data\"") != std::string::npos);
  CHECK(r.out.find("\"FOO=from-image\"") != std::string::npos);
  CHECK(r.out.find("\"User\": \"agent\"") != std::string::npos);
  CHECK(r.out.find("lowers:   2") != std::string::npos);

  // No command: Entrypoint + Cmd, as the image's user, in its WorkingDir, with its Env.
  r = s.dsec({"run", "--base", "cfg@1"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "from-image\n/data\n1234\n1235\n");
  // Each option wins over the image's default.
  r = s.dsec({"run", "--base", "cfg@1", "--env", "FOO=given", "--cwd", "/", "--user", "7:8", "--",
              "sh", "-c", "echo $FOO; pwd; id -u; id -g"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "given\n/\n7\n8\n");
  s.dsec({"layer", "rm", "cfg@1"});
}

TEST_CASE("import: an entry escaping the root or written through a symbolic link is refused, and "
          "nothing is stored" * skip_unless(have("python3"), "needs python3")) {
  auto& s = suite::get();
  auto work = s.scratch();
  struct bad_case {
    const char* name;
    json entries;
    const char* message;
  } cases[] = {
    {"dotdot", json::array({file("../escape", "x")}), "escapes the image's root"},
    {"through", json::array({{{"name", "lnk"}, {"type", "symlink"}, {"target", "/tmp"}},
                             file("lnk/planted", "x")}),
     "lnk/planted"},
    {"whiteout-through", json::array({{{"name", "lnk"}, {"type", "symlink"}, {"target", "/tmp"}},
                                      file("lnk/.wh.victim", "")}),
     "not a directory of the layer"},
    {"hardlink-out", json::array({{{"name", "h"}, {"type", "hardlink"}, {"target", "../../etc/passwd"}}}),
     "escapes the image's root"},
    {"hardlink-missing", json::array({{{"name", "h"}, {"type", "hardlink"}, {"target", "etc/passwd"}}}),
     "which this layer does not have"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    auto layout = work / c.name;
    make_layout(layout, json::array({{{"tag", "x"}, {"layers", json::array({layer(c.entries)})}}}));
    auto snap = s.store_snapshot();
    auto r = s.dsec({"layer", "import", std::string{"bad-"} + c.name + "@1", "oci:" + layout + ":x"});
    CHECK(r.status == 1);
    CHECK_MESSAGE(r.err.find(c.message) != std::string::npos, r.err);
    CHECK(s.store_snapshot() == snap);
    CHECK(!fs::exists("/tmp/planted"));
  }
}

TEST_CASE("import: past --max-lowers the lowest layers are flattened into one, merged right" *
          skip_unless(have("python3"), "needs python3")) {
  auto& s = suite::get();
  auto work = s.scratch();
  auto layout = work / "layout";
  make_layout(layout, json::array({{{"tag", "f"}, {"layers", json::array({
    busybox_layer(), lower_data(),
    layer(json::array({file("data/.wh.keep", ""), file("data/third", "3\n")})),
    layer(json::array({file("data/dir/.wh..wh..opq", ""), file("data/dir/fourth", "4\n")})),
    layer(json::array({file("data/fifth", "5\n")})),
  })}}}));
  auto r = s.dsec({"layer", "import", "--max-lowers", "2", "flat@1", "oci:" + layout + ":f"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out.find("4 flattened") != std::string::npos);
  CHECK(lowers_of("flat@1").size() == 2);
  CHECK(sandbox_view("flat@1")
        == "data/\ndata/dir/\ndata/dir/fourth: 4\ndata/fifth: 5\ndata/gone: gone\n"
           "data/gonedir/\ndata/gonedir/f: f\ndata/third: 3\n");
  // The same image unflattened sees the same tree.
  r = s.dsec({"layer", "import", "unflat@1", "oci:" + layout + ":f"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(lowers_of("unflat@1").size() == 5);
  CHECK(sandbox_view("unflat@1") == sandbox_view("flat@1"));
  s.dsec({"layer", "rm", "flat@1"});
  s.dsec({"layer", "rm", "unflat@1"});
}

TEST_CASE("import docker-archive: skopeo's docker-archive of an image" *
          skip_unless(have_registry_tools(), "needs skopeo and python3")) {
  auto& s = suite::get();
  auto work = s.scratch();
  auto layout = work / "layout";
  make_layout(layout, json::array({{{"tag", "d"},
                                    {"layers", json::array({busybox_layer(), lower_data(), upper_data()})}}}));
  write_file(work / "policy.json", R"({"default":[{"type":"insecureAcceptAnything"}]})");
  auto r = run_process({"/usr/bin/skopeo", "--policy", work / "policy.json", "copy", "--quiet",
                        "oci:" + layout + ":d", "docker-archive:" + work / "d.tar"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  r = s.dsec({"layer", "import", "da@1", "docker-archive:" + work / "d.tar"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(lowers_of("da@1").size() == 3);
  CHECK(sandbox_view("da@1") == "data/\ndata/added: added\ndata/dir/\ndata/dir/new: new\n"
                                "data/keep: kept\ndata/linked: added\ndata/shadow -> /etc/shadow\n");
  s.dsec({"layer", "rm", "da@1"});
}

TEST_CASE("pull from a registry on loopback: shared layers fetched and stored once, a multi-arch "
          "index, an unknown reference" *
          skip_unless(have_registry_tools(), "needs docker-registry, skopeo and python3")) {
  auto& s = suite::get();
  auto work = s.scratch();
  registry reg;
  auto layout = work / "layout";
  auto lines = make_layout(layout, json::array({
    {{"tag", "a"}, {"layers", json::array({busybox_layer(), lower_data(), upper_data()})}},
    {{"tag", "b"}, {"layers", json::array({busybox_layer(), lower_data(),
                                           layer(json::array({file("data/b-only", "b\n")}))})}},
    {{"tag", "multi"}, {"platform", "linux/amd64"},
     {"layers", json::array({busybox_layer(), layer(json::array({dir("data"), file("data/arch", "amd64\n")}))})}},
    {{"tag", "multi"}, {"platform", "linux/arm64"},
     {"layers", json::array({busybox_layer(), layer(json::array({dir("data"), file("data/arch", "arm64\n")}))})}},
  }));
  reg.push(layout, "a", "test/img:a");
  reg.push(layout, "b", "test/img:b");
  reg.push(layout, "multi", "test/multi:1", true);

  auto before = blob_count();
  auto r = s.dsec({"layer", "pull", "--as", "pa@1", "http://" + reg.host() + "/test/img:a"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out.find("3 blobs fetched") != std::string::npos);
  CHECK(blob_count() == before + 3);
  CHECK(sandbox_view("pa@1") == "data/\ndata/added: added\ndata/dir/\ndata/dir/new: new\n"
                                "data/keep: kept\ndata/linked: added\ndata/shadow -> /etc/shadow\n");
  // b shares two layers: they are neither fetched nor stored again.
  r = s.dsec({"layer", "pull", "--as", "pb@1", "http://" + reg.host() + "/test/img:b"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out.find("1 blobs fetched") != std::string::npos);
  CHECK(r.out.find("2 already stored") != std::string::npos);
  CHECK(blob_count() == before + 4);
  CHECK(lowers_of("pb@1")[2] == lowers_of("pa@1")[2]);
  // The downloads are gone once the images are made.
  CHECK(fs::is_empty(s.state() + "/oci/downloads"));

  // A multi-arch index: linux/amd64 by default, --platform for another, a clear
  // error for one it lacks.
  r = s.dsec({"layer", "pull", "--as", "m@amd", "http://" + reg.host() + "/test/multi:1"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(s.run({"--base", "m@amd"}, {"cat", "/data/arch"}).out == "amd64\n");
  r = s.dsec({"layer", "pull", "--platform", "linux/arm64", "--as", "m@arm",
              "http://" + reg.host() + "/test/multi:1"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(s.run({"--base", "m@arm"}, {"cat", "/data/arch"}).out == "arm64\n");
  auto snap = s.store_snapshot();
  r = s.dsec({"layer", "pull", "--platform", "linux/s390x", "--as", "m@s390",
              "http://" + reg.host() + "/test/multi:1"});
  CHECK(r.status == 1);
  CHECK_MESSAGE(r.err.find("no image for platform linux/s390x (it has: linux/amd64, linux/arm64)")
                  != std::string::npos, r.err);

  // Unknown references.
  r = s.dsec({"layer", "pull", "--as", "u@1", "http://" + reg.host() + "/test/img:nope"});
  CHECK(r.status == 1);
  CHECK_MESSAGE(r.err.find("unknown image reference") != std::string::npos, r.err);
  r = s.dsec({"layer", "pull", "--as", "u@1", "http://" + reg.host() + "/test/absent:1"});
  CHECK(r.status == 1);
  CHECK_MESSAGE(r.err.find("unknown image reference") != std::string::npos, r.err);
  CHECK(s.store_snapshot() == snap);

  // Plain http only for loopback.
  r = s.dsec({"layer", "pull", "--as", "u@1", "http://registry.example.com/test/img:a"});
  CHECK(r.status == 2);
  CHECK_MESSAGE(r.err.find("only for a loopback registry") != std::string::npos, r.err);

  for (const char* l : {"pa@1", "pb@1", "m@amd", "m@arm"})
    s.dsec({"layer", "rm", l});
  CHECK(blob_count() == before);
}

TEST_CASE("pull: a corrupt blob stores nothing; the next pull reuses the layers already fetched" *
          skip_unless(have_registry_tools(), "needs docker-registry, skopeo and python3")) {
  auto& s = suite::get();
  auto work = s.scratch();
  registry reg;
  auto layout = work / "layout";
  auto lines = make_layout(layout, json::array({
    {{"tag", "c"}, {"layers", json::array({busybox_layer("corrupt"),
                                           layer(json::array({dir("data"), file("data/mid", "mid\n")})),
                                           layer(json::array({file("data/top", "top\n")}))})}}}));
  REQUIRE(lines.size() == 1);
  auto words = split(lines[0]); // TAG PLATFORM MANIFEST LAYER...
  REQUIRE(words.size() == 6);
  reg.push(layout, "c", "test/corrupt:c");

  // The registry serves other bytes for the top layer.
  auto blob = reg.blob_file(words[5]);
  REQUIRE(fs::exists(blob));
  auto good = read_file(blob);
  auto bad = good;
  bad[bad.size() / 2] ^= 0x55;
  write_file(blob, bad);

  auto snap = s.store_snapshot();
  auto r = s.dsec({"layer", "pull", "--as", "corrupt@1", "http://" + reg.host() + "/test/corrupt:c"});
  CHECK(r.status == 1);
  CHECK_MESSAGE(r.err.find("digest mismatch for layer " + words[5]) != std::string::npos, r.err);
  CHECK_MESSAGE(r.err.find("nothing stored") != std::string::npos, r.err);
  CHECK(s.store_snapshot() == snap);
  // The two good layers are kept as downloads; the corrupt one is not.
  std::set<std::string> kept;
  for (const auto& e : fs::directory_iterator(s.state() + "/oci/downloads"))
    kept.insert("sha256:" + e.path().filename().string());
  CHECK(kept == std::set<std::string>{words[3], words[4]});

  // Fixed: the pull fetches only the missing layer. (A pull killed mid-layer
  // left a .part file: its pid is above any pid_max, so it is gone.)
  write_file(blob, good);
  write_file(s.state() + "/oci/downloads/" + words[5].substr(7) + ".part-4194305", "partial");
  r = s.dsec({"layer", "pull", "--as", "corrupt@1", "http://" + reg.host() + "/test/corrupt:c"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out.find("1 blobs fetched") != std::string::npos);
  CHECK(r.out.find("2 from an earlier pull") != std::string::npos);
  CHECK(s.run({"--base", "corrupt@1"}, {"cat", "/data/top"}).out == "top\n");
  CHECK(fs::is_empty(s.state() + "/oci/downloads"));
  s.dsec({"layer", "rm", "corrupt@1"});
}

TEST_CASE("pull: a registry with htpasswd auth refuses missing and wrong credentials" *
          skip_unless(have_registry_tools() && have("htpasswd"),
                      "needs docker-registry, skopeo, python3 and htpasswd")) {
  auto& s = suite::get();
  auto work = s.scratch();
  registry reg{"alice", "s3cret"};
  auto layout = work / "layout";
  make_layout(layout, json::array({{{"tag", "p"}, {"layers", json::array({busybox_layer(), lower_data()})}}}));
  reg.push(layout, "p", "private/img:p");
  auto url = "http://" + reg.host() + "/private/img:p";
  auto snap = s.store_snapshot();

  auto r = s.dsec({"layer", "pull", "--as", "priv@1", url});
  CHECK(r.status == 1);
  CHECK_MESSAGE(r.err.find("wants credentials") != std::string::npos, r.err);
  r = s.dsec({"layer", "pull", "--as", "priv@1", "--creds", "alice:wrong", url});
  CHECK(r.status == 1);
  CHECK_MESSAGE(r.err.find("refused the credentials") != std::string::npos, r.err);
  CHECK(s.store_snapshot() == snap);

  r = s.dsec({"layer", "pull", "--as", "priv@1", "--creds", "alice:s3cret", url});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(s.run({"--base", "priv@1"}, {"cat", "/data/keep"}).out == "kept\n");
  s.dsec({"layer", "rm", "priv@1"});
}

TEST_CASE("pull: a registry with bearer tokens (its token service checks the credentials)" *
          skip_unless(have_registry_tools() && have("openssl"),
                      "needs docker-registry, skopeo, python3 (with cryptography) and openssl")) {
  auto& s = suite::get();
  auto work = s.scratch();
  registry reg{"bob", "t0ken-pass", true};
  auto layout = work / "layout";
  make_layout(layout, json::array({{{"tag", "t"}, {"layers", json::array({busybox_layer(), lower_data()})}}}));
  reg.push(layout, "t", "private/tok:t");
  auto url = "http://" + reg.host() + "/private/tok:t";
  auto snap = s.store_snapshot();

  auto r = s.dsec({"layer", "pull", "--as", "tok@1", url});
  CHECK(r.status == 1);
  CHECK_MESSAGE(r.err.find("refused the credentials (none were given") != std::string::npos, r.err);
  r = s.dsec({"layer", "pull", "--as", "tok@1", "--creds", "bob:wrong", url});
  CHECK(r.status == 1);
  CHECK_MESSAGE(r.err.find("refused the credentials of bob") != std::string::npos, r.err);
  CHECK(s.store_snapshot() == snap);

  // $DSEC_REGISTRY_CREDS works as --creds does.
  r = s.dsec({"layer", "pull", "--as", "tok@1", url},
             spawn_options{.in_child = [] { ::setenv("DSEC_REGISTRY_CREDS", "bob:t0ken-pass", 1); }});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(s.run({"--base", "tok@1"}, {"cat", "/data/keep"}).out == "kept\n");
  s.dsec({"layer", "rm", "tok@1"});
}

TEST_CASE("a daemon mounts each image layer once for every sandbox of every image that has it" *
          skip_unless(have("python3"), "needs python3")) {
  auto& s = suite::get();
  auto work = s.scratch();
  auto layout = work / "layout";
  make_layout(layout, json::array({
    {{"tag", "a"}, {"layers", json::array({busybox_layer("daemon"), lower_data(), upper_data()})}},
    {{"tag", "b"}, {"layers", json::array({busybox_layer("daemon"), lower_data(),
                                           layer(json::array({file("data/b-only", "b\n")}))})}},
  }));
  for (auto [ref, tag] : {std::pair{"da@1", "a"}, std::pair{"db@1", "b"}}) {
    auto r = s.dsec({"layer", "import", ref, "oci:" + layout + ":" + tag});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
  }
  background daemon{{env_path("DSECD_BIN"), "--listen", "127.0.0.1:0", "--state", s.state(),
                     "--slots", "8"}};
  auto addr = address_of(daemon);
  auto mounted = [&] {
    auto r = s.dsec({"--connect", addr, "node", "stats"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    auto at = r.out.find("layers mounted");
    REQUIRE(at != std::string::npos);
    return std::stoi(r.out.substr(r.out.find_first_of("0123456789", at)));
  };
  std::vector<std::string> ids;
  for (const char* base : {"da@1", "da@1", "db@1"}) {
    auto r = s.dsec({"--connect", addr, "run", "--detach", "--base", base, "--", "sleep", "600"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    ids.push_back(lines_of(r.out).at(0));
  }
  // da has 3 lowers, db 3 of which 2 are da's: 4 mounts for 3 sandboxes.
  CHECK(mounted() == 4);
  auto r = s.dsec({"--connect", addr, "exec", ids[0], "--", "sh", "-c",
                   "cat /data/added /data/keep; test -e /data/gone || echo no-gone"});
  CHECK(r.out == "added\nkept\nno-gone\n");
  r = s.dsec({"--connect", addr, "exec", ids[2], "--", "cat", "/data/b-only", "/data/gone"});
  CHECK(r.out == "b\ngone\n");
  for (const auto& id : ids)
    s.dsec({"--connect", addr, "rm", id});
  daemon.kill(SIGTERM);
  daemon.wait();
  s.dsec({"layer", "rm", "da@1"});
  s.dsec({"layer", "rm", "db@1"});
}

TEST_CASE("a daemon's sandboxes take the image config: Entrypoint + Cmd, Env, WorkingDir, User "
          "by name; options win; put and get stay root" *
          skip_unless(have("python3"), "needs python3")) {
  auto& s = suite::get();
  auto work = s.scratch();
  auto layout = work / "layout";
  json config = {{"Env", {"FOO=from-image"}},
                 {"WorkingDir", "data"},
                 {"User", "agent"},
                 {"Entrypoint", {"sh", "-c"}},
                 {"Cmd", {"echo $FOO; pwd; id -u; id -g; echo $HOME"}}};
  make_layout(layout, json::array({
    {{"tag", "c"}, {"config", config},
     {"layers", json::array({busybox_layer("config"), lower_data()})}},
    {{"tag", "ghost"}, {"config", {{"User", "ghost"}}},
     {"layers", json::array({busybox_layer("config"), lower_data()})}},
    {{"tag", "plain"}, {"layers", json::array({busybox_layer("config"), lower_data()})}},
  }));
  for (auto [ref, tag] : {std::pair{"dcfg@1", "c"}, std::pair{"dghost@1", "ghost"},
                          std::pair{"dplain@1", "plain"}}) {
    auto r = s.dsec({"layer", "import", ref, "oci:" + layout + ":" + tag});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
  }
  background daemon{{env_path("DSECD_BIN"), "--listen", "127.0.0.1:0", "--state", s.state(),
                     "--slots", "8"}};
  auto addr = address_of(daemon);
  auto remote = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--connect", addr});
    return s.dsec(args);
  };

  // No command: the image's Entrypoint + Cmd, as its user (by name, from its
  // /etc/passwd, whose entry gives HOME), in its WorkingDir, with its Env.
  auto r = remote({"run", "--base", "dcfg@1"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "from-image\n/data\n1234\n1235\n/home\n");
  // Each option wins over the image's default.
  r = remote({"run", "--base", "dcfg@1", "--env", "FOO=given", "--cwd", "/", "--user", "7:8", "--",
              "sh", "-c", "echo $FOO; pwd; id -u; id -g"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "given\n/\n7\n8\n");

  // exec in a detached sandbox takes the same defaults.
  r = remote({"run", "--detach", "--base", "dcfg@1", "--", "sleep", "600"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto id = lines_of(r.out).at(0);
  r = remote({"exec", id, "--", "sh", "-c", "pwd; id -u"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "/data\n1234\n");
  r = remote({"exec", "--user", "0", id, "--", "id", "-u"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "0\n");
  // put and get run as the sandbox's root: /data is root's (0755), which the
  // image's user could not write.
  check_put_get_as_root(remote, id, work);
  remote({"rm", id});

  // A User the image cannot resolve fails the commands that take it, naming it.
  r = remote({"run", "--base", "dghost@1", "--", "id", "-u"});
  CHECK(r.status != 0);
  CHECK_MESSAGE(r.err.find("the image's User 'ghost'") != std::string::npos, r.describe());
  r = remote({"run", "--base", "dghost@1", "--user", "0", "--", "id", "-u"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "0\n");
  // A user by name, too, is the caller's: the image's broken User does not apply.
  r = remote({"run", "--base", "dghost@1", "--user", "root", "--", "id", "-u"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "0\n");
  // No command and none in the image.
  r = remote({"run", "--base", "dplain@1"});
  CHECK(r.status != 0);
  CHECK_MESSAGE(r.err.find("has no Entrypoint or Cmd") != std::string::npos, r.describe());
  // An image without a config: dsec's defaults, as before.
  r = remote({"run", "--base", "dplain@1", "--", "sh", "-c", "pwd; id -u; echo $HOME"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "/\n0\n/root\n");

  daemon.kill(SIGTERM);
  daemon.wait();
  for (const char* ref : {"dcfg@1", "dghost@1", "dplain@1"})
    s.dsec({"layer", "rm", ref});
}

TEST_CASE("a microVM takes the image config as a container does: Entrypoint + Cmd, Env, "
          "WorkingDir, User by name; options and --user win; put and get stay root" *
          skip_unless(have("python3") && have_microvm_guest(),
                      "needs python3, qemu and the microVM guest (tools/microvm-guest)")) {
  auto& s = suite::get();
  auto work = s.scratch();
  auto layout = work / "layout";
  json config = {{"Env", {"FOO=from-image"}},
                 {"WorkingDir", "data"},
                 {"User", "agent"},
                 {"Entrypoint", {"sh", "-c"}},
                 {"Cmd", {"echo $FOO; pwd; id -u; id -g; echo $HOME"}}};
  make_layout(layout, json::array({{{"tag", "c"}, {"config", config},
                                    {"layers", json::array({busybox_layer("vm"), lower_data()})}}}));
  auto r = s.dsec({"layer", "import", "vmcfg@1", "oci:" + layout + ":c"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  background daemon{{env_path("DSECD_BIN"), "--listen", "127.0.0.1:0", "--state", s.state(),
                     "--slots", "4", "--microvm-slots", "2", "--microvm-guest",
                     microvm_guest_dir()}};
  auto addr = address_of(daemon);
  auto remote = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--connect", addr});
    spawn_options slow;
    slow.kill_after = std::chrono::seconds(600); // a boot under TCG on a busy machine
    return s.dsec(args, slow);
  };

  // No command: the image's, as its user (by name: the host read the image's
  // /etc/passwd), in its WorkingDir, with its Env, inside the VM.
  r = remote({"run", "--backend", "microvm", "--base", "vmcfg@1"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "from-image\n/data\n1234\n1235\n/home\n");

  r = remote({"run", "--detach", "--backend", "microvm", "--base", "vmcfg@1", "--", "sleep",
              "600"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto id = lines_of(r.out).at(0);
  r = remote({"exec", id, "--", "sh", "-c", "pwd; id -u; echo $FOO"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "/data\n1234\nfrom-image\n");
  // Each option wins over the image's default.
  r = remote({"exec", "--env", "FOO=given", "--cwd", "/", "--user", "7:8", id, "--", "sh", "-c",
              "echo $FOO; pwd; id -u; id -g"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "given\n/\n7\n8\n");
  r = remote({"exec", "--user", "root", id, "--", "sh", "-c", "id -u; echo $HOME"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "0\n/root\n");
  // A user the image does not have is refused, naming it.
  r = remote({"exec", "--user", "nobody-here", id, "--", "id", "-u"});
  CHECK(r.status != 0);
  CHECK_MESSAGE(r.err.find("nobody-here") != std::string::npos, r.describe());
  // put and get as the VM's root: /data is root's (0755), which the image's
  // user cannot write.
  check_put_get_as_root(remote, id, work);
  r = remote({"rm", id});
  CHECK_MESSAGE(r.status == 0, r.describe());

  daemon.kill(SIGTERM);
  auto end = daemon.wait();
  CHECK_MESSAGE(end.status == 0, end.describe());
  s.dsec({"layer", "rm", "vmcfg@1"});
}

TEST_CASE("a microVM of an image with more layers than it has disk slots: the lowest merged into "
          "one disk, made once per node and shared, whiteouts kept; removed when the node stops" *
          skip_unless(have("python3") && have_microvm_guest(),
                      "needs python3, qemu and the microVM guest (tools/microvm-guest)")) {
  auto& s = suite::get();
  auto work = s.scratch();
  auto layout = work / "layout";
  // 10 layers: busybox, then data/l1..l9; l2 has a file that l9 whites out,
  // l3 a directory that l8 makes opaque.
  json layers = json::array({busybox_layer("many")});
  for (int i = 1; i <= 9; ++i) {
    auto n = std::to_string(i);
    json e = json::array({dir("data"), file("data/l" + n, "layer " + n + "\n")});
    if (i == 2)
      e.push_back(file("data/gone", "gone\n"));
    if (i == 3) {
      e.push_back(dir("data/d"));
      e.push_back(file("data/d/old", "old\n"));
    }
    if (i == 8) {
      e.push_back(dir("data/d"));
      e.push_back(file("data/d/.wh..wh..opq", ""));
      e.push_back(file("data/d/new", "new\n"));
    }
    if (i == 9)
      e.push_back(file("data/.wh.gone", ""));
    layers.push_back(layer(e));
  }
  make_layout(layout, json::array({{{"tag", "m"}, {"layers", layers}}}));
  auto r = s.dsec({"layer", "import", "vmmany@1", "oci:" + layout + ":m"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  REQUIRE(lowers_of("vmmany@1").size() == 10);
  const std::string expected = "data/\ndata/d/\ndata/d/new: new\n"
                               "data/l1: layer 1\ndata/l2: layer 2\ndata/l3: layer 3\n"
                               "data/l4: layer 4\ndata/l5: layer 5\ndata/l6: layer 6\n"
                               "data/l7: layer 7\ndata/l8: layer 8\ndata/l9: layer 9\n";
  CHECK(sandbox_view("vmmany@1") == expected); // a container sees the 10 lowers

  background daemon{{env_path("DSECD_BIN"), "--listen", "127.0.0.1:0", "--state", s.state(),
                     "--slots", "4", "--microvm-slots", "2", "--microvm-guest",
                     microvm_guest_dir()}};
  auto addr = address_of(daemon);
  auto merged = [&] { // the merged images this daemon made
    size_t n = 0;
    std::error_code ec;
    for (const auto& owner : fs::directory_iterator(s.state() + "/microvm-disks", ec))
      for (const auto& f : fs::directory_iterator(owner.path()))
        n += f.path().extension() == ".erofs" ? 1 : 0;
    return n;
  };
  const std::string listing =
    "cd / && find data | sort | while read p; do if test -d \"$p\"; then echo \"$p/\"; "
    "else echo \"$p: $(cat \"$p\")\"; fi; done";
  spawn_options slow;
  slow.kill_after = std::chrono::seconds(600);
  for (int round = 0; round < 2; ++round) {
    r = s.dsec({"--connect", addr, "run", "--backend", "microvm", "--base", "vmmany@1", "--", "sh",
                "-c", listing},
               slow);
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == expected);
    CHECK(merged() == 1); // made by the first VM, used again by the second
  }
  // A killed node leaves its merged disk; the next one removes it at its start.
  daemon.kill(SIGKILL);
  daemon.wait();
  CHECK(merged() == 1);
  background again{{env_path("DSECD_BIN"), "--listen", "127.0.0.1:0", "--state", s.state(),
                    "--slots", "4", "--microvm-slots", "2", "--microvm-guest",
                    microvm_guest_dir()}};
  CHECK_MESSAGE(again.wait_for_output("merged microVM disks left by a dsec that is gone"),
                again.out());
  CHECK(merged() == 0);
  // One it made is removed when it stops.
  r = s.dsec({"--connect", address_of(again), "run", "--backend", "microvm", "--base",
              "vmmany@1", "--", "cat", "/data/l1"},
             slow);
  CHECK(r.out == "layer 1\n");
  CHECK(merged() == 1);
  again.kill(SIGTERM);
  auto end = again.wait();
  CHECK_MESSAGE(end.status == 0, end.describe());
  CHECK(merged() == 0);
  s.dsec({"layer", "rm", "vmmany@1"});
}

TEST_CASE("a cluster node fetches an image from its coordinator: each lower once, shared ones "
          "not again, with the config" * skip_unless(have("python3"), "needs python3")) {
  auto& s = suite::get();
  auto work = s.scratch();
  auto layout = work / "layout";
  json config = {{"Env", {"FOO=from-image"}}, {"WorkingDir", "/data"}};
  make_layout(layout, json::array({
    {{"tag", "a"}, {"config", config},
     {"layers", json::array({busybox_layer("cluster"), lower_data(), upper_data()})}},
    {{"tag", "b"}, {"layers", json::array({busybox_layer("cluster"), lower_data(),
                                           layer(json::array({file("data/b-only", "b\n")}))})}},
  }));
  for (auto [ref, tag] : {std::pair{"ca@1", "a"}, std::pair{"cb@1", "b"}}) {
    auto r = s.dsec({"layer", "import", ref, "oci:" + layout + ":" + tag});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
  }
  auto local_a = sandbox_view("ca@1");
  auto local_b = sandbox_view("cb@1");
  // A coordinator over the suite's store that runs nothing itself (--slots 0),
  // and a node with an empty store of its own: every sandbox goes to the node,
  // which fetches the images' lowers from the coordinator.
  auto key = work / "cluster.key";
  write_file(key, std::string(64, 'c') + "\n");
  REQUIRE(::chmod(key.c_str(), 0600) == 0);
  fs::path node_state = work / "node-state";
  fs::create_directories(node_state);
  background coord{{env_path("DSECD_BIN"), "--coordinator", "--listen", "127.0.0.1:0", "--state",
                    s.state(), "--slots", "0", "--cluster-key", key}};
  auto addr = address_of(coord);
  background node{{env_path("DSECD_BIN"), "--join", addr, "--listen", "127.0.0.1:0", "--state",
                   node_state, "--cluster-key", key}};
  REQUIRE_MESSAGE(node.wait_for_output("joined the cluster"), node.out() << node.err());
  auto node_blobs = [&] {
    std::set<std::string> out;
    if (fs::exists(node_state / "blobs/sha256"))
      for (const auto& e : fs::directory_iterator(node_state / "blobs/sha256"))
        out.insert("sha256:" + e.path().filename().string());
    return out;
  };
  auto view = [&](const std::string& base) {
    auto r = s.dsec({"--connect", addr, "run", "--base", base, "--", "sh", "-c",
                     "cd / && find data | sort | while read p; do if test -L \"$p\"; then echo "
                     "\"$p -> $(readlink \"$p\")\"; elif test -d \"$p\"; then echo \"$p/\"; else "
                     "echo \"$p: $(cat \"$p\")\"; fi; done"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    return r.out;
  };
  auto a = lowers_of("ca@1"), b = lowers_of("cb@1");
  REQUIRE(a.size() == 3);
  REQUIRE(b.size() == 3);
  CHECK(view("ca@1") == local_a);
  // The config came along: the node's sandbox takes its Env and WorkingDir.
  {
    auto r = s.dsec({"--connect", addr, "run", "--base", "ca@1", "--", "sh", "-c", "echo $FOO; pwd"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == "from-image\n/data\n");
  }
  // The node stored exactly a's three lowers, and the image as the coordinator has it.
  CHECK(node_blobs() == std::set<std::string>(a.begin(), a.end()));
  auto inspect = run_process({env_path("DSEC_BIN"), "--state", node_state, "layer", "inspect",
                               "ca@1"});
  REQUIRE_MESSAGE(inspect.status == 0, inspect.describe());
  for (const auto& d : a)
    CHECK_MESSAGE(inspect.out.find(d) != std::string::npos, inspect.out);
  CHECK_MESSAGE(inspect.out.find("FOO=from-image") != std::string::npos, inspect.out);
  CHECK_MESSAGE(inspect.out.find("/data") != std::string::npos, inspect.out);
  // b shares a's two lowest layers: only its top one is fetched.
  CHECK(view("cb@1") == local_b);
  auto all = node_blobs();
  CHECK(all.size() == 4);
  CHECK(all.count(b[0]) == 1);
  // A second sandbox of a fetches nothing more.
  CHECK(view("ca@1") == local_a);
  CHECK(node_blobs().size() == 4);

  node.kill(SIGTERM);
  auto nend = node.wait();
  CHECK_MESSAGE(nend.status == 0, nend.describe());
  coord.kill(SIGTERM);
  auto cend = coord.wait();
  CHECK_MESSAGE(cend.status == 0, cend.describe());
  s.dsec({"layer", "rm", "ca@1"});
  s.dsec({"layer", "rm", "cb@1"});
}

TEST_CASE("a real Debian: a bookworm minbase tree made by debootstrap, pushed as an image, "
          "pulled; CPython's own test modules pass in a sandbox from it" *
          skip_unless(have("debootstrap") && have_registry_tools() && mirror_reachable(),
                      "needs debootstrap, docker-registry, skopeo, python3 and the apt mirror "
                      "of this machine reachable")) {
  auto& s = suite::get();
  auto work = s.scratch();
  auto root = work / "root";
  // From the mirror apt itself uses: Debian's packages, nothing else.
  spawn_options slow;
  slow.kill_after = std::chrono::seconds(900);
  auto r = run_process({"/usr/sbin/debootstrap", "--variant=minbase",
                        "--include=python3,libpython3.11-testsuite", "bookworm", root,
                        debian_mirror()},
                       slow);
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  for (const auto& e : fs::directory_iterator(root + "/var/cache/apt/archives"))
    if (e.path().extension() == ".deb")
      fs::remove(e.path());
  auto layout = work / "layout";
  make_layout(layout, json::array({{{"tag", "bookworm"},
                                    {"config", {{"Env", {"PATH=/usr/local/sbin:/usr/local/bin:"
                                                         "/usr/sbin:/usr/bin:/sbin:/bin"}},
                                                {"WorkingDir", "/root"},
                                                {"Cmd", {"/bin/bash"}}}},
                                    {"layers", json::array({{{"compress", "none"},
                                                             {"tree", root}}})}}}));
  registry reg;
  reg.push(layout, "bookworm", "debian:bookworm");
  r = s.dsec({"layer", "pull", "--as", "deb@12", "http://" + reg.host() + "/debian:bookworm"},
             slow);
  REQUIRE_MESSAGE(r.status == 0, r.describe());

  r = s.run({"--base", "deb@12"}, {"sh", "-c", "cat /etc/debian_version; pwd; dpkg-query -W "
                                               "-f '${Status}\\n' python3"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK_MESSAGE(r.out.rfind("12.", 0) == 0, r.describe());
  CHECK_MESSAGE(r.out.find("\n/root\ninstall ok installed\n") != std::string::npos, r.describe());
  // The interpreter and the standard library of the image, under its own tests.
  r = s.run({"--base", "deb@12"}, {"python3", "-m", "test", "test_json", "test_re"}, slow);
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK_MESSAGE(r.out.find("Tests result: SUCCESS") != std::string::npos, r.describe());
  s.dsec({"layer", "rm", "deb@12"});
}

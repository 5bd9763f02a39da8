#include "runtime/image_config.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "runtime/fd.hpp"

using namespace dsec;
namespace fs = std::filesystem;

namespace {

const std::string passwd = "root:x:0:0:root:/root:/bin/sh\n"
                           "agent:x:1234:1235:An agent:/home/agent:/bin/sh\n"
                           "odd:x:70000:1::/:/bin/sh\n";

bool has(const std::vector<std::string>& env, const std::string& kv) {
  return std::find(env.begin(), env.end(), kv) != env.end();
}

size_t count_key(const std::vector<std::string>& env, const std::string& key) {
  return std::count_if(env.begin(), env.end(),
                       [&](const std::string& e) { return e.rfind(key + "=", 0) == 0; });
}

} // namespace

TEST_CASE("an image's User: a number, UID:GID, a name from its passwd, NAME:GID") {
  auto u = resolve_image_user("1000", std::nullopt);
  REQUIRE(u);
  CHECK(u->uid == 1000);
  CHECK(u->gid == 1000);
  CHECK(u->home.empty());
  u = resolve_image_user("7:8", std::nullopt);
  REQUIRE(u);
  CHECK(u->uid == 7);
  CHECK(u->gid == 8);
  u = resolve_image_user("agent", passwd);
  REQUIRE(u);
  CHECK(u->uid == 1234);
  CHECK(u->gid == 1235);
  CHECK(u->home == "/home/agent");
  u = resolve_image_user("agent:0", passwd);
  REQUIRE(u);
  CHECK(u->uid == 1234);
  CHECK(u->gid == 0);
}

TEST_CASE("an image's User that cannot be resolved is an error that quotes it") {
  auto e = resolve_image_user("nobody", passwd);
  REQUIRE_FALSE(e);
  CHECK(e.error_value().code == errc::invalid_argument);
  CHECK(e.error_value().message.find("'nobody'") != std::string::npos);
  CHECK(e.error_value().message.find("/etc/passwd") != std::string::npos);
  e = resolve_image_user("agent", std::nullopt);
  REQUIRE_FALSE(e);
  CHECK(e.error_value().message.find("has no /etc/passwd") != std::string::npos);
  e = resolve_image_user("agent:staff", passwd);
  REQUIRE_FALSE(e);
  CHECK(e.error_value().message.find("group that is not a number") != std::string::npos);
  CHECK_FALSE(resolve_image_user("70000", std::nullopt));
  CHECK_FALSE(resolve_image_user("odd", passwd)); // its uid is out of range
  CHECK_FALSE(resolve_image_user(":5", passwd));
  CHECK_FALSE(resolve_image_user("-1", passwd));
}

TEST_CASE("command defaults: Entrypoint + Cmd, Env over dsec's, WorkingDir made absolute, "
          "HOME from the User's entry") {
  image_config c;
  c.env = {"FOO=bar", "PATH=/opt/bin:/bin", "=bad", "novalue"};
  c.working_dir = "app";
  c.user = "agent";
  c.entrypoint = {"python3", "-u"};
  c.cmd = {"main.py"};
  int asked = 0;
  auto d = command_defaults::of(c.to_json(), [&] {
    ++asked;
    return std::optional<std::string>{passwd};
  });
  REQUIRE(d);
  CHECK(asked == 1);
  CHECK(d->argv == std::vector<std::string>{"python3", "-u", "main.py"});
  CHECK(d->cwd == "/app");
  REQUIRE(d->user);
  CHECK(d->user->uid == 1234);
  CHECK(has(d->env, "FOO=bar"));
  CHECK(has(d->env, "PATH=/opt/bin:/bin"));
  CHECK(count_key(d->env, "PATH") == 1);
  CHECK(has(d->env, "HOME=/home/agent"));
  CHECK(count_key(d->env, "HOME") == 1);
  CHECK(has(d->env, "LANG=C.UTF-8"));
  CHECK_FALSE(has(d->env, "=bad"));
  CHECK_FALSE(has(d->env, "novalue"));
  CHECK_FALSE(d->user_error);

  // A numeric User never reads the passwd; an image's HOME wins over its entry's.
  c.user = "5";
  c.env = {"HOME=/srv"};
  asked = 0;
  d = command_defaults::of(c.to_json(), [&] {
    ++asked;
    return std::optional<std::string>{passwd};
  });
  REQUIRE(d);
  CHECK(asked == 0);
  CHECK(d->user->uid == 5);
  CHECK(has(d->env, "HOME=/srv"));
}

TEST_CASE("command defaults without a config are dsec's; a bad User is kept as the error") {
  auto d = command_defaults::of("", [] { return std::optional<std::string>{}; });
  REQUIRE(d);
  CHECK(d->argv.empty());
  CHECK(d->cwd == "/");
  CHECK_FALSE(d->user);
  CHECK(d->env == command_defaults::of("", nullptr)->env);
  CHECK(has(d->env, "HOME=/root"));

  image_config c;
  c.user = "ghost";
  d = command_defaults::of(c.to_json(), [] { return std::optional<std::string>{passwd}; });
  REQUIRE(d);
  CHECK_FALSE(d->user);
  REQUIRE(d->user_error);
  CHECK(d->user_error->message.find("'ghost'") != std::string::npos);

  CHECK_FALSE(command_defaults::of("{not json", nullptr));
  CHECK_FALSE(command_defaults::of("{\"Env\": 5}", nullptr));
}

TEST_CASE("a command's user by name: ids, primary and supplementary groups, home; errors name "
          "what is missing") {
  user_files f;
  f.passwd = "# comment\nroot:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:u:/home/user:/bin/sh\n"
             "nohome:x:1001:1001::\nbroken:x:a:b:::\n";
  f.group = "root:x:0:\nuser:x:1000:\ndev:x:2000:user,other\nops:x:3000:other,user\n"
            "big:x:70000:user\nusers2:x:2000:user\n";
  auto u = resolve_command_user("user", f);
  REQUIRE_MESSAGE(u, u.error_value().message);
  CHECK(u->uid == 1000);
  CHECK(u->gid == 1000);
  CHECK(u->name == "user");
  CHECK(u->home == "/home/user");
  // The primary group, then those listing it (70000 is no gid of a sandbox;
  // 2000 twice counts once).
  CHECK(u->groups == std::vector<uint32_t>{1000, 2000, 3000});
  u = resolve_command_user("user:ops", f);
  REQUIRE(u);
  CHECK(u->gid == 3000);
  CHECK(u->groups == std::vector<uint32_t>{3000, 2000});
  u = resolve_command_user("user:42", f);
  REQUIRE(u);
  CHECK(u->gid == 42);
  // A number: its entry's name, gid, home and groups if passwd has one.
  u = resolve_command_user("1000", f);
  REQUIRE(u);
  CHECK(u->name == "user");
  CHECK(u->groups == std::vector<uint32_t>{1000, 2000, 3000});
  u = resolve_command_user("4321", f);
  REQUIRE(u);
  CHECK(u->uid == 4321);
  CHECK(u->gid == 4321);
  CHECK(u->name.empty());
  CHECK(u->groups == std::vector<uint32_t>{4321});
  u = resolve_command_user("nohome", f);
  REQUIRE(u);
  CHECK(u->home.empty());
  u = resolve_command_user("4321:dev", f);
  REQUIRE(u);
  CHECK(u->gid == 2000);
  for (auto [spec, says] : std::vector<std::pair<std::string, std::string>>{
         {"nobody", "no user 'nobody'"},
         {"user:nogroup", "no group 'nogroup'"},
         {"broken", "not a number below 65536"},
         {":dev", "expected USER[:GROUP]"},
         {"user:", "expected USER[:GROUP]"}}) {
    CAPTURE(spec);
    auto e = resolve_command_user(spec, f);
    REQUIRE_FALSE(e);
    CHECK(e.error_value().code == errc::invalid_argument);
    CHECK(e.error_value().message.find(says) != std::string::npos);
  }
  auto none = resolve_command_user("user", user_files{});
  REQUIRE_FALSE(none);
  CHECK(none.error_value().message.find("no /etc/passwd") != std::string::npos);
  user_files only_passwd{f.passwd, std::nullopt};
  auto g = resolve_command_user("user:dev", only_passwd);
  REQUIRE_FALSE(g);
  CHECK(g.error_value().message.find("no /etc/group") != std::string::npos);
}

TEST_CASE("merge_env: a later KEY= replaces the earlier one, order kept otherwise") {
  auto env = merge_env({"A=1", "B=2", "AB=3"}, {"A=9", "C=4"});
  CHECK(env == std::vector<std::string>{"B=2", "AB=3", "A=9", "C=4"});
}

TEST_CASE("read_image_passwd stays inside the image: a symlink to the host's is read "
          "beneath the image's root") {
  char tmpl[] = "/tmp/dsec-image-config-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  fs::path root = tmpl;
  unique_fd fd{::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  REQUIRE(fd);
  CHECK_FALSE(read_image_passwd(fd.get())); // no etc/passwd
  fs::create_directories(root / "etc");
  { std::ofstream(root / "etc/passwd") << passwd; }
  auto text = read_image_passwd(fd.get());
  REQUIRE(text);
  CHECK(*text == passwd);
  // An absolute symlink resolves beneath the image's root, not the host's.
  fs::remove(root / "etc/passwd");
  fs::create_symlink("/etc/image-passwd", root / "etc/passwd");
  CHECK_FALSE(read_image_passwd(fd.get()));
  { std::ofstream(root / "etc/image-passwd") << "agent:x:1:1::/:/bin/sh\n"; }
  text = read_image_passwd(fd.get());
  REQUIRE(text);
  CHECK(*text == "agent:x:1:1::/:/bin/sh\n");
  // `etc` itself a link to the host's /etc: still beneath the root.
  fs::remove_all(root / "etc");
  fs::create_symlink("/etc", root / "etc");
  CHECK_FALSE(read_image_passwd(fd.get())); // the image's /etc is itself: a loop, not the host's
  fs::remove_all(root);
}

// image_config (see image_config.hpp): the image config dsec keeps, read with
// nlohmann::json, and the command defaults it gives.
#include "runtime/image_config.hpp"

#include <algorithm>

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <charconv>

#include <nlohmann/json.hpp>

#include "runtime/container.hpp"
#include "runtime/fd.hpp"

namespace dsec {

using json = nlohmann::json;

namespace {

error bad(const std::string& why) {
  return make_error(errc::invalid_argument, "image config: " + why);
}

std::string string_at(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string{};
}

expected<std::vector<std::string>> strings_at(const json& j, const char* key) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null())
    return out;
  if (!it->is_array())
    return bad(std::string{key} + " is not an array");
  for (const auto& v : *it) {
    if (!v.is_string())
      return bad(std::string{key} + " holds a value that is not a string");
    out.push_back(v.get<std::string>());
  }
  return out;
}

// A uid or gid: decimal digits only, below 65536 (a sandbox maps 65536 ids).
std::optional<uint32_t> id_of(std::string_view s) {
  uint32_t v = 0;
  if (s.empty() || s.size() > 5)
    return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size() || v > 65535)
    return std::nullopt;
  return v;
}

// The fields of one passwd line (name:password:uid:gid:gecos:home:shell).
std::vector<std::string_view> fields(std::string_view line) {
  std::vector<std::string_view> f;
  size_t i = 0;
  while (true) {
    auto c = line.find(':', i);
    f.push_back(line.substr(i, c == std::string_view::npos ? std::string_view::npos : c - i));
    if (c == std::string_view::npos)
      return f;
    i = c + 1;
  }
}

// Calls `each` with the fields of every line of `text` (but comments) until
// it returns true.
template <class F>
void for_each_entry(std::string_view text, F&& each) {
  size_t pos = 0;
  while (pos < text.size()) {
    auto nl = text.find('\n', pos);
    auto line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    if (!line.empty() && line.front() != '#' && each(fields(line)))
      return;
  }
}

// The /etc/passwd entry of user `name` in `passwd`: its uid, gid and home;
// nullopt if it has none. An entry whose ids are not numbers below 65536 is an
// error that starts with `quoted`.
expected<std::optional<image_user>> find_user(std::string_view passwd, std::string_view name,
                                              const std::string& quoted) {
  std::optional<image_user> out;
  bool bad = false;
  for_each_entry(passwd, [&](const std::vector<std::string_view>& f) {
    if (f.size() < 4 || f[0] != name)
      return false;
    auto uid = id_of(f[2]), gid = id_of(f[3]);
    bad = !uid || !gid;
    if (!bad) {
      out = image_user{*uid, *gid, {}};
      if (f.size() >= 6 && !f[5].empty() && f[5].front() == '/')
        out->home = std::string{f[5]};
    }
    return true;
  });
  if (bad)
    return make_error(errc::invalid_argument,
                      quoted + ": its /etc/passwd entry has a uid or gid that is not a number "
                               "below 65536");
  return out;
}

} // namespace

std::string image_config::to_json() const {
  json j = json::object();
  j["Env"] = env;
  j["WorkingDir"] = working_dir;
  j["User"] = user;
  j["Entrypoint"] = entrypoint;
  j["Cmd"] = cmd;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

expected<image_config> image_config::from_json(std::string_view text) {
  auto j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded())
    return bad("not valid JSON");
  if (!j.is_object())
    return bad("not a JSON object");
  image_config c;
  DSEC_TRY(env, strings_at(j, "Env"));
  DSEC_TRY(ep, strings_at(j, "Entrypoint"));
  DSEC_TRY(cmd, strings_at(j, "Cmd"));
  c.env = std::move(env);
  c.entrypoint = std::move(ep);
  c.cmd = std::move(cmd);
  c.working_dir = string_at(j, "WorkingDir");
  c.user = string_at(j, "User");
  return c;
}

expected<image_user> resolve_image_user(std::string_view user,
                                        const std::optional<std::string>& passwd) {
  auto quoted = "the image's User '" + std::string{user.substr(0, 200)} + "'";
  auto colon = user.find(':');
  auto u = user.substr(0, colon);
  auto g = colon == std::string_view::npos ? std::string_view{} : user.substr(colon + 1);
  image_user out;
  if (u.empty())
    return make_error(errc::invalid_argument, quoted + " names no user");
  if (auto id = id_of(u)) {
    out.uid = *id;
    out.gid = *id;
  } else {
    if (!passwd)
      return make_error(errc::invalid_argument,
                        quoted + " is a name, and the image has no /etc/passwd to look it up in");
    DSEC_TRY(entry, find_user(*passwd, u, quoted));
    if (!entry)
      return make_error(errc::invalid_argument,
                        quoted + " is not a number below 65536 nor a user of its /etc/passwd");
    out = std::move(*entry);
  }
  if (colon != std::string_view::npos) {
    auto gid = id_of(g);
    if (!gid)
      return make_error(errc::invalid_argument,
                        quoted + " names a group that is not a number below 65536 (only "
                                 "numeric groups are supported)");
    out.gid = *gid;
  }
  return out;
}


expected<command_user> resolve_command_user(std::string_view spec, const user_files& files) {
  auto quoted = "the user '" + std::string{spec.substr(0, 200)} + "'";
  auto colon = spec.find(':');
  auto u = spec.substr(0, colon);
  auto g = colon == std::string_view::npos ? std::string_view{} : spec.substr(colon + 1);
  if (u.empty() || (colon != std::string_view::npos && g.empty()))
    return make_error(errc::invalid_argument,
                      quoted + ": expected USER[:GROUP], each a name or a number below 65536");
  command_user out;
  if (auto id = id_of(u)) {
    out.uid = out.gid = *id;
    if (files.passwd) // a number keeps its name and home if passwd has them
      for_each_entry(*files.passwd, [&](const std::vector<std::string_view>& f) {
        if (f.size() < 4 || id_of(f[2]) != *id)
          return false;
        out.name = std::string{f[0]};
        if (auto gid = id_of(f[3]))
          out.gid = *gid;
        if (f.size() >= 6 && !f[5].empty() && f[5].front() == '/')
          out.home = std::string{f[5]};
        return true;
      });
  } else {
    if (!files.passwd)
      return make_error(errc::invalid_argument,
                        quoted + " names a user, and the image has no /etc/passwd to look it up in");
    DSEC_TRY(entry, find_user(*files.passwd, u, quoted));
    if (!entry)
      return make_error(errc::invalid_argument,
                        quoted + ": no user '" + std::string{u} + "' in the image's /etc/passwd");
    out.uid = entry->uid;
    out.gid = entry->gid;
    out.home = std::move(entry->home);
    out.name = std::string{u};
  }
  if (!g.empty()) {
    if (auto id = id_of(g)) {
      out.gid = *id;
    } else {
      if (!files.group)
        return make_error(errc::invalid_argument,
                          quoted + " names a group, and the image has no /etc/group to look it "
                                   "up in");
      bool found = false;
      for_each_entry(*files.group, [&](const std::vector<std::string_view>& f) {
        if (f.size() < 3 || f[0] != g)
          return false;
        if (auto gid = id_of(f[2])) {
          out.gid = *gid;
          found = true;
        }
        return true;
      });
      if (!found)
        return make_error(errc::invalid_argument,
                          quoted + ": no group '" + std::string{g} +
                            "' (with a gid below 65536) in the image's /etc/group");
    }
  }
  // Supplementary groups: the primary one, then every group listing the name.
  out.groups.push_back(out.gid);
  if (!out.name.empty() && files.group)
    for_each_entry(*files.group, [&](const std::vector<std::string_view>& f) {
      if (f.size() < 4)
        return false;
      auto gid = id_of(f[2]);
      if (!gid || std::find(out.groups.begin(), out.groups.end(), *gid) != out.groups.end())
        return false;
      std::string_view members = f[3];
      size_t at = 0;
      while (at <= members.size()) {
        auto comma = members.find(',', at);
        auto m = members.substr(at, comma == std::string_view::npos ? std::string_view::npos
                                                                    : comma - at);
        if (m == out.name) {
          out.groups.push_back(*gid);
          break;
        }
        if (comma == std::string_view::npos)
          break;
        at = comma + 1;
      }
      return out.groups.size() >= proto::max_groups; // the rest are left out
    });
  return out;
}

std::vector<std::string> merge_env(std::vector<std::string> env,
                                   const std::vector<std::string>& over) {
  for (const auto& kv : over) {
    auto key = kv.substr(0, kv.find('=') + 1);
    std::erase_if(env, [&](const std::string& e) { return e.rfind(key, 0) == 0; });
    env.push_back(kv);
  }
  return env;
}

expected<command_defaults>
command_defaults::of(std::string_view config_json,
                     const std::function<std::optional<std::string>()>& passwd) {
  command_defaults d;
  d.env = command::default_env();
  if (config_json.empty())
    return d;
  DSEC_TRY(c, image_config::from_json(config_json));
  d.argv = c.entrypoint;
  d.argv.insert(d.argv.end(), c.cmd.begin(), c.cmd.end());
  if (!c.user.empty()) {
    auto name = std::string_view{c.user}.substr(0, c.user.find(':'));
    auto u = resolve_image_user(c.user, id_of(name) ? std::nullopt : passwd());
    if (u) {
      if (!u->home.empty())
        d.env = merge_env(std::move(d.env), {"HOME=" + u->home});
      d.user = std::move(*u);
    } else {
      d.user_error = std::move(u).error_value();
    }
  }
  std::vector<std::string> env;
  for (auto& e : c.env)
    if (e.find('=') != std::string::npos && e.front() != '=')
      env.push_back(std::move(e));
  d.env = merge_env(std::move(d.env), env);
  if (!c.working_dir.empty())
    d.cwd = c.working_dir.front() == '/' ? c.working_dir : "/" + c.working_dir;
  return d;
}

namespace {

std::optional<std::string> read_image_file(int root_fd, const char* rel) {
  open_how how{};
  how.flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  unique_fd fd{static_cast<int>(::syscall(SYS_openat2, root_fd, rel, &how, sizeof how))};
  struct stat st{};
  if (!fd || ::fstat(fd.get(), &st) < 0 || !S_ISREG(st.st_mode))
    return std::nullopt;
  std::string text;
  char buf[8192];
  while (text.size() < (1u << 20)) {
    auto n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

} // namespace

std::optional<std::string> read_image_passwd(int root_fd) {
  return read_image_file(root_fd, "etc/passwd");
}

void user_files::add_lower(int root_fd) {
  if (!passwd)
    passwd = read_image_file(root_fd, "etc/passwd");
  if (!group)
    group = read_image_file(root_fd, "etc/group");
}

void apply_command_user(command& cmd, command_user u, const std::vector<std::string>& given) {
  cmd.uid = u.uid;
  cmd.gid = u.gid;
  cmd.groups = std::move(u.groups);
  auto set = [&](std::string_view k) {
    return std::any_of(given.begin(), given.end(),
                       [&](const std::string& kv) { return kv.rfind(k, 0) == 0; });
  };
  if (!set("HOME="))
    cmd.env = merge_env(std::move(cmd.env), {"HOME=" + (u.home.empty() ? "/" : u.home)});
  if (!u.name.empty() && !set("USER="))
    cmd.env = merge_env(std::move(cmd.env), {"USER=" + u.name});
}

} // namespace dsec

// dsec-e2b's gateway (gateway.hpp): E2B's REST control plane and envd's
// Connect (JSON) and /files endpoints, each call mapped onto dsec::client's
// asynchronous verbs. Answers are given from CAF's threads through the
// responder; no thread waits on a sandbox.
#include "tools/e2b/gateway.hpp"

#include <archive.h>
#include <archive_entry.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <fstream>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <csignal>
#include <cstring>
#include <optional>
#include <sstream>

#include "actors/client.hpp"
#include "runtime/net_policy.hpp"
#include "runtime/units.hpp"
#include "tools/e2b/gateway_impl.hpp"

namespace dsec::e2b {

using namespace std::chrono_literals;

uint64_t now_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count());
}

std::string rfc3339(uint64_t ms) {
  time_t t = static_cast<time_t>(ms / 1000);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<unsigned>(ms % 1000));
  return buf;
}

std::string random_hex(size_t bytes) {
  static thread_local std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < bytes; ++i) {
    auto b = static_cast<unsigned>(rd()) & 0xff;
    s.push_back(hex[b >> 4]);
    s.push_back(hex[b & 15]);
  }
  return s;
}

namespace {

const char* b64chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += b64chars[v >> 18];
    out += b64chars[(v >> 12) & 63];
    out += b64chars[(v >> 6) & 63];
    out += b64chars[v & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += b64chars[v >> 18];
    out += b64chars[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += b64chars[v >> 18];
    out += b64chars[(v >> 12) & 63];
    out += b64chars[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

// Standard base64 (padding optional); nullopt for anything else.
std::optional<std::string> unbase64(std::string_view in) {
  while (!in.empty() && in.back() == '=')
    in.remove_suffix(1);
  std::string out;
  out.reserve(in.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    const char* at = c == '\0' ? nullptr : std::strchr(b64chars, c);
    if (!at)
      return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(at - b64chars);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  if (bits >= 6) // a lone sixth character encodes nothing
    return std::nullopt;
  return out;
}

// The user of an envd request, from its `Authorization: Basic base64(USER:)`
// header (the E2B SDK's `user` option); empty without one, or if it does not
// parse.
std::string user_of(const std::string& authorization) {
  constexpr std::string_view basic = "Basic ";
  if (authorization.rfind(basic, 0) != 0)
    return {};
  auto d = unbase64(std::string_view{authorization}.substr(basic.size()));
  if (!d)
    return {};
  return d->substr(0, d->find(':'));
}

std::string envelope(uint8_t flags, const json& j) {
  // Names from a sandbox need not be UTF-8: such bytes become U+FFFD.
  std::string body = j.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(body.size() + 5);
  out.push_back(static_cast<char>(flags));
  auto n = static_cast<uint32_t>(body.size());
  out.push_back(static_cast<char>(n >> 24));
  out.push_back(static_cast<char>(n >> 16));
  out.push_back(static_cast<char>(n >> 8));
  out.push_back(static_cast<char>(n));
  out += body;
  return out;
}

} // namespace

// ---- errors -----------------------------------------------------------------------

void rest_error(responder& r, int status, const std::string& msg) {
  r.reply(status, "application/json", json{{"code", status}, {"message", msg}}.dump());
}

int http_status(const error& e) {
  switch (e.code) {
  case errc::invalid_argument:
  case errc::wrong_kind:
  case errc::malformed:
    return 400;
  case errc::not_found:
  case errc::closed:
  case errc::lost:
    return 404;
  case errc::already_exists:
  case errc::in_use:
  case errc::paused:
    return 409;
  case errc::too_large:
    return 413;
  case errc::unauthenticated:
  case errc::unauthorized:
    return 401;
  case errc::overloaded:
    return 503;
  case errc::timeout:
    return 504;
  case errc::unsupported:
    return 501;
  default:
    return 500;
  }
}

namespace {

std::string connect_code(const error& e) {
  switch (e.code) {
  case errc::invalid_argument:
  case errc::wrong_kind:
  case errc::malformed:
    return "invalid_argument";
  case errc::not_found:
    return "not_found";
  case errc::already_exists:
    return "already_exists";
  case errc::closed:
  case errc::lost:
  case errc::disconnected:
    return "unavailable";
  case errc::paused:
    return "failed_precondition";
  case errc::overloaded:
    return "resource_exhausted";
  case errc::timeout:
    return "deadline_exceeded";
  case errc::unauthenticated:
  case errc::unauthorized:
    return "unauthenticated";
  case errc::unsupported:
    return "unimplemented";
  default:
    return "internal";
  }
}

int connect_http_status(const std::string& code) {
  static const std::map<std::string, int> m{
    {"canceled", 499},          {"unknown", 500},           {"invalid_argument", 400},
    {"deadline_exceeded", 504}, {"not_found", 404},         {"already_exists", 409},
    {"permission_denied", 403}, {"resource_exhausted", 429}, {"failed_precondition", 400},
    {"aborted", 409},           {"out_of_range", 400},      {"unimplemented", 501},
    {"internal", 500},          {"unavailable", 503},       {"data_loss", 500},
    {"unauthenticated", 401}};
  auto it = m.find(code);
  return it == m.end() ? 500 : it->second;
}

// A unary Connect error.
void connect_error(responder& r, const std::string& code, const std::string& msg) {
  r.reply(connect_http_status(code), "application/json",
          json{{"code", code}, {"message", msg}}.dump());
}

} // namespace

std::string describe(const error& e) {
  return e.message.empty() ? std::string{to_string(e.code)} : e.message;
}

bool sandbox_gone(const error& e) {
  return e.code == errc::closed || e.code == errc::lost;
}

namespace {

// ---- tar (libarchive) ---------------------------------------------------------------

// A tar of one regular file `name` with `data`.
std::string tar_one(const std::string& name, const std::string& data, uint32_t uid = 0,
                    uint32_t gid = 0) {
  std::string out;
  struct archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  archive_write_open(
    a, &out, nullptr,
    [](struct archive*, void* p, const void* buf, size_t n) -> la_ssize_t {
      static_cast<std::string*>(p)->append(static_cast<const char*>(buf), n);
      return static_cast<la_ssize_t>(n);
    },
    nullptr);
  struct archive_entry* e = archive_entry_new();
  archive_entry_set_pathname(e, name.c_str());
  archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_perm(e, 0644);
  archive_entry_set_uid(e, uid); // (tar in the sandbox runs as root: it keeps the owner)
  archive_entry_set_gid(e, gid);
  archive_entry_set_mtime(e, static_cast<time_t>(now_ms() / 1000), 0);
  archive_write_header(a, e);
  archive_write_data(a, data.data(), data.size());
  archive_entry_free(e);
  archive_write_close(a);
  archive_write_free(a);
  return out;
}

// The contents of the first entry of a tar that `get` returned; an error when
// it is not a regular file.
expected<std::string> untar_first(const std::string& tar, const std::string& shown) {
  struct archive* a = archive_read_new();
  archive_read_support_format_tar(a);
  struct guard {
    struct archive* a;
    ~guard() { archive_read_free(a); }
  } g{a};
  if (archive_read_open_memory(a, tar.data(), tar.size()) != ARCHIVE_OK)
    return make_error(errc::malformed, "the sandbox returned a bad archive for '" + shown + "'");
  struct archive_entry* e = nullptr;
  if (archive_read_next_header(a, &e) != ARCHIVE_OK)
    return make_error(errc::not_found, "path '" + shown + "' does not exist");
  if (archive_entry_filetype(e) == AE_IFDIR)
    return make_error(errc::invalid_argument, "path '" + shown + "' is a directory");
  if (archive_entry_filetype(e) != AE_IFREG)
    return make_error(errc::invalid_argument, "path '" + shown + "' is not a regular file");
  std::string out;
  char buf[65536];
  for (;;) {
    auto n = archive_read_data(a, buf, sizeof buf);
    if (n < 0)
      return make_error(errc::malformed, "reading '" + shown + "': " + archive_error_string(a));
    if (n == 0)
      break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// ---- multipart/form-data (RFC 7578): the parts named "file" ---------------------------

struct form_file {
  std::string filename;
  std::string data;
};

std::string param(const std::string& header, const std::string& name) {
  // name="value" or name=value in a header's parameters.
  auto pos = std::string::npos;
  for (size_t i = 0; (i = header.find(name + "=", i)) != std::string::npos; ++i) {
    if (i == 0 || header[i - 1] == ';' || header[i - 1] == ' ' || header[i - 1] == '\t') {
      pos = i + name.size() + 1;
      break;
    }
  }
  if (pos == std::string::npos)
    return {};
  if (pos < header.size() && header[pos] == '"') {
    auto end = header.find('"', pos + 1);
    return header.substr(pos + 1, end == std::string::npos ? std::string::npos : end - pos - 1);
  }
  auto end = header.find(';', pos);
  auto v = header.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t'))
    v.pop_back();
  return v;
}

expected<std::vector<form_file>> parse_multipart(const std::string& body,
                                                 const std::string& content_type) {
  auto boundary = param(content_type, "boundary");
  if (boundary.empty())
    return make_error(errc::invalid_argument, "multipart body without a boundary");
  const std::string delim = "--" + boundary;
  std::vector<form_file> files;
  auto pos = body.find(delim);
  if (pos == std::string::npos)
    return make_error(errc::invalid_argument, "multipart body without its boundary");
  for (;;) {
    pos += delim.size();
    if (body.compare(pos, 2, "--") == 0)
      break; // the closing delimiter
    if (body.compare(pos, 2, "\r\n") != 0)
      return make_error(errc::invalid_argument, "malformed multipart delimiter");
    pos += 2;
    auto hend = body.find("\r\n\r\n", pos);
    if (hend == std::string::npos)
      return make_error(errc::invalid_argument, "multipart part without the end of its headers");
    std::string headers = body.substr(pos, hend - pos);
    auto next = body.find("\r\n" + delim, hend + 4);
    if (next == std::string::npos)
      return make_error(errc::invalid_argument, "multipart part without a closing boundary");
    std::string disposition;
    std::istringstream hs{headers};
    for (std::string line; std::getline(hs, line);) {
      if (!line.empty() && line.back() == '\r')
        line.pop_back();
      auto colon = line.find(':');
      if (colon == std::string::npos)
        continue;
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(), ::tolower);
      if (name == "content-disposition")
        disposition = line.substr(colon + 1);
    }
    if (param(disposition, "name") == "file")
      files.push_back({param(disposition, "filename"), body.substr(hend + 4, next - hend - 4)});
    pos = next + 2;
  }
  return files;
}

// ---- paths -------------------------------------------------------------------------

// An absolute, normalised path ("." and ".." resolved lexically) from `p`
// relative to `cwd`; an error for an empty path or a NUL.
expected<std::string> resolve(const std::string& cwd, const std::string& p) {
  if (p.empty())
    return make_error(errc::invalid_argument, "path is empty");
  if (p.find('\0') != std::string::npos)
    return make_error(errc::invalid_argument, "path contains a NUL byte");
  std::string full = p[0] == '/' ? p : cwd + "/" + p;
  std::vector<std::string> parts;
  std::istringstream ss{full};
  for (std::string s; std::getline(ss, s, '/');) {
    if (s.empty() || s == ".")
      continue;
    if (s == "..") {
      if (!parts.empty())
        parts.pop_back();
      continue;
    }
    parts.push_back(s);
  }
  std::string out;
  for (auto& s : parts)
    out += "/" + s;
  return out.empty() ? std::string{"/"} : out;
}

std::string dirname_of(const std::string& abs) {
  auto s = abs.rfind('/');
  return s == 0 ? std::string{"/"} : abs.substr(0, s);
}
std::string basename_of(const std::string& abs) { return abs.substr(abs.rfind('/') + 1); }

// ---- the stat lines the filesystem calls' shell scripts print ---------------------------

// %f|%s|%a|%U|%G|%Y|%n (busybox and GNU stat): raw mode in hex, size,
// permissions in octal, owner, group, mtime, name.
const char* stat_fmt = "%f|%s|%a|%U|%G|%Y|%n";

std::string perm_string(uint32_t mode) {
  std::string s;
  switch (mode & 0170000) {
  case 0040000: s += 'd'; break;
  case 0120000: s += 'L'; break;
  default: s += '-';
  }
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i)
    s += (mode & (0400 >> i)) ? rwx[i] : '-';
  return s;
}

std::optional<json> entry_of(const std::string& line) {
  std::vector<std::string> f;
  size_t pos = 0;
  for (int i = 0; i < 6; ++i) {
    auto bar = line.find('|', pos);
    if (bar == std::string::npos)
      return std::nullopt;
    f.push_back(line.substr(pos, bar - pos));
    pos = bar + 1;
  }
  std::string path = line.substr(pos);
  uint32_t mode = 0;
  try {
    mode = static_cast<uint32_t>(std::stoul(f[0], nullptr, 16));
  } catch (...) {
    return std::nullopt;
  }
  std::string type = "FILE_TYPE_UNSPECIFIED";
  switch (mode & 0170000) {
  case 0100000: type = "FILE_TYPE_FILE"; break;
  case 0040000: type = "FILE_TYPE_DIRECTORY"; break;
  case 0120000: type = "FILE_TYPE_SYMLINK"; break;
  default: break;
  }
  uint64_t mtime = 0;
  try {
    mtime = std::stoull(f[5]);
  } catch (...) {
  }
  return json{{"name", basename_of(path.size() > 1 && path.back() == '/' ? path.substr(0, path.size() - 1) : path)},
              {"type", type},
              {"path", path},
              {"size", f[1]},
              {"mode", mode & 07777},
              {"permissions", perm_string(mode)},
              {"owner", f[3]},
              {"group", f[4]},
              {"modifiedTime", rfc3339(mtime * 1000)}};
}

} // namespace

gateway::gateway(std::unique_ptr<impl> p) : p_(std::move(p)) {}
gateway::~gateway() = default;

expected<std::unique_ptr<gateway>> gateway::open(client& c, gateway_options o) {
  auto p = std::make_unique<impl>();
  p->c = &c;
  p->o = std::move(o);
  for (auto& k : p->o.keys) {
    session_options so;
    so.quota = p->o.quota;
    so.name = "e2b:" + k.substr(0, std::min<size_t>(k.size(), 12));
    auto s = c.open_session(so);
    if (!s)
      return make_error(s.error_value().code,
                   "opening the session of a key: " + describe(s.error_value()));
    p->sessions.emplace(k, std::move(*s));
  }
  return std::unique_ptr<gateway>(new gateway(std::move(p)));
}

bool gateway::streams_body(const http_request& head) {
  return head.method == "POST" && head.path == "/process.Process/StreamInput";
}

void gateway::handle(http_request req, std::shared_ptr<responder> r) {
  // envd by its host name too ("49983-ID.DOMAIN", as the SDK names it when no
  // E2B_SANDBOX_URL is set): the id as the header would give it.
  if (req.header("e2b-sandbox-id").empty())
    if (auto t = target_of(req); t && t->port == envd_port)
      req.headers["e2b-sandbox-id"] = t->id;
  if (!req.header("e2b-sandbox-id").empty())
    p_->envd(req, std::move(r));
  else
    p_->control(req, std::move(r));
}

// ---- the control plane ------------------------------------------------------------------

void gateway::impl::control(http_request& req, std::shared_ptr<responder> r) {
  if (req.method == "GET" && req.path == "/health")
    return r->reply(200, "application/json", R"({"status":"ok"})");
  auto key = req.header("x-api-key");
  if (key.empty())
    return rest_error(*r, 401, "missing API key (the X-API-KEY header)");
  if (!sessions.count(key))
    return rest_error(*r, 401, "Invalid API key");
  // /sandboxes[/{id}[/verb]] and /v2/...
  std::string path = req.path;
  bool v2 = false;
  if (path.rfind("/v2/", 0) == 0) {
    v2 = true;
    path = path.substr(3);
  }
  std::vector<std::string> seg;
  {
    std::istringstream ss{path};
    for (std::string s; std::getline(ss, s, '/');)
      if (!s.empty())
        seg.push_back(s);
  }
  if (seg.empty() || seg[0] != "sandboxes" || seg.size() > 3)
    return rest_error(*r, 404, "no such endpoint: " + req.method + " " + req.path);
  const auto& m = req.method;
  if (seg.size() == 1) {
    if (m == "POST")
      return create(key, req, r);
    if (m == "GET")
      return list(key, req, r, v2);
    return rest_error(*r, 405, "method " + m + " not allowed on " + req.path);
  }
  const auto& id = seg[1];
  if (seg.size() == 2) {
    if (m == "DELETE")
      return kill(key, id, r);
    if (m == "GET") {
      auto s = find_for(key, id);
      if (!s)
        return rest_error(*r, 404, "sandbox '" + id + "' not found");
      return r->reply(200, "application/json", sandbox_json(*s, true).dump());
    }
    return rest_error(*r, 405, "method " + m + " not allowed on " + req.path);
  }
  const auto& verb = seg[2];
  if (verb == "network" && m == "PUT")
    return update_network(key, id, req, r);
  if (m != "POST")
    return rest_error(*r, 405, "method " + m + " not allowed on " + req.path);
  if (verb == "timeout")
    return set_timeout(key, id, req, r);
  if (verb == "connect")
    return connect(key, id, req, r, false);
  if (verb == "resume")
    return connect(key, id, req, r, true);
  if (verb == "pause")
    return pause(key, id, r);
  if (verb == "refreshes")
    return set_timeout(key, id, req, r);
  return rest_error(*r, 404, "no such endpoint: " + req.method + " " + req.path);
}

namespace {
// The JSON body of a control-plane request ({} when empty); nullopt after
// answering 400.
std::optional<json> body_json(const http_request& req, responder& r) {
  if (req.body.empty())
    return json::object();
  try {
    auto j = json::parse(req.body);
    if (!j.is_object()) {
      rest_error(r, 400, "the request body is not a JSON object");
      return std::nullopt;
    }
    return j;
  } catch (const json::exception& e) {
    rest_error(r, 400, std::string{"the request body is not JSON: "} + e.what());
    return std::nullopt;
  }
}

// E2B's allow_internet_access (create and network update bodies) into `out`
// (nullopt: not given); false after answering 400.
bool internet_of(const json& b, responder& r, std::optional<bool>& out) {
  out.reset();
  for (const char* name : {"allow_internet_access", "allowInternetAccess"}) {
    if (!b.contains(name) || b[name].is_null())
      continue;
    if (!b[name].is_boolean()) {
      rest_error(r, 400, std::string{name} + " must be true or false");
      return false;
    }
    out = b[name].get<bool>();
    return true;
  }
  return true;
}

// `timeout` (seconds) of a body, or `dflt`; nullopt after answering 400.
std::optional<uint64_t> timeout_of(const json& b, uint64_t dflt, responder& r) {
  if (!b.contains("timeout") || b["timeout"].is_null())
    return dflt;
  const auto& t = b["timeout"];
  if (!t.is_number_integer() || t.get<int64_t>() < 1 || t.get<int64_t>() > 30 * 86400) {
    rest_error(r, 400, "timeout must be an integer number of seconds from 1 to 2592000");
    return std::nullopt;
  }
  return t.get<uint64_t>();
}
} // namespace

void gateway::impl::create(const std::string& key, http_request& req,
                           std::shared_ptr<responder> r) {
  auto b = body_json(req, *r);
  if (!b)
    return;
  std::string tmpl = "base";
  if (b->contains("templateID")) {
    if (!(*b)["templateID"].is_string())
      return rest_error(*r, 400, "templateID must be a string");
    tmpl = (*b)["templateID"].get<std::string>();
  }
  auto it = o.templates.find(tmpl);
  if (it == o.templates.end())
    return rest_error(*r, 404, "template '" + tmpl + "' not found");
  auto secs = timeout_of(*b, 300, *r);
  if (!secs)
    return;
  auto s = std::make_shared<sandbox>();
  s->key = key;
  s->tmpl = tmpl;
  s->def = &it->second;
  s->cwd = it->second.cwd;
  s->token = random_hex(16);
  if (b->contains("metadata") && !(*b)["metadata"].is_null()) {
    const auto& md = (*b)["metadata"];
    if (!md.is_object())
      return rest_error(*r, 400, "metadata must be an object of strings");
    for (auto& [k, v] : md.items())
      if (!v.is_string())
        return rest_error(*r, 400, "metadata '" + k + "' must be a string");
    s->metadata = md;
  }
  if (b->contains("envVars") && !(*b)["envVars"].is_null()) {
    const auto& ev = (*b)["envVars"];
    if (!ev.is_object())
      return rest_error(*r, 400, "envVars must be an object of strings");
    for (auto& [k, v] : ev.items()) {
      if (!v.is_string() || k.empty() || k.find('=') != std::string::npos)
        return rest_error(*r, 400, "envVars '" + k + "' must be a NAME with a string value");
      s->env_vars.push_back(k + "=" + v.get<std::string>());
    }
  }
  // E2B options dsec-e2b cannot honour are refused, naming them, rather than
  // ignored: a sandbox killed at its timeout where it asked to be paused, or
  // one without the volume it asked for, would lose the trainer's work.
  auto given = [&](const char* k) {
    if (!b->contains(k))
      return false;
    const auto& v = (*b)[k];
    return !(v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
             ((v.is_array() || v.is_object()) && v.empty()) ||
             (v.is_object() && v.contains("enabled") && v["enabled"] == false && v.size() == 1));
  };
  for (auto [k, why] : {std::pair{"autoPause", "a sandbox is destroyed at its timeout (pause it "
                                               "with POST /sandboxes/{id}/pause)"},
                        {"autoPauseMemory", "a sandbox is destroyed at its timeout"},
                        {"autoResume", "a paused sandbox is resumed by connect only"},
                        {"volumeMounts", "a sandbox has only its template's layers and its "
                                         "own writable layer"},
                        {"mcp", "no MCP gateway runs in the sandbox"},
                        {"iam", "no IAM tokens are issued"}})
    if (given(k))
      return rest_error(*r, 400, std::string{k} + " is not supported by dsec-e2b (" + why + ")");
  json nw = json::object();
  if (b->contains("network") && !(*b)["network"].is_null()) {
    nw = (*b)["network"];
    if (!nw.is_object())
      return rest_error(*r, 400, "network must be an object");
    for (auto& [k, v] : nw.items()) {
      if (k == "allowOut" || k == "denyOut")
        continue; // egress_of's
      if (k != "allowPublicTraffic")
        return rest_error(*r, 400, "network." + k + " is not supported by dsec-e2b (it takes "
                                   "allowOut, denyOut and allowPublicTraffic)");
      if (!v.is_boolean())
        return rest_error(*r, 400, "network.allowPublicTraffic must be true or false");
      if (!v.get<bool>()) {
        s->restricted = true;
        s->traffic_token = random_hex(16);
      }
    }
  }
  std::optional<bool> internet;
  if (!internet_of(*b, *r, internet))
    return;
  auto policy = egress_of(tmpl, it->second, nw, internet);
  if (!policy)
    return rest_error(*r, 400, describe(policy.error_value()));
  environment env = it->second.env;
  env.ttl_ms = *secs * 1000;
  if (*policy) {
    env.allow = (*policy)->allow;
    env.deny = (*policy)->deny;
  }
  auto failure = std::make_shared<std::pair<std::mutex, std::optional<error>>>();
  sess(key).create_async(
    env, 1,
    [this, s, r, failure, secs = *secs](expected<std::vector<std::string>> ids) {
      if (!ids)
        return rest_error(*r, http_status(ids.error_value()) == 404 ? 400 : http_status(ids.error_value()),
                          "creating the sandbox: " + describe(ids.error_value()));
      if (ids->empty()) {
        std::lock_guard<std::mutex> g{failure->first};
        auto e = failure->second.value_or(make_error(errc::sandbox_failed, "no sandbox was made"));
        return rest_error(*r, e.code == errc::overloaded ? 503 : 500,
                          "creating the sandbox: " + describe(e));
      }
      s->id = ids->front();
      s->started_ms = now_ms();
      s->end_ms = s->started_ms + secs * 1000;
      {
        std::lock_guard<std::mutex> g{mu};
        sandboxes[s->id] = s;
      }
      r->reply(201, "application/json", created_json(*s).dump());
    },
    {},
    [failure](const error& e) {
      std::lock_guard<std::mutex> g{failure->first};
      failure->second = e;
    });
}

void gateway::impl::kill(const std::string& key, const std::string& id,
                         std::shared_ptr<responder> r) {
  auto s = find_for(key, id);
  if (!s)
    return rest_error(*r, 404, "sandbox '" + id + "' not found");
  sess(key).destroy_async(id, [this, id, r](expected<void> ok) {
    if (!ok && !sandbox_gone(ok.error_value()) && ok.error_value().code != errc::not_found)
      return rest_error(*r, http_status(ok.error_value()), describe(ok.error_value()));
    forget(id);
    r->reply(204, "", "");
  });
}

void gateway::impl::set_timeout(const std::string& key, const std::string& id,
                                http_request& req, std::shared_ptr<responder> r) {
  auto s = find_for(key, id);
  if (!s)
    return rest_error(*r, 404, "sandbox '" + id + "' not found");
  auto b = body_json(req, *r);
  if (!b)
    return;
  if (!b->contains("timeout") && b->contains("duration"))
    (*b)["timeout"] = (*b)["duration"];
  auto secs = timeout_of(*b, 300, *r);
  if (!secs)
    return;
  sess(key).set_ttl_async(
    id, std::chrono::milliseconds(*secs * 1000), [this, s, r](expected<uint64_t> left) {
      if (!left) {
        if (sandbox_gone(left.error_value()) || left.error_value().code == errc::not_found)
          forget(s->id);
        return rest_error(*r, http_status(left.error_value()), describe(left.error_value()));
      }
      {
        std::lock_guard<std::mutex> g{mu};
        s->end_ms = now_ms() + *left;
      }
      r->reply(204, "", "");
    });
}

void gateway::impl::list(const std::string& key, http_request& req,
                         std::shared_ptr<responder> r, bool v2) {
  // Filters: state (running,paused), metadata (k=v&..., URL-encoded), limit, nextToken.
  std::set<std::string> states;
  if (auto st = req.query.find("state"); st != req.query.end()) {
    std::istringstream ss{st->second};
    for (std::string x; std::getline(ss, x, ',');) {
      if (x != "running" && x != "paused")
        return rest_error(*r, 400, "state must be running or paused, not '" + x + "'");
      states.insert(x);
    }
  }
  std::map<std::string, std::string> md;
  if (auto q = req.query.find("metadata"); q != req.query.end()) {
    http_request tmp;
    std::istringstream ss{q->second};
    for (std::string kv; std::getline(ss, kv, '&');) {
      auto eq = kv.find('=');
      if (eq == std::string::npos)
        return rest_error(*r, 400, "metadata filter '" + kv + "' is not KEY=VALUE");
      md[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  uint64_t limit = 100;
  if (auto q = req.query.find("limit"); q != req.query.end()) {
    try {
      size_t used = 0;
      limit = std::stoull(q->second, &used);
      if (used != q->second.size() || limit < 1 || limit > 1000)
        throw std::invalid_argument("range");
    } catch (...) {
      return rest_error(*r, 400, "limit must be an integer from 1 to 1000");
    }
  }
  std::string after;
  if (auto q = req.query.find("nextToken"); q != req.query.end())
    after = q->second;
  std::vector<std::shared_ptr<sandbox>> mine;
  {
    std::lock_guard<std::mutex> g{mu};
    auto now = now_ms();
    for (auto it = sandboxes.begin(); it != sandboxes.end();) {
      auto& s = *it->second;
      if (!s.paused && s.end_ms && now > s.end_ms + 2000) {
        it = sandboxes.erase(it);
        continue;
      }
      if (s.key == key && (after.empty() || s.id > after) &&
          (states.empty() || states.count(s.paused ? "paused" : "running"))) {
        bool ok = true;
        for (auto& [k, v] : md)
          ok = ok && s.metadata.contains(k) && s.metadata[k] == v;
        if (ok)
          mine.push_back(it->second);
      }
      ++it;
    }
  }
  json arr = json::array();
  header_list extra;
  if (!v2)
    limit = mine.size() + 1; // /sandboxes (v1): everything
  for (size_t i = 0; i < mine.size(); ++i) {
    if (i == limit) {
      extra.emplace_back("X-Next-Token", mine[i - 1]->id);
      break;
    }
    arr.push_back(sandbox_json(*mine[i], false));
  }
  r->reply(200, "application/json", arr.dump(), extra);
}

void gateway::impl::connect(const std::string& key, const std::string& id, http_request& req,
                            std::shared_ptr<responder> r, bool resume_only) {
  auto s = find_for(key, id);
  if (!s)
    return rest_error(*r, 404, "sandbox '" + id + "' not found");
  auto b = body_json(req, *r);
  if (!b)
    return;
  std::optional<uint64_t> secs;
  if (b->contains("timeout") && !(*b)["timeout"].is_null()) {
    secs = timeout_of(*b, 300, *r);
    if (!secs)
      return;
  }
  bool was_paused;
  {
    std::lock_guard<std::mutex> g{mu};
    was_paused = s->paused;
  }
  if (resume_only && !was_paused)
    return rest_error(*r, 409, "sandbox '" + id + "' is not paused");
  auto then_ttl = [this, s, r, secs, was_paused] {
    auto answer = [this, s, r, was_paused] {
      r->reply(was_paused ? 201 : 200, "application/json", created_json(*s).dump());
    };
    if (!secs)
      return answer();
    sess(s->key).set_ttl_async(s->id, std::chrono::milliseconds(*secs * 1000),
                               [this, s, r, answer](expected<uint64_t> left) {
                                 if (!left)
                                   return rest_error(*r, http_status(left.error_value()),
                                                     describe(left.error_value()));
                                 {
                                   std::lock_guard<std::mutex> g{mu};
                                   s->end_ms = now_ms() + *left;
                                 }
                                 answer();
                               });
  };
  if (!was_paused)
    return then_ttl();
  sess(key).pause_async(id, false, [this, s, r, then_ttl](expected<bool> ok) {
    if (!ok) {
      if (sandbox_gone(ok.error_value()))
        forget(s->id);
      return rest_error(*r, http_status(ok.error_value()), describe(ok.error_value()));
    }
    {
      std::lock_guard<std::mutex> g{mu};
      if (s->paused)
        s->end_ms += now_ms() - s->paused_at_ms; // the TTL clock stood still
      s->paused = false;
    }
    then_ttl();
  });
}

void gateway::impl::pause(const std::string& key, const std::string& id,
                          std::shared_ptr<responder> r) {
  auto s = find_for(key, id);
  if (!s)
    return rest_error(*r, 404, "sandbox '" + id + "' not found");
  sess(key).pause_async(id, true, [this, s, r](expected<bool> ok) {
    if (!ok) {
      if (sandbox_gone(ok.error_value()))
        forget(s->id);
      return rest_error(*r, http_status(ok.error_value()), describe(ok.error_value()));
    }
    if (!*ok)
      return rest_error(*r, 409, "sandbox '" + s->id + "' is already paused");
    {
      std::lock_guard<std::mutex> g{mu};
      s->paused = true;
      s->paused_at_ms = now_ms();
    }
    r->reply(204, "", "");
  });
}

void gateway::impl::update_network(const std::string& key, const std::string& id,
                                   http_request& req, std::shared_ptr<responder> r) {
  auto s = find_for(key, id);
  if (!s)
    return rest_error(*r, 404, "sandbox '" + id + "' not found");
  auto b = body_json(req, *r);
  if (!b)
    return;
  for (auto& [k, v] : b->items())
    if (k != "allowOut" && k != "denyOut" && k != "allow_internet_access" &&
        k != "allowInternetAccess")
      return rest_error(*r, 400, k + " is not supported by dsec-e2b (a network update takes "
                                 "allowOut, denyOut and allow_internet_access)");
  std::optional<bool> internet;
  if (!internet_of(*b, *r, internet))
    return;
  auto policy = egress_of(s->tmpl, *s->def, *b, internet);
  if (!policy)
    return rest_error(*r, 400, describe(policy.error_value()));
  if (!s->def->env.egress)
    return r->reply(204, "", ""); // nothing to change (egress_of refused what would widen)
  // Omitted fields are cleared: back to the template's policy.
  auto allow = *policy ? (*policy)->allow : s->def->env.allow;
  auto deny = *policy ? (*policy)->deny : s->def->env.deny;
  sess(key).set_network_async(id, std::move(allow), std::move(deny),
                              [this, s, r](expected<void> ok) {
                                if (!ok) {
                                  if (sandbox_gone(ok.error_value()))
                                    forget(s->id);
                                  return rest_error(*r, http_status(ok.error_value()),
                                                    describe(ok.error_value()));
                                }
                                r->reply(204, "", "");
                              });
}

// ---- the sandbox endpoint (envd) ----------------------------------------------------------

void gateway::impl::envd(http_request& req, std::shared_ptr<responder> r) {
  auto id = req.header("e2b-sandbox-id");
  auto s = find(id);
  if (!s)
    return r->reply(502, "application/json",
                    json{{"code", 502}, {"message", "The sandbox was not found"}, {"sandboxId", id}}
                      .dump());
  if (req.header("x-access-token") != s->token)
    return rest_error(*r, 401, "missing or wrong access token (X-Access-Token) for sandbox '" +
                                 id + "'");
  if (req.path == "/health" && req.method == "GET")
    return r->reply(204, "", "");
  if (req.path == "/files") {
    if (req.method == "GET")
      return get_file(s, req, r);
    if (req.method == "POST")
      return put_files(s, req, r);
    return rest_error(*r, 405, "method " + req.method + " not allowed on /files");
  }
  auto slash = req.path.rfind('/');
  std::string service = slash == std::string::npos ? "" : req.path.substr(0, slash);
  std::string method = slash == std::string::npos ? "" : req.path.substr(slash + 1);
  if (service != "/process.Process" && service != "/filesystem.Filesystem")
    return rest_error(*r, 404, "no such endpoint: " + req.method + " " + req.path);
  if (req.method != "POST")
    return connect_error(*r, "unimplemented", "Connect calls are POSTs");
  bool streaming = (service == "/process.Process" && (method == "Start" || method == "Connect")) ||
                   (service == "/filesystem.Filesystem" && method == "WatchDir");
  auto ct = req.header("content-type");
  if (service == "/process.Process" && method == "StreamInput") {
    if (ct.rfind("application/connect+json", 0) != 0 || !req.stream)
      return r->reply(415, "application/json",
                      json{{"code", "invalid_argument"},
                           {"message", "StreamInput is client-streamed: it needs "
                                       "application/connect+json (Connect's JSON codec)"}}
                        .dump());
    return stream_input(s, req, r);
  }
  if (streaming) {
    if (ct.rfind("application/connect+json", 0) != 0)
      return r->reply(415, "application/json",
                      json{{"code", "invalid_argument"},
                           {"message", "a streaming call needs application/connect+json (dsec-e2b "
                                       "speaks Connect's JSON codec only)"}}
                        .dump());
    if (method == "WatchDir")
      return watch_dir(s, req, r);
    return method == "Start" ? start(s, req, r) : attach(s, req, r);
  }
  if (ct.rfind("application/json", 0) != 0)
    return r->reply(415, "application/json",
                    json{{"code", "invalid_argument"},
                         {"message", "a unary call needs application/json (dsec-e2b speaks "
                                     "Connect's JSON codec only)"}}
                      .dump());
  json body;
  try {
    body = req.body.empty() ? json::object() : json::parse(req.body);
    if (!body.is_object())
      throw std::invalid_argument("not an object");
  } catch (const std::exception&) {
    return connect_error(*r, "invalid_argument", "the request body is not a JSON object");
  }
  if (service == "/filesystem.Filesystem" &&
      (method == "GetWatcherEvents" || method == "RemoveWatcher"))
    return watcher_call(s, method, body, r);
  if (service == "/filesystem.Filesystem")
    return as_user(s, user_of(req.header("authorization")),
                   [this, s, method, body, r](expected<std::optional<fs_user>> u) {
                     if (!u)
                       return connect_error(*r, connect_code(u.error_value()),
                                            describe(u.error_value()));
                     if (method == "CreateWatcher")
                       return create_watcher(s, body, base_of(*s, *u), r);
                     fs(s, method, body, *u, r);
                   });
  if (method == "List") {
    json procs = json::array();
    std::lock_guard<std::mutex> g{mu};
    for (auto& [pid, p] : s->procs) {
      json pi{{"config", p->config}, {"pid", pid}};
      if (!p->tag.empty())
        pi["tag"] = p->tag;
      procs.push_back(pi);
    }
    return r->reply(200, "application/json", json{{"processes", procs}}.dump());
  }
  if (method == "SendSignal")
    return signal(s, body, r);
  if (method == "SendInput" || method == "CloseStdin")
    return input(s, method, body, r);
  if (method == "Update")
    return update(s, body, r);
  return connect_error(*r, "unimplemented", "no such method: process." + method);
}

namespace {
// The message of a Connect streaming request's first envelope.
std::optional<json> enveloped(const std::string& body) {
  if (body.size() < 5)
    return std::nullopt;
  uint32_t n = (uint8_t(body[1]) << 24) | (uint8_t(body[2]) << 16) | (uint8_t(body[3]) << 8) |
               uint8_t(body[4]);
  if (body[0] != 0 || body.size() - 5 < n)
    return std::nullopt;
  try {
    auto j = json::parse(body.substr(5, n));
    if (j.is_object())
      return j;
  } catch (...) {
  }
  return std::nullopt;
}

void stream_error(responder& r, const std::string& code, const std::string& msg) {
  r.start_stream(200, "application/connect+json");
  r.write(envelope(2, json{{"error", {{"code", code}, {"message", msg}}}}));
  r.finish();
}

uint32_t pid_of(const json& body) {
  if (body.contains("process") && body["process"].is_object() &&
      body["process"].contains("pid") && body["process"]["pid"].is_number_unsigned())
    return body["process"]["pid"].get<uint32_t>();
  return 0;
}

// pty {size {cols, rows}} (Start, Update): rows, cols.
std::optional<std::pair<uint16_t, uint16_t>> pty_size_of(const json& pty) {
  if (!pty.is_object() || !pty.contains("size") || !pty["size"].is_object())
    return std::nullopt;
  const auto& z = pty["size"];
  auto dim = [&](const char* k) -> uint32_t {
    return z.contains(k) && z[k].is_number_unsigned() ? z[k].get<uint32_t>() : 0;
  };
  uint32_t cols = dim("cols"), rows = dim("rows");
  if (cols == 0 || rows == 0 || cols > 65535 || rows > 65535)
    return std::nullopt;
  return std::pair{static_cast<uint16_t>(rows), static_cast<uint16_t>(cols)};
}

std::chrono::milliseconds keepalive_of(const http_request& req) {
  auto v = req.header("keepalive-ping-interval");
  long secs = 50;
  if (!v.empty())
    secs = std::strtol(v.c_str(), nullptr, 10);
  return std::chrono::milliseconds(std::clamp(secs, 1L, 3600L) * 1000);
}
} // namespace

void gateway::impl::start(std::shared_ptr<sandbox> s, http_request& req,
                          std::shared_ptr<responder> r) {
  auto body = enveloped(req.body);
  if (!body)
    return stream_error(*r, "invalid_argument", "the request is not one enveloped JSON message");
  // pty {size {cols, rows}}: the command on a terminal of its sandbox
  // (exec_request.tty), its input by SendInput {pty}, its size by Update.
  std::optional<std::pair<uint16_t, uint16_t>> pty_size;
  if (body->contains("pty") && !(*body)["pty"].is_null()) {
    auto size = pty_size_of((*body)["pty"]);
    if (!size)
      return stream_error(*r, "invalid_argument",
                          "pty.size must be {cols, rows}, each from 1 to 65535");
    pty_size = *size;
  }
  if (!body->contains("process") || !(*body)["process"].is_object())
    return stream_error(*r, "invalid_argument", "process is missing");
  const auto& pc = (*body)["process"];
  if (!pc.contains("cmd") || !pc["cmd"].is_string() || pc["cmd"].get<std::string>().empty())
    return stream_error(*r, "invalid_argument", "process.cmd must be a non-empty string");
  exec_request x;
  x.cwd = s->cwd;
  x.env = s->env_vars;
  x.stream = true;
  std::vector<std::string> argv{pc["cmd"].get<std::string>()};
  if (pc.contains("args")) {
    if (!pc["args"].is_array())
      return stream_error(*r, "invalid_argument", "process.args must be an array of strings");
    for (auto& a : pc["args"]) {
      if (!a.is_string())
        return stream_error(*r, "invalid_argument", "process.args must be an array of strings");
      argv.push_back(a.get<std::string>());
    }
  }
  if (pc.contains("envs") && pc["envs"].is_object())
    for (auto& [k, v] : pc["envs"].items())
      if (v.is_string() && !k.empty() && k.find('=') == std::string::npos)
        x.env.push_back(k + "=" + v.get<std::string>());
  bool cwd_given = pc.contains("cwd") && pc["cwd"].is_string()
                   && !pc["cwd"].get<std::string>().empty();
  if (cwd_given) {
    auto c = resolve(s->cwd, pc["cwd"].get<std::string>());
    if (!c)
      return stream_error(*r, "invalid_argument", "process.cwd: " + c.error_value().message);
    x.cwd = *c;
  }
  if (auto t = req.header("connect-timeout-ms"); !t.empty())
    x.timeout_ms = std::strtoull(t.c_str(), nullptr, 10);
  // The user the SDK names (`user:` option: Authorization: Basic base64(USER:)):
  // the sandbox looks it up in its image (root: its root, as without one).
  if (auto u = user_of(req.header("authorization")); !u.empty() && u != "root")
    x.user = u;
  // stdin: true keeps the command's stdin open for SendInput and CloseStdin;
  // else it is closed (empty), as envd does.
  x.handle = true;
  x.open_stdin = body->contains("stdin") && (*body)["stdin"].is_boolean()
                 && (*body)["stdin"].get<bool>();
  x.argv = std::move(argv);
  auto p = std::make_shared<process>();
  p->config = pc;
  if (body->contains("tag") && (*body)["tag"].is_string())
    p->tag = (*body)["tag"].get<std::string>();
  auto keepalive = keepalive_of(req);
  // A user's command without a cwd starts in the user's home, as envd's do
  // (the template's cwd may be closed to it: /root).
  if (x.user.empty() || cwd_given)
    return launch(s, std::move(x), p, pty_size, keepalive, r);
  auto user = x.user;
  as_user(s, user, [this, s, x = std::move(x), p, pty_size, keepalive,
                    r](expected<std::optional<fs_user>> u) mutable {
    if (!u)
      return stream_error(*r, connect_code(u.error_value()), describe(u.error_value()));
    x.cwd = (*u)->home;
    launch(s, std::move(x), p, pty_size, keepalive, r);
  });
}

void gateway::impl::launch(std::shared_ptr<sandbox> s, exec_request x,
                           std::shared_ptr<process> p,
                           std::optional<std::pair<uint16_t, uint16_t>> pty_size,
                           std::chrono::milliseconds keepalive, std::shared_ptr<responder> r) {
  if (pty_size) {
    x.tty = true;
    x.rows = pty_size->first;
    x.cols = pty_size->second;
    x.open_stdin = true; // a terminal's input stays open, as envd's does
    p->pty = true;
  }
  {
    std::lock_guard<std::mutex> g{mu};
    p->pid = s->next_pid++;
    s->procs[p->pid] = p;
  }
  // Under p->mu until the handle is kept: output and the end (on CAF's
  // threads) wait for it, and a SendInput that follows the start event finds it.
  std::lock_guard<std::mutex> started{p->mu};
  r->start_stream(200, "application/connect+json");
  r->write(envelope(0, json{{"event", {{"start", {{"pid", p->pid}}}}}}));
  r->keepalive(keepalive, envelope(0, json{{"event", {{"keepalive", json::object()}}}}));
  p->subs.push_back(r);
  auto timeout = x.timeout_ms;
  p->handle = sess(s->key).start(
    s->id, x,
    [p](uint8_t stream, std::string_view data) {
      const char* name = p->pty ? "pty" : stream == 2 ? "stderr" : "stdout";
      auto frame = envelope(0, json{{"event", {{"data", {{name, base64(data)}}}}}});
      std::lock_guard<std::mutex> g{p->mu};
      for (auto& sub : p->subs)
        sub->write(frame);
    },
    [this, s, p, timeout](expected<exec_result> res) {
      std::vector<std::shared_ptr<responder>> subs;
      {
        std::lock_guard<std::mutex> g{mu};
        s->procs.erase(p->pid);
      }
      {
        std::lock_guard<std::mutex> g{p->mu};
        subs.swap(p->subs);
        p->ended = true;
        p->handle.reset();
      }
      std::string tail;
      if (!res) {
        if (sandbox_gone(res.error_value()) || res.error_value().code == errc::not_found)
          forget(s->id);
        tail = envelope(2, json{{"error",
                                 {{"code", sandbox_gone(res.error_value()) ||
                                               res.error_value().code == errc::not_found
                                             ? "unavailable"
                                             : connect_code(res.error_value())},
                                  {"message", "sandbox '" + s->id +
                                                "': " + describe(res.error_value())}}}});
      } else {
        json end{{"exited", res->signal == 0}};
        if (res->signal != 0) {
          end["exitCode"] = -1;
          end["status"] = "signal: " + std::string{strsignal(res->signal)};
        } else {
          end["exitCode"] = res->exit_code;
          end["status"] = "exit status " + std::to_string(res->exit_code);
        }
        if (res->timed_out)
          end["error"] = "the command's timeout of " + std::to_string(timeout) + " ms passed";
        tail = envelope(0, json{{"event", {{"end", end}}}});
        if (res->timed_out)
          tail += envelope(2, json{{"error",
                                    {{"code", "deadline_exceeded"},
                                     {"message", "the command's timeout of " +
                                                   std::to_string(timeout) + " ms passed"}}}});
        else
          tail += envelope(2, json::object());
      }
      for (auto& sub : subs) {
        sub->write(tail);
        sub->finish();
      }
    });
}

void gateway::impl::attach(std::shared_ptr<sandbox> s, http_request& req,
                           std::shared_ptr<responder> r) {
  auto body = enveloped(req.body);
  if (!body)
    return stream_error(*r, "invalid_argument", "the request is not one enveloped JSON message");
  auto pid = pid_of(*body);
  std::shared_ptr<process> p;
  {
    std::lock_guard<std::mutex> g{mu};
    auto it = s->procs.find(pid);
    if (it != s->procs.end())
      p = it->second;
  }
  if (!p)
    return stream_error(*r, "not_found", "process with pid " + std::to_string(pid) + " not found");
  std::lock_guard<std::mutex> g{p->mu};
  if (p->ended)
    return stream_error(*r, "not_found", "process with pid " + std::to_string(pid) + " ended");
  r->start_stream(200, "application/connect+json");
  r->write(envelope(0, json{{"event", {{"start", {{"pid", pid}}}}}}));
  r->keepalive(keepalive_of(req), envelope(0, json{{"event", {{"keepalive", json::object()}}}}));
  p->subs.push_back(r);
}

namespace {
// What a WatchDir stream knows of its watcher (dsec-watch in the sandbox,
// tools/watch): its records come in pieces on CAF's threads.
struct dir_watch {
  std::mutex mu;
  std::string pending;  // a record cut short by its piece
  std::string err;      // the watcher's stderr (its last 4 KiB)
  bool started = false; // the start event was sent: the watch is set
  std::shared_ptr<dsec::process> handle;
};

const char* event_type_of(std::string_view t) {
  if (t == "create") return "EVENT_TYPE_CREATE";
  if (t == "write") return "EVENT_TYPE_WRITE";
  if (t == "remove") return "EVENT_TYPE_REMOVE";
  if (t == "rename") return "EVENT_TYPE_RENAME";
  if (t == "chmod") return "EVENT_TYPE_CHMOD";
  return nullptr;
}

// A watcher's stderr: its last 4 KiB, for the error its end gives.
void keep_tail(std::string& err, std::string_view data) {
  err.append(data);
  if (err.size() > 4096)
    err.erase(0, err.size() - 4096);
}

// dsec-watch's NUL-ended records in `pending` + `data`, each to `each` (a
// record cut short waits in `pending` for the rest).
template <class F>
void take_records(std::string& pending, std::string_view data, F&& each) {
  pending.append(data);
  size_t at = 0;
  for (size_t nul; (nul = pending.find('\0', at)) != std::string::npos; at = nul + 1)
    each(std::string_view{pending.data() + at, nul - at});
  pending.erase(0, at);
  if (pending.size() > 65536) // no record is that long
    pending.clear();
}

// A record as envd's FilesystemEvent ({name, type}); nullopt for "ready",
// "overflow" (envd has no event for it) or anything that is not dsec-watch's.
std::optional<json> event_of(std::string_view rec) {
  auto sp = rec.find(' ');
  const char* type = sp != std::string_view::npos ? event_type_of(rec.substr(0, sp)) : nullptr;
  if (!type)
    return std::nullopt;
  return json{{"name", std::string{rec.substr(sp + 1)}}, {"type", type}};
}

// The command a watch call ({path, recursive}; a relative path from `cwd`,
// the user's home or the sandbox's cwd: base_of)
// asks for: dsec's own watcher from the system layer, as the sandbox's root
// (as the other filesystem calls), from /; the path it watches is its last
// argument. The error is the path's ("path: ...").
expected<exec_request> watcher_request(const std::string& cwd, const json& body) {
  std::string given = body.contains("path") && body["path"].is_string()
                        ? body["path"].get<std::string>()
                        : std::string{};
  auto path = resolve(cwd, given);
  if (!path)
    return make_error(errc::invalid_argument, "path: " + path.error_value().message);
  exec_request x;
  x.argv = {"/.dsec/libexec/watch"};
  if (body.contains("recursive") && body["recursive"].is_boolean()
      && body["recursive"].get<bool>())
    x.argv.push_back("-r");
  x.argv.insert(x.argv.end(), {"--", *path});
  x.cwd = "/";
  x.uid = x.gid = 0;
  x.stream = true;
  x.handle = true;
  return x;
}

// How a watcher's end reads as a Connect error (code, message); an empty code
// is no error: the directory went away, or it was killed once set.
std::pair<std::string, std::string> watcher_end(const expected<exec_result>& res, bool started,
                                                const std::string& where, std::string err,
                                                const std::string& sandbox_id) {
  while (!err.empty() && (err.back() == '\n' || err.back() == ' '))
    err.pop_back();
  if (!res) {
    const auto& e = res.error_value();
    if (e.code == errc::not_found && e.message.find("/.dsec/libexec/watch") != std::string::npos)
      return {"unimplemented", "sandbox '" + sandbox_id + "' has no /.dsec/libexec/watch "
                               "(its node's dsec is older than WatchDir)"};
    return {sandbox_gone(e) ? "unavailable" : connect_code(e),
            "sandbox '" + sandbox_id + "': " + describe(e)};
  }
  if (res->timed_out)
    return {"deadline_exceeded", "the watch's timeout passed"};
  if (res->signal != 0 && started) // killed: its client went away, or the sandbox ends
    return {};
  switch (res->exit_code) {
  case 0: // the directory went away
    if (!started)
      return {"internal", "the watcher of " + where + " ended before it was ready"};
    return {};
  case 3: return {"not_found", "path not found: " + where};
  case 5: return {"invalid_argument", "path is not a directory: " + where};
  default:
    return {"internal", "watching " + where + ": " +
                          (err.empty() ? "exit " + std::to_string(res->exit_code) : err)};
  }
}
} // namespace

// WatchDir {path, recursive}: dsec's watcher (/.dsec/libexec/watch, from the
// system layer) runs in the sandbox as a command with a handle; the stream
// starts once it says `ready`, each record is a filesystem event, and the
// client going away kills it.
void gateway::impl::watch_dir(std::shared_ptr<sandbox> s, http_request& req,
                              std::shared_ptr<responder> r) {
  auto body = enveloped(req.body);
  if (!body)
    return stream_error(*r, "invalid_argument", "the request is not one enveloped JSON message");
  uint64_t timeout_ms = 0;
  if (auto t = req.header("connect-timeout-ms"); !t.empty())
    timeout_ms = std::strtoull(t.c_str(), nullptr, 10);
  auto every = keepalive_of(req);
  // A relative path starts at the user's home, as the other filesystem calls'.
  as_user(s, user_of(req.header("authorization")),
          [this, s, body = std::move(*body), timeout_ms, every,
           r](expected<std::optional<fs_user>> u) {
            if (!u)
              return stream_error(*r, connect_code(u.error_value()), describe(u.error_value()));
            watch_from(s, body, base_of(*s, *u), timeout_ms, every, r);
          });
}

void gateway::impl::watch_from(std::shared_ptr<sandbox> s, const json& body,
                               const std::string& base, uint64_t timeout_ms,
                               std::chrono::milliseconds every, std::shared_ptr<responder> r) {
  auto made = watcher_request(base, body);
  if (!made)
    return stream_error(*r, "invalid_argument", made.error_value().message);
  auto x = std::move(*made);
  x.timeout_ms = timeout_ms;
  auto w = std::make_shared<dir_watch>();
  auto where = x.argv.back();
  std::lock_guard<std::mutex> held{w->mu};
  w->handle = sess(s->key).start(
    s->id, x,
    [w, r, every](uint8_t stream, std::string_view data) {
      std::lock_guard<std::mutex> g{w->mu};
      if (stream == 2)
        return keep_tail(w->err, data);
      take_records(w->pending, data, [&](std::string_view rec) {
        if (rec == "ready" && !w->started) {
          w->started = true;
          r->start_stream(200, "application/connect+json");
          r->write(envelope(0, json{{"start", json::object()}}));
          r->keepalive(every, envelope(0, json{{"keepalive", json::object()}}));
          // Nobody listens any more: the watcher ends.
          std::weak_ptr<dir_watch> ww = w;
          r->on_gone([ww] {
            if (auto w = ww.lock()) {
              std::shared_ptr<dsec::process> h;
              {
                std::lock_guard<std::mutex> g{w->mu};
                h = w->handle;
              }
              if (h)
                h->signal_async(SIGKILL, [](expected<void>) {});
            }
          });
          return;
        }
        if (auto ev = w->started ? event_of(rec) : std::nullopt)
          r->write(envelope(0, json{{"filesystem", *ev}}));
      });
    },
    [this, s, w, r, where, timeout = x.timeout_ms](expected<exec_result> res) {
      std::string err;
      bool started;
      {
        std::lock_guard<std::mutex> g{w->mu};
        started = w->started;
        err = w->err;
        w->handle.reset();
      }
      if (!res && sandbox_gone(res.error_value()))
        forget(s->id);
      auto [code, msg] = watcher_end(res, started, where, err, s->id);
      if (res && res->timed_out)
        msg = "the watch's timeout of " + std::to_string(timeout) + " ms passed";
      if (!code.empty() && !started)
        return stream_error(*r, code, msg);
      r->write(envelope(2, code.empty() ? json::object()
                                        : json{{"error", {{"code", code}, {"message", msg}}}}));
      r->finish();
    });
}

// CreateWatcher {path, recursive}: starts a watcher as WatchDir does, and
// answers {watcherId} once its watch is set (so nothing done after the reply
// is missed), or the error its end gives before that.
void gateway::impl::create_watcher(std::shared_ptr<sandbox> s, const json& body,
                                   const std::string& base, std::shared_ptr<responder> r) {
  auto x = watcher_request(base, body);
  if (!x)
    return connect_error(*r, "invalid_argument", x.error_value().message);
  std::string id;
  {
    std::lock_guard<std::mutex> g{mu};
    if (s->watchers.size() >= max_polled_watchers)
      return connect_error(*r, "resource_exhausted",
                           "sandbox '" + s->id + "' has " + std::to_string(max_polled_watchers) +
                             " watchers already (RemoveWatcher ends one)");
    id = "w" + std::to_string(s->next_watcher++);
  }
  auto w = std::make_shared<polled_watch>();
  auto where = x->argv.back();
  std::lock_guard<std::mutex> held{w->mu};
  w->handle = sess(s->key).start(
    s->id, std::move(*x),
    [this, s, w, r, id](uint8_t stream, std::string_view data) {
      std::lock_guard<std::mutex> g{w->mu};
      if (stream == 2)
        return keep_tail(w->err, data);
      take_records(w->pending, data, [&](std::string_view rec) {
        if (rec == "ready" && !w->started) { // set: answered, and events kept from now
          w->started = true;
          {
            std::lock_guard<std::mutex> gm{mu};
            s->watchers[id] = w;
          }
          r->reply(200, "application/json", json{{"watcherId", id}}.dump());
          return;
        }
        auto ev = w->started ? event_of(rec) : std::nullopt;
        if (!ev)
          return;
        if (w->events.size() >= max_polled_events)
          w->events.pop_front();
        w->events.push_back(std::move(*ev));
      });
    },
    [this, s, w, r, where](expected<exec_result> res) {
      std::lock_guard<std::mutex> g{w->mu};
      w->ended = true;
      w->handle.reset();
      if (!res && sandbox_gone(res.error_value()))
        forget(s->id);
      w->end = watcher_end(res, w->started, where, w->err, s->id);
      if (!w->started) // the call still waits: it hears why
        connect_error(*r, w->end.first.empty() ? "internal" : w->end.first, w->end.second);
    });
}

// GetWatcherEvents {watcherId}: the events since the last call; once the
// watcher ended and they were taken, how it ended (and it is gone).
// RemoveWatcher {watcherId}: kills it. An unknown id is not_found.
void gateway::impl::watcher_call(std::shared_ptr<sandbox> s, const std::string& method,
                                 const json& body, std::shared_ptr<responder> r) {
  std::string id; // Connect's JSON takes a field by its JSON name or its proto name
  for (const char* k : {"watcherId", "watcher_id"})
    if (body.contains(k) && body[k].is_string())
      id = body[k].get<std::string>();
  std::shared_ptr<polled_watch> w;
  {
    std::lock_guard<std::mutex> g{mu};
    if (auto it = s->watchers.find(id); it != s->watchers.end()) {
      w = it->second;
      if (method == "RemoveWatcher")
        s->watchers.erase(it);
    }
  }
  if (!w)
    return connect_error(*r, "not_found", "no watcher '" + id + "' in sandbox '" + s->id + "'");
  std::unique_lock<std::mutex> g{w->mu};
  if (method == "RemoveWatcher") {
    auto h = w->handle;
    g.unlock();
    if (h)
      h->signal_async(SIGKILL, [](expected<void>) {});
    return r->reply(200, "application/json", "{}");
  }
  if (w->ended && w->events.empty()) {
    auto end = w->end;
    g.unlock();
    {
      std::lock_guard<std::mutex> gm{mu};
      s->watchers.erase(id);
    }
    return connect_error(*r, end.first.empty() ? "not_found" : end.first,
                         "watcher '" + id + "' ended: " +
                           (end.first.empty() ? "its directory went away" : end.second));
  }
  json events = json::array();
  for (auto& e : w->events)
    events.push_back(std::move(e));
  w->events.clear();
  g.unlock();
  r->reply(200, "application/json", json{{"events", events}}.dump());
}

std::shared_ptr<dsec::process> gateway::impl::handle_of(sandbox& s, uint32_t pid, responder& r) {
  std::shared_ptr<process> p;
  {
    std::lock_guard<std::mutex> g{mu};
    if (auto it = s.procs.find(pid); it != s.procs.end())
      p = it->second;
  }
  if (p) {
    std::lock_guard<std::mutex> g{p->mu};
    if (p->handle && !p->ended)
      return p->handle;
  }
  connect_error(r, "not_found", "process with pid " + std::to_string(pid) + " not found");
  return nullptr;
}

void gateway::impl::signal(std::shared_ptr<sandbox> s, const json& body,
                           std::shared_ptr<responder> r) {
  int sig = SIGKILL;
  if (body.contains("signal")) {
    const auto& v = body["signal"];
    if (v == "SIGNAL_SIGTERM" || v == 15)
      sig = SIGTERM;
    else if (v == "SIGNAL_SIGKILL" || v == 9)
      sig = SIGKILL;
    else
      return connect_error(*r, "invalid_argument", "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM");
  }
  auto pid = pid_of(body);
  auto h = handle_of(*s, pid, *r);
  if (!h)
    return;
  // The command's process group, by its handle.
  h->signal_async(sig, answer_of(s, r, pid));
}

completion<void> gateway::impl::answer_of(std::shared_ptr<sandbox> s,
                                          std::shared_ptr<responder> r, uint32_t pid,
                                          std::string if_invalid) {
  return [this, s, r, pid, if_invalid](expected<void> res) {
    if (res)
      return r->reply(200, "application/json", "{}");
    const auto& e = res.error_value();
    if (e.code == errc::lost)
      forget(s->id);
    // `closed`: the command ended (its handle says so), not the sandbox.
    if (e.code == errc::not_found || e.code == errc::closed)
      return connect_error(*r, "not_found",
                           "process with pid " + std::to_string(pid) + " not found");
    if (e.code == errc::invalid_argument && !if_invalid.empty())
      return connect_error(*r, "failed_precondition",
                           "process with pid " + std::to_string(pid) + " " + if_invalid);
    connect_error(*r, connect_code(e), describe(e));
  };
}

// Update {process: {pid}, pty: {size: {cols, rows}}}: a terminal's window
// size, through the command's handle (its foreground process group gets
// SIGWINCH).
void gateway::impl::update(std::shared_ptr<sandbox> s, const json& body,
                           std::shared_ptr<responder> r) {
  if (!body.contains("pty") || body["pty"].is_null())
    return r->reply(200, "application/json", "{}"); // nothing to update
  auto size = pty_size_of(body["pty"]);
  if (!size)
    return connect_error(*r, "invalid_argument",
                         "pty.size must be {cols, rows}, each from 1 to 65535");
  auto pid = pid_of(body);
  auto h = handle_of(*s, pid, *r);
  if (!h)
    return;
  h->resize_async(size->first, size->second, answer_of(s, r, pid, "has no pty"));
}

// SendInput {process: {pid}, input: {stdin: BASE64}} and CloseStdin {process:
// {pid}}: through the command's handle, whose daemon side buffers a bounded
// amount (the reply waits while the command does not read).
namespace {
// Writes `data` to a handle's stdin, one piece (128 KiB) after another, each
// sent once the daemon took the one before; `done` once, with the error if one
// failed.
void write_pieces(std::shared_ptr<dsec::process> h, std::string data,
                  std::function<void(const error*)> done) {
  auto rest = std::make_shared<std::string>(std::move(data));
  auto step = std::make_shared<std::function<void()>>();
  *step = [h, rest, step, done]() {
    if (rest->empty()) {
      // Resetting *step destroys this very lambda (and its captures): what
      // runs after it must be a copy of its own (a use-after-free crashed
      // dsec-e2b now and then at the end of a SendInput).
      auto d = done;
      *step = nullptr; // breaks the cycle
      return d(nullptr);
    }
    auto n = std::min<size_t>(rest->size(), 128 * 1024);
    std::string piece = rest->substr(0, n);
    rest->erase(0, n);
    h->write_async(std::move(piece), [step, done](expected<uint64_t> res) {
      if (!res) {
        auto e = res.error_value();
        *step = nullptr;
        return done(&e);
      }
      (*step)();
    });
  };
  (*step)();
}
} // namespace

void gateway::impl::input(std::shared_ptr<sandbox> s, const std::string& method,
                          const json& body, std::shared_ptr<responder> r) {
  auto pid = pid_of(body);
  std::string data;
  if (method == "SendInput") {
    if (!body.contains("input") || !body["input"].is_object())
      return connect_error(*r, "invalid_argument", "input is missing");
    const auto& in = body["input"];
    // input {pty} types into a terminal; input {stdin} writes to a stdin
    // (both through the handle's stdin verb).
    const char* field = in.contains("pty") ? "pty" : "stdin";
    if (!in.contains(field) || !in[field].is_string())
      return connect_error(*r, "invalid_argument",
                           std::string{"input."} + field + " must be base64 bytes");
    auto d = unbase64(in[field].get<std::string>());
    if (!d)
      return connect_error(*r, "invalid_argument",
                           std::string{"input."} + field + " is not valid base64");
    data = std::move(*d);
  }
  auto h = handle_of(*s, pid, *r);
  if (!h)
    return;
  auto answer = [this, s, r, pid, method](const error* e) {
    if (!e)
      return r->reply(200, "application/json", "{}");
    // `closed` is the command's stdin here (or the command), not the sandbox.
    if (e->code == errc::lost)
      forget(s->id);
    if (e->code == errc::closed)
      return connect_error(*r, "failed_precondition",
                           "process with pid " + std::to_string(pid)
                             + ": its stdin is closed (start it with stdin: true; "
                               "CloseStdin or its end closed it): "
                             + e->message);
    connect_error(*r, connect_code(*e), describe(*e));
  };
  if (method == "CloseStdin")
    return h->close_stdin_async([answer](expected<void> res) {
      answer(res ? nullptr : &res.error_value());
    });
  write_pieces(h, std::move(data), answer);
}

// process.Process/StreamInput (client-streamed): envelopes as they arrive, a
// start {process {pid}} first, then data {input {stdin|pty}} (and keepalives);
// each batch of input goes to the command's handle before the next piece of
// the body is read, so a command that does not read holds the client back. At
// the body's end the answer is an empty message and the end of the stream; a
// failure ends the stream with its error at once (the connection then closes).
void gateway::impl::stream_input(std::shared_ptr<sandbox> s, http_request& req,
                                 std::shared_ptr<responder> r) {
  struct state {
    std::string buf;
    std::shared_ptr<dsec::process> h;
    uint32_t pid = 0;
    bool failed = false;
  };
  auto st = std::make_shared<state>();
  auto fail = [st, r](const std::string& code, const std::string& msg) {
    if (st->failed)
      return;
    st->failed = true;
    r->reply(200, "application/connect+json",
             envelope(2, json{{"error", {{"code", code}, {"message", msg}}}}));
  };
  req.stream->read(
    [this, s, st, fail](std::string data, std::function<void()> more) {
      if (st->failed)
        return;
      st->buf += data;
      std::string out; // the input of every whole envelope so far
      while (st->buf.size() >= 5) {
        uint32_t n = (uint8_t(st->buf[1]) << 24) | (uint8_t(st->buf[2]) << 16) |
                     (uint8_t(st->buf[3]) << 8) | uint8_t(st->buf[4]);
        if (n > (4u << 20))
          return fail("resource_exhausted", "a StreamInput message of " + std::to_string(n) +
                                              " bytes (at most 4 MiB)");
        if (st->buf.size() - 5 < n)
          break;
        auto flags = static_cast<uint8_t>(st->buf[0]);
        json m;
        try {
          m = json::parse(st->buf.substr(5, n));
        } catch (const json::exception&) {
          return fail("invalid_argument", "a StreamInput message is not JSON");
        }
        st->buf.erase(0, 5 + n);
        if (flags != 0 || !m.is_object())
          return fail("invalid_argument", "a StreamInput message must be a JSON object "
                                          "in a plain envelope");
        if (m.contains("start")) {
          if (st->h)
            return fail("invalid_argument", "StreamInput: a second start");
          st->pid = pid_of(m["start"]);
          std::shared_ptr<process> p;
          {
            std::lock_guard<std::mutex> g{mu};
            if (auto it = s->procs.find(st->pid); it != s->procs.end())
              p = it->second;
          }
          if (p) {
            std::lock_guard<std::mutex> g{p->mu};
            if (p->handle && !p->ended)
              st->h = p->handle;
          }
          if (!st->h)
            return fail("not_found", "process with pid " + std::to_string(st->pid) + " not found");
        } else if (m.contains("data")) {
          if (!st->h)
            return fail("invalid_argument", "StreamInput: data before start");
          const auto& d = m["data"];
          const json in = d.is_object() && d.contains("input") ? d["input"] : json::object();
          const char* field = in.contains("pty") ? "pty" : "stdin";
          if (!in.contains(field) || !in[field].is_string())
            return fail("invalid_argument", "data.input.stdin (or .pty) must be base64 bytes");
          auto bytes = unbase64(in[field].get<std::string>());
          if (!bytes)
            return fail("invalid_argument", std::string{"data.input."} + field +
                                              " is not valid base64");
          out += *bytes;
        } else if (!m.contains("keepalive")) {
          return fail("invalid_argument", "StreamInput: a message that is none of start, data, "
                                          "keepalive");
        }
      }
      if (out.empty())
        return more();
      write_pieces(st->h, std::move(out), [this, s, st, fail, more](const error* e) {
        if (!e)
          return more();
        if (e->code == errc::lost)
          forget(s->id);
        if (e->code == errc::closed)
          return fail("failed_precondition",
                      "process with pid " + std::to_string(st->pid) +
                        ": its stdin is closed (start it with stdin: true; CloseStdin or its "
                        "end closed it): " + e->message);
        fail(connect_code(*e), describe(*e));
      });
    },
    [st, fail, r](bool ok) {
      if (st->failed || !ok)
        return; // answered already, or the client went away
      if (!st->buf.empty())
        return fail("invalid_argument", "StreamInput: the body ended inside a message");
      if (!st->h)
        return fail("invalid_argument", "StreamInput: the stream ended before any start");
      r->reply(200, "application/connect+json", envelope(0, json::object()) +
                                                  envelope(2, json::object()));
    });
}

// The user of a /files call: its `username` query parameter (the SDK's
// `user`), else its Authorization header as for the RPCs.
std::string files_user(const http_request& req) {
  if (auto q = req.query.find("username"); q != req.query.end() && !q->second.empty())
    return q->second;
  return user_of(req.header("authorization"));
}

// A shell function for the scripts: `mkdirs DIR OWNER` makes DIR and its
// missing parents, each chowned to OWNER (uid:gid; none when empty), as
// envd makes a user's directories.
constexpr const char* mkdirs_fn =
  "mkdirs() { [ -d \"$1\" ] && return 0; mkdirs \"$(dirname -- \"$1\")\" \"$2\" || return 1; "
  "mkdir -- \"$1\" || return 1; [ -z \"$2\" ] || chown -- \"$2\" \"$1\"; }; ";

std::string owner_of(const std::optional<fs_user>& u) {
  return u ? std::to_string(u->uid) + ":" + std::to_string(u->gid) : std::string{};
}

void gateway::impl::as_user(std::shared_ptr<sandbox> s, const std::string& name,
                            std::function<void(expected<std::optional<fs_user>>)> then) {
  if (name.empty() || name == "root")
    return then(std::optional<fs_user>{});
  std::optional<fs_user> known;
  {
    std::lock_guard<std::mutex> g{mu};
    if (auto it = s->users.find(name); it != s->users.end())
      known = it->second;
  }
  if (known) // (called without mu: `then` may take it)
    return then(std::move(known));
  // Run as the user, the sandbox looks it up in its image (HOME, uid, gid),
  // as for a command: the shell reads its own ids from /proc.
  exec_request x;
  x.argv = {"/bin/sh", "-c",
            "printf '%s\\n' \"$HOME\"; while read -r k a b; do case \"$k\" in Uid:) u=$a;; "
            "Gid:) g=$a;; esac; done < /proc/self/status; echo \"$u $g\""};
  x.user = name;
  x.timeout_ms = 60'000;
  sess(s->key).exec_async(s->id, x, [this, s, name, then](expected<exec_result> r) {
    if (!r) {
      if (sandbox_gone(r.error_value()))
        forget(s->id);
      auto e = r.error_value();
      e.message = "user '" + name + "': " + e.message;
      return then(std::move(e));
    }
    std::istringstream in{r->out};
    fs_user u;
    std::getline(in, u.home);
    if (r->exit_code != 0 || !(in >> u.uid >> u.gid) || u.home.empty() || u.home[0] != '/')
      return then(make_error(errc::invalid_argument,
                             "user '" + name + "': cannot read its home and ids in the sandbox"
                               " (exit " + std::to_string(r->exit_code) + "): " + r->err));
    {
      std::lock_guard<std::mutex> g{mu};
      s->users[name] = u;
    }
    then(std::optional<fs_user>{u});
  });
}

void gateway::impl::fs(std::shared_ptr<sandbox> s, const std::string& method, const json& body,
                       const std::optional<fs_user>& u, std::shared_ptr<responder> r) {
  auto str = [&](const char* k) -> std::string {
    return body.contains(k) && body[k].is_string() ? body[k].get<std::string>() : std::string{};
  };
  const std::string& base = base_of(*s, u);
  auto need = [&](const char* k) -> std::optional<std::string> {
    auto p = resolve(base, str(k));
    if (!p) {
      connect_error(*r, "invalid_argument", std::string{k} + ": " + p.error_value().message);
      return std::nullopt;
    }
    return *p;
  };
  // Exit codes of the scripts: 3 not found, 4 exists already, 5 not a directory.
  auto finish = [this, s, r](std::function<void(const std::string&)> ok) {
    return [this, s, r, ok](expected<exec_result> res) {
      if (!res) {
        if (sandbox_gone(res.error_value()))
          forget(s->id);
        return connect_error(*r, connect_code(res.error_value()), describe(res.error_value()));
      }
      switch (res->exit_code) {
      case 0: return ok(res->out);
      case 3: return connect_error(*r, "not_found", "path not found: " + res->err);
      case 4: return connect_error(*r, "already_exists", "path already exists: " + res->err);
      case 5: return connect_error(*r, "invalid_argument", "path is not a directory: " + res->err);
      default:
        return connect_error(*r, "internal",
                             "exit " + std::to_string(res->exit_code) + ": " + res->err);
      }
    };
  };
  auto one_entry = [r](const std::string& out) {
    auto line = out.substr(0, out.find('\n'));
    auto e = entry_of(line);
    if (!e)
      return connect_error(*r, "internal", "cannot read stat output '" + line + "'");
    r->reply(200, "application/json", json{{"entry", *e}}.dump());
  };
  const std::string fmt = std::string{"'"} + stat_fmt + "'";
  if (method == "Stat") {
    auto p = need("path");
    if (!p)
      return;
    return script(*s, "[ -e \"$1\" ] || [ -L \"$1\" ] || { echo \"$1\" >&2; exit 3; }; stat -c " + fmt + " -- \"$1\"",
                  {*p}, finish(one_entry));
  }
  if (method == "ListDir") {
    auto p = need("path");
    if (!p)
      return;
    uint64_t depth = 1;
    if (body.contains("depth") && body["depth"].is_number_unsigned() && body["depth"].get<uint64_t>() > 0)
      depth = body["depth"].get<uint64_t>();
    return script(*s,
                  "[ -e \"$1\" ] || { echo \"$1\" >&2; exit 3; }; [ -d \"$1\" ] || { echo \"$1\" >&2; exit 5; }; "
                  "find \"$1\" -mindepth 1 -maxdepth \"$2\" -exec stat -c " + fmt + " -- {} +",
                  {*p, std::to_string(depth)}, finish([r](const std::string& out) {
                    json entries = json::array();
                    std::istringstream ss{out};
                    for (std::string line; std::getline(ss, line);)
                      if (auto e = entry_of(line))
                        entries.push_back(*e);
                    r->reply(200, "application/json", json{{"entries", entries}}.dump());
                  }));
  }
  if (method == "MakeDir") {
    auto p = need("path");
    if (!p)
      return;
    // What it makes is the user's (and its missing parents).
    return script(*s, std::string{mkdirs_fn} + "[ -e \"$1\" ] && { echo \"$1\" >&2; exit 4; }; "
                        "mkdirs \"$1\" \"$2\" && stat -c " + fmt + " -- \"$1\"",
                  {*p, owner_of(u)}, finish(one_entry));
  }
  if (method == "Remove") {
    auto p = need("path");
    if (!p)
      return;
    return script(*s, "[ -e \"$1\" ] || [ -L \"$1\" ] || { echo \"$1\" >&2; exit 3; }; rm -rf -- \"$1\"",
                  {*p}, finish([r](const std::string&) { r->reply(200, "application/json", "{}"); }));
  }
  if (method == "Move") {
    auto from = need("source");
    if (!from)
      return;
    auto to = need("destination");
    if (!to)
      return;
    return script(*s, "[ -e \"$1\" ] || [ -L \"$1\" ] || { echo \"$1\" >&2; exit 3; }; "
                      "mkdir -p -- \"$(dirname -- \"$2\")\" && mv -- \"$1\" \"$2\" && stat -c " + fmt + " -- \"$2\"",
                  {*from, *to}, finish(one_entry));
  }
  return connect_error(*r, "unimplemented",
                       "dsec-e2b does not implement filesystem." + method);
}

void gateway::impl::get_file(std::shared_ptr<sandbox> s, http_request& req,
                             std::shared_ptr<responder> r) {
  auto q = req.query.find("path");
  if (q == req.query.end() || q->second.empty())
    return rest_error(*r, 400, "the path query parameter is required");
  as_user(s, files_user(req), [this, s, r, given = q->second](expected<std::optional<fs_user>> u) {
    if (!u)
      return rest_error(*r, http_status(u.error_value()), describe(u.error_value()));
    get_one(s, resolve(base_of(*s, *u), given), r);
  });
}

void gateway::impl::get_one(std::shared_ptr<sandbox> s, expected<std::string> p,
                            std::shared_ptr<responder> r) {
  if (!p)
    return rest_error(*r, 400, "path: " + p.error_value().message);
  sess(s->key).get_async(s->id, *p, [this, s, r, path = *p](expected<std::string> tar) {
    if (!tar) {
      if (sandbox_gone(tar.error_value())) {
        forget(s->id);
        return r->reply(502, "application/json",
                        json{{"code", 502}, {"message", "The sandbox was not found: " + describe(tar.error_value())}, {"sandboxId", s->id}}.dump());
      }
      auto st = http_status(tar.error_value());
      return rest_error(*r, st, st == 404 ? "path '" + path + "' does not exist"
                                          : describe(tar.error_value()));
    }
    auto data = untar_first(*tar, path);
    if (!data)
      return rest_error(*r, http_status(data.error_value()), data.error_value().message);
    r->reply(200, "application/octet-stream", std::move(*data),
             {{"Content-Disposition", "attachment; filename=\"" + basename_of(path) + "\""}});
  });
}

void gateway::impl::put_files(std::shared_ptr<sandbox> s, http_request& req,
                              std::shared_ptr<responder> r) {
  if (!req.header("content-encoding").empty() && req.header("content-encoding") != "identity")
    return rest_error(*r, 400, "Content-Encoding '" + req.header("content-encoding") +
                                 "' is not supported by dsec-e2b (send the file uncompressed)");
  auto ct = req.header("content-type");
  std::string qpath;
  if (auto q = req.query.find("path"); q != req.query.end())
    qpath = q->second;
  std::vector<std::pair<std::string, std::string>> files; // path as given, data
  if (ct.rfind("multipart/form-data", 0) == 0) {
    auto parts = parse_multipart(req.body, ct);
    if (!parts)
      return rest_error(*r, 400, parts.error_value().message);
    if (parts->empty())
      return rest_error(*r, 400, "the form has no part named 'file'");
    for (auto& f : *parts)
      files.emplace_back(qpath.empty() || parts->size() > 1 ? f.filename : qpath,
                         std::move(f.data));
  } else if (ct.rfind("application/octet-stream", 0) == 0) {
    files.emplace_back(qpath, std::move(req.body));
  } else {
    return rest_error(*r, 400, "Content-Type must be multipart/form-data or application/octet-stream, not '" + ct + "'");
  }
  auto given = std::make_shared<decltype(files)>(std::move(files));
  as_user(s, files_user(req), [this, s, r, given](expected<std::optional<fs_user>> u) {
    if (!u)
      return rest_error(*r, http_status(u.error_value()), describe(u.error_value()));
    const std::string& base = base_of(*s, *u);
    std::vector<std::pair<std::string, std::string>> files; // absolute path, data
    for (auto& [path, data] : *given) {
      auto p = resolve(base, path);
      if (!p)
        return rest_error(*r, 400, "path of a file: " + p.error_value().message);
      if (*p == "/")
        return rest_error(*r, 400, "path '" + path + "' is not a file path");
      files.emplace_back(*p, std::move(data));
    }
    put_all(s, std::move(files), *u, r);
  });
}

// One put per file, one after the other; the parent directory is made when
// missing. A user's files and the directories made for them are its own.
void gateway::impl::put_all(std::shared_ptr<sandbox> s,
                            std::vector<std::pair<std::string, std::string>> files,
                            std::optional<fs_user> u, std::shared_ptr<responder> r) {
  struct state {
    std::vector<std::pair<std::string, std::string>> files;
    size_t next = 0;
    json written = json::array();
    bool retried = false;
  };
  auto st = std::make_shared<state>();
  st->files = std::move(files);
  // The chain's step holds itself only weakly; each put's completion holds it
  // strongly, so it lives exactly as long as a put is in flight.
  auto step = std::make_shared<std::function<void()>>();
  std::weak_ptr<std::function<void()>> wstep = step;
  *step = [this, s, r, st, wstep, u] {
    if (st->next == st->files.size())
      return r->reply(200, "application/json", st->written.dump());
    auto& [path, data] = st->files[st->next];
    auto dir = dirname_of(path);
    auto name = basename_of(path);
    auto again = wstep.lock();
    sess(s->key).put_async(s->id, dir, tar_one(name, data, u ? u->uid : 0, u ? u->gid : 0), [this, s, r, st, again, path, dir, name, u](expected<uint64_t> ok) {
      if (!ok) {
        if (sandbox_gone(ok.error_value())) {
          forget(s->id);
          return r->reply(502, "application/json", json{{"code", 502}, {"message", "The sandbox was not found: " + describe(ok.error_value())}, {"sandboxId", s->id}}.dump());
        }
        if (ok.error_value().code == errc::not_found && !st->retried) {
          st->retried = true;
          return script(*s, std::string{mkdirs_fn} + "mkdirs \"$1\" \"$2\"", {dir, owner_of(u)}, [r, again, dir](expected<exec_result> res) {
            if (!res || res->exit_code != 0)
              return rest_error(*r, 400, "cannot make directory '" + dir + "'" + (res ? ": " + res->err : ""));
            (*again)();
          });
        }
        return rest_error(*r, http_status(ok.error_value()), "writing '" + path + "': " + describe(ok.error_value()));
      }
      st->retried = false;
      st->written.push_back(json{{"name", name}, {"type", "file"}, {"path", path}});
      ++st->next;
      (*again)();
    });
  };
  (*step)();
}

// ---- files ---------------------------------------------------------------------------------

expected<std::map<std::string, template_def>> load_templates(const std::string& path) {
  std::ifstream in{path};
  if (!in)
    return make_error(errc::not_found, "--templates: cannot read '" + path + "'");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    return make_error(errc::invalid_argument, "--templates " + path + ": not JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("templates") || !j["templates"].is_object())
    return make_error(errc::invalid_argument,
                 "--templates " + path + ": expected {\"templates\": {NAME: {...}}}");
  std::map<std::string, template_def> out;
  for (auto& [name, t] : j["templates"].items()) {
    auto bad = [&](const std::string& what) {
      return make_error(errc::invalid_argument, "--templates " + path + ": template '" + name + "': " + what);
    };
    if (!t.is_object())
      return bad("not an object");
    template_def d;
    for (auto& [k, v] : t.items()) {
      if (k == "base" || k == "workdir" || k == "cwd" || k == "backend") {
        if (!v.is_string())
          return bad(k + " must be a string");
        auto sv = v.get<std::string>();
        if (k == "base") d.env.base = sv;
        else if (k == "workdir") d.env.workdir = sv;
        else if (k == "backend") d.env.backend = sv;
        else {
          if (sv.empty() || sv[0] != '/')
            return bad("cwd must be an absolute path");
          d.cwd = sv;
        }
      } else if (k == "tools") {
        if (!v.is_array())
          return bad("tools must be an array of NAME@VERSION");
        for (auto& x : v) {
          if (!x.is_string())
            return bad("tools must be an array of NAME@VERSION");
          d.env.tools.push_back(x.get<std::string>());
        }
      } else if (k == "memory" || k == "disk") {
        if (!v.is_string() && !v.is_number_unsigned())
          return bad(k + " must be a size such as \"1g\"");
        uint64_t n = 0;
        if (v.is_string()) {
          auto sz = parse_size(v.get<std::string>(), k);
          if (!sz)
            return bad(sz.error_value().message);
          n = *sz;
        } else {
          n = v.get<uint64_t>();
        }
        (k == "memory" ? d.env.memory : d.env.disk) = n;
      } else if (k == "cpus") {
        if (!v.is_number() || v.get<double>() < 0)
          return bad("cpus must be a number");
        d.env.cpus = v.get<double>();
      } else if (k == "pids") {
        if (!v.is_number_unsigned())
          return bad("pids must be a positive integer");
        d.env.pids = v.get<uint64_t>();
      } else if (k == "network") {
        if (v.is_string()) {
          auto ok = d.env.set_network(v.get<std::string>());
          if (!ok)
            return bad(ok.error_value().message);
        } else if (v.is_object()) {
          (void)d.env.set_network("egress");
          for (auto& [nk, nv] : v.items()) {
            if ((nk != "allow" && nk != "deny") || !nv.is_array())
              return bad("network must be \"none\", \"loopback\" or {\"allow\": [...], \"deny\": [...]}");
            for (auto& rule : nv) {
              if (!rule.is_string())
                return bad("network rules must be strings");
              // (service names are the node's to know: checked at create)
              if (auto ok = parse_net_rule(rule.get<std::string>()); !ok)
                return bad("network." + nk + ": " + ok.error_value().message);
              (nk == "allow" ? d.env.allow : d.env.deny).push_back(rule.get<std::string>());
            }
          }
        } else {
          return bad("network must be \"none\", \"loopback\" or {\"allow\": [...], \"deny\": [...]}");
        }
      } else {
        return bad("unknown field '" + k + "'");
      }
    }
    if (d.env.base.empty())
      return bad("base is required");
    out.emplace(name, std::move(d));
  }
  if (out.empty())
    return make_error(errc::invalid_argument, "--templates " + path + ": no templates");
  return out;
}

expected<std::vector<std::string>> load_keys(const std::string& path) {
  std::ifstream in{path};
  if (!in)
    return make_error(errc::not_found, "--keys: cannot read '" + path + "'");
  static const std::regex re{"e2b_[0-9a-f]+"};
  std::vector<std::string> keys;
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
      line.pop_back();
    if (line.empty() || line[0] == '#')
      continue;
    if (!std::regex_match(line, re))
      return make_error(errc::invalid_argument, "--keys " + path + ":" + std::to_string(n) +
                                             ": not an API key (e2b_ and hex digits)");
    if (std::find(keys.begin(), keys.end(), line) == keys.end())
      keys.push_back(line);
  }
  if (keys.empty())
    return make_error(errc::invalid_argument, "--keys " + path + ": no keys");
  return keys;
}

} // namespace dsec::e2b

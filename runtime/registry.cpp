// registry::pull (see registry.hpp): the Docker Registry HTTP API v2 over libcurl.
#include "runtime/registry.hpp"

#include <curl/curl.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "runtime/fd.hpp"
#include "runtime/io.hpp"
#include "runtime/sha256.hpp"
#include "runtime/sys.hpp"

namespace dsec::registry {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- references ----------------------------------------------------------------------

std::string reference::to_string() const {
  return scheme + "://" + host + "/" + repository + (digest.empty() ? ":" + tag : "@" + digest);
}

std::string reference::default_layer() const {
  auto clean = [](std::string s) {
    for (auto& c : s)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '+'
          && c != '-')
        c = '-';
    while (!s.empty() && !std::isalnum(static_cast<unsigned char>(s.front())))
      s.erase(0, 1);
    if (s.size() > 128)
      s.resize(128);
    return s.empty() ? std::string{"image"} : s;
  };
  auto slash = repository.rfind('/');
  auto name = slash == std::string::npos ? repository : repository.substr(slash + 1);
  return clean(name) + "@" + clean(digest.empty() ? tag : digest.substr(7, 12));
}

bool is_loopback_host(std::string_view hp) {
  std::string host{hp};
  if (!host.empty() && host.front() == '[') {
    auto e = host.find(']');
    host = e == std::string::npos ? host : host.substr(1, e - 1);
  } else if (auto c = host.rfind(':'); c != std::string::npos) {
    host.resize(c);
  }
  if (host == "localhost" || host == "::1")
    return true;
  // 127.0.0.0/8, as four decimal numbers.
  int parts = 0;
  size_t i = 0;
  while (i <= host.size()) {
    auto e = host.find('.', i);
    if (e == std::string::npos)
      e = host.size();
    auto p = host.substr(i, e - i);
    if (p.empty() || p.size() > 3 || !std::all_of(p.begin(), p.end(), ::isdigit)
        || std::stoi(p) > 255)
      return false;
    if (parts == 0 && p != "127")
      return false;
    ++parts;
    i = e + 1;
  }
  return parts == 4;
}

expected<reference> reference::parse(std::string_view text) {
  reference r;
  std::string s{text};
  auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_argument, "bad image reference '" + std::string{text}
                                                + "': " + why);
  };
  if (s.rfind("https://", 0) == 0) {
    s.erase(0, 8);
  } else if (s.rfind("http://", 0) == 0) {
    r.scheme = "http";
    s.erase(0, 7);
  } else if (s.rfind("docker://", 0) == 0) {
    s.erase(0, 9);
  }
  auto slash = s.find('/');
  auto first = s.substr(0, slash);
  if (slash != std::string::npos
      && (first.find('.') != std::string::npos || first.find(':') != std::string::npos
          || first == "localhost" || first.front() == '[')) {
    r.host = first;
    s.erase(0, slash + 1);
  } else {
    if (r.scheme == "http")
      return bad("http:// needs a host");
    r.host = "registry-1.docker.io";
    if (s.find('/') == std::string::npos)
      s = "library/" + s;
  }
  if (auto at = s.find('@'); at != std::string::npos) {
    r.digest = s.substr(at + 1);
    s.resize(at);
    if (!store::is_digest(r.digest))
      return bad("the digest '" + r.digest + "' is not sha256: and 64 lower-case hex digits");
  }
  if (auto colon = s.rfind(':'); colon != std::string::npos && s.find('/', colon) == std::string::npos) {
    r.tag = s.substr(colon + 1);
    s.resize(colon);
  }
  if (r.tag.empty() && r.digest.empty())
    r.tag = "latest";
  r.repository = s;
  if (r.repository.empty())
    return bad("no repository");
  for (char c : r.repository)
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c))
          || c == '/' || c == '.' || c == '_' || c == '-'))
      return bad("the repository '" + r.repository
                 + "' may hold only lower-case letters, digits and / . _ -");
  for (char c : r.tag)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return bad("the tag '" + r.tag + "' may hold only letters, digits and . _ -");
  if (r.scheme == "http" && !is_loopback_host(r.host))
    return bad("http:// is allowed only for a loopback registry (localhost, 127.x, [::1]); "
               "use https");
  return r;
}

// ---- HTTP ------------------------------------------------------------------------------

namespace {

struct curl_global {
  curl_global() { curl_global_init(CURL_GLOBAL_DEFAULT); }
  ~curl_global() { curl_global_cleanup(); }
};

struct easy_deleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct slist_deleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

std::string lower(std::string s) {
  for (auto& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct response {
  long status = 0;
  std::string body; // when not streamed to a file (at most 16 MiB)
  std::map<std::string, std::string> headers; // lower-case names, of the last response
  std::string digest;                          // sha256 of the body bytes
  uint64_t bytes = 0;
};

struct transfer {
  response* resp = nullptr;
  CURL* curl = nullptr;
  int fd = -1; // stream a 200's body here instead of `body`
  std::string path;
  sha256 hash;
  int write_errno = 0;
  bool too_big = false;
  const std::function<void(uint64_t)>* on_bytes = nullptr;
};

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<transfer*>(user);
  std::string_view line{data, size * n};
  if (line.rfind("HTTP/", 0) == 0) {
    t->resp->headers.clear(); // a new response (after a redirect)
    return size * n;
  }
  auto colon = line.find(':');
  if (colon != std::string_view::npos) {
    auto value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
      value.remove_prefix(1);
    while (!value.empty() && (value.back() == '\r' || value.back() == '\n'))
      value.remove_suffix(1);
    t->resp->headers[lower(std::string{line.substr(0, colon)})] = std::string{value};
  }
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<transfer*>(user);
  size_t len = size * n;
  long code = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &code);
  if (code == 200) {
    t->hash.update(data, len);
    t->resp->bytes += len;
    if (t->on_bytes && *t->on_bytes)
      (*t->on_bytes)(t->resp->bytes);
  }
  if (code == 200 && t->fd >= 0) {
    if (!write_all(t->fd, std::string_view{data, len}, t->path)) {
      t->write_errno = errno;
      return 0;
    }
    return len;
  }
  if (t->resp->body.size() + len > (16u << 20)) {
    t->too_big = true;
    return 0;
  }
  t->resp->body.append(data, len);
  return len;
}

// The parameters of a WWW-Authenticate challenge: scheme, then key="value"s.
std::pair<std::string, std::map<std::string, std::string>> parse_challenge(const std::string& h) {
  std::map<std::string, std::string> params;
  auto sp = h.find(' ');
  auto scheme = lower(h.substr(0, sp));
  size_t i = sp == std::string::npos ? h.size() : sp + 1;
  while (i < h.size()) {
    while (i < h.size() && (h[i] == ' ' || h[i] == ','))
      ++i;
    auto eq = h.find('=', i);
    if (eq == std::string::npos)
      break;
    auto key = lower(h.substr(i, eq - i));
    i = eq + 1;
    std::string value;
    if (i < h.size() && h[i] == '"') {
      ++i;
      while (i < h.size() && h[i] != '"') {
        if (h[i] == '\\' && i + 1 < h.size())
          ++i;
        value += h[i++];
      }
      ++i;
    } else {
      while (i < h.size() && h[i] != ',')
        value += h[i++];
    }
    params[key] = value;
  }
  return {scheme, params};
}

// What the registry said went wrong ({"errors":[{"code","message"}]}), if anything.
std::string registry_says(const std::string& body) {
  auto j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("errors") || !j["errors"].is_array()
      || j["errors"].empty() || !j["errors"][0].is_object())
    return {};
  const auto& e = j["errors"][0];
  std::string out;
  if (e.contains("code") && e["code"].is_string())
    out += e["code"].get<std::string>();
  if (e.contains("message") && e["message"].is_string())
    out += (out.empty() ? "" : ": ") + e["message"].get<std::string>();
  return out.substr(0, 200);
}

std::string escape(CURL* c, const std::string& s) {
  char* e = curl_easy_escape(c, s.c_str(), static_cast<int>(s.size()));
  std::string out = e ? e : "";
  curl_free(e);
  return out;
}

class client {
public:
  client(const reference& ref, const pull_options& o) : ref_(ref), o_(o) {}

  // GET `path` of the registry (e.g. /v2/REPO/manifests/TAG), authenticating
  // as the registry asks; a 200's body goes to `fd` (or the response's body).
  expected<response> get(const std::string& path, const std::string& accept, int fd = -1,
                         const std::string& fd_path = {},
                         const std::function<void(uint64_t)>* on_bytes = nullptr) {
    auto url = ref_.scheme + "://" + ref_.host + path;
    for (int attempt = 0;; ++attempt) {
      if (fd >= 0 && (::ftruncate(fd, 0) != 0 || ::lseek(fd, 0, SEEK_SET) != 0))
        return sys_error("cannot truncate", fd_path);
      DSEC_TRY(r, request(url, accept, auth_header_, fd, fd_path, on_bytes));
      if (r.status != 401 || attempt == 1)
        return r;
      auto h = r.headers.find("www-authenticate");
      if (h == r.headers.end())
        return r;
      auto [scheme, params] = parse_challenge(h->second);
      if (scheme == "bearer") {
        DSEC_TRY(tok, token(params));
        auth_header_ = "Authorization: Bearer " + tok;
      } else if (scheme == "basic") {
        if (o_.username.empty())
          return make_error(errc::unauthenticated,
                            "the registry " + ref_.host
                              + " wants credentials (basic auth): give --creds USER:PASS");
        basic_ = true;
      } else {
        return make_error(errc::unsupported, "the registry " + ref_.host
                                               + " asks for an unknown authentication scheme '"
                                               + scheme + "'");
      }
    }
  }

  [[nodiscard]] const reference& ref() const { return ref_; }

private:
  expected<response> request(const std::string& url, const std::string& accept,
                             const std::string& auth, int fd, const std::string& fd_path,
                             const std::function<void(uint64_t)>* on_bytes,
                             bool use_basic = false) {
    static curl_global global;
    std::unique_ptr<CURL, easy_deleter> c{curl_easy_init()};
    if (!c)
      return make_error(errc::system_error, "cannot start libcurl");
    response resp;
    transfer t;
    t.resp = &resp;
    t.curl = c.get();
    t.fd = fd;
    t.path = fd_path;
    t.on_bytes = on_bytes;
    std::unique_ptr<curl_slist, slist_deleter> headers;
    auto add = [&](const std::string& h) {
      headers.reset(curl_slist_append(headers.release(), h.c_str()));
    };
    if (!accept.empty())
      add("Accept: " + accept);
    if (!auth.empty())
      add(auth);
    bool loopback_http = ref_.scheme == "http";
    curl_easy_setopt(c.get(), CURLOPT_URL, url.c_str());
    curl_easy_setopt(c.get(), CURLOPT_HTTPHEADER, headers.get());
    curl_easy_setopt(c.get(), CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c.get(), CURLOPT_MAXREDIRS, 10L);
    // Plain HTTP only where REF allowed it (loopback); redirects never downgrade.
    curl_easy_setopt(c.get(), CURLOPT_PROTOCOLS_STR, loopback_http ? "http,https" : "https");
    curl_easy_setopt(c.get(), CURLOPT_REDIR_PROTOCOLS_STR, loopback_http ? "http,https" : "https");
    curl_easy_setopt(c.get(), CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c.get(), CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(c.get(), CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c.get(), CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c.get(), CURLOPT_USERAGENT, "dsec");
    if (!o_.ca_file.empty())
      curl_easy_setopt(c.get(), CURLOPT_CAINFO, o_.ca_file.c_str());
    if ((basic_ || use_basic) && !o_.username.empty()) {
      curl_easy_setopt(c.get(), CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
      curl_easy_setopt(c.get(), CURLOPT_USERNAME, o_.username.c_str());
      curl_easy_setopt(c.get(), CURLOPT_PASSWORD, o_.password.c_str());
    }
    curl_easy_setopt(c.get(), CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c.get(), CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(c.get(), CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c.get(), CURLOPT_WRITEDATA, &t);
    char errbuf[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(c.get(), CURLOPT_ERRORBUFFER, errbuf);
    auto rc = curl_easy_perform(c.get());
    if (t.write_errno != 0) {
      errno = t.write_errno;
      return sys_error("cannot write", fd_path);
    }
    if (t.too_big)
      return make_error(errc::too_large, url + ": the response is over 16 MiB");
    if (rc != CURLE_OK)
      return make_error(errc::disconnected,
                        "cannot reach " + url + ": " + (errbuf[0] ? errbuf : curl_easy_strerror(rc)));
    curl_easy_getinfo(c.get(), CURLINFO_RESPONSE_CODE, &resp.status);
    resp.digest = "sha256:" + to_hex(t.hash.finish());
    return resp;
  }

  expected<std::string> token(const std::map<std::string, std::string>& params) {
    auto realm = params.find("realm");
    if (realm == params.end() || realm->second.empty())
      return make_error(errc::malformed, "the registry " + ref_.host
                                           + " asks for a bearer token without a realm");
    const auto& url = realm->second;
    bool https = url.rfind("https://", 0) == 0;
    bool http = url.rfind("http://", 0) == 0;
    if (!https && !(http && is_loopback_host(url.substr(7, url.find('/', 7) - 7))))
      return make_error(errc::unauthenticated, "the registry " + ref_.host
                                                 + " names a token realm that is not https: "
                                                 + url.substr(0, 200));
    std::string q = url + (url.find('?') == std::string::npos ? "?" : "&");
    std::unique_ptr<CURL, easy_deleter> c{curl_easy_init()};
    if (auto s = params.find("service"); s != params.end())
      q += "service=" + escape(c.get(), s->second) + "&";
    q += "scope=" + escape(c.get(), "repository:" + ref_.repository + ":pull");
    DSEC_TRY(r, request(q, "application/json", {}, -1, {}, nullptr, !o_.username.empty()));
    if (r.status == 401 || r.status == 403)
      return make_error(errc::unauthenticated,
                        "the registry " + ref_.host + " refused the credentials"
                          + (o_.username.empty() ? std::string{" (none were given: --creds)"}
                                                 : " of " + o_.username)
                          + " (token service: HTTP " + std::to_string(r.status) + ")");
    if (r.status != 200)
      return make_error(errc::unauthenticated, "the token service of " + ref_.host
                                                 + " answered HTTP " + std::to_string(r.status));
    auto j = json::parse(r.body, nullptr, false);
    std::string tok;
    if (!j.is_discarded() && j.is_object()) {
      if (j.contains("token") && j["token"].is_string())
        tok = j["token"].get<std::string>();
      else if (j.contains("access_token") && j["access_token"].is_string())
        tok = j["access_token"].get<std::string>();
    }
    if (tok.empty() || tok.find_first_of("\r\n") != std::string::npos)
      return make_error(errc::malformed, "the token service of " + ref_.host
                                           + " answered no usable token");
    return tok;
  }

  const reference& ref_;
  const pull_options& o_;
  std::string auth_header_;
  bool basic_ = false;
};

const std::string manifest_accept = std::string{oci::oci_manifest} + ", "
                                    + std::string{oci::docker_manifest} + ", "
                                    + std::string{oci::oci_index} + ", "
                                    + std::string{oci::docker_list};

// The error for a non-200 answer to a GET of `what`.
error refused(const response& r, const client& cl, const std::string& what, bool manifest) {
  auto says = registry_says(r.body);
  auto tail = says.empty() ? std::string{} : " (" + says + ")";
  if (r.status == 401 || r.status == 403)
    return make_error(errc::unauthenticated, "the registry " + cl.ref().host
                                               + " refused the credentials for " + what
                                               + ": HTTP " + std::to_string(r.status) + tail);
  if (r.status == 404)
    return make_error(errc::not_found, manifest ? "unknown image reference " + what
                                                    + ": the registry has no such manifest" + tail
                                                : "the registry has no blob " + what + tail);
  return make_error(errc::system_error, "the registry " + cl.ref().host + " answered HTTP "
                                          + std::to_string(r.status) + " for " + what + tail);
}

expected<std::pair<std::string, std::string>> get_manifest(client& cl, const std::string& name,
                                                           const std::string& shown) {
  DSEC_TRY(r, cl.get("/v2/" + cl.ref().repository + "/manifests/" + name, manifest_accept));
  if (r.status != 200)
    return refused(r, cl, shown, true);
  if (store::is_digest(name) && r.digest != name)
    return make_error(errc::malformed, "digest mismatch for manifest " + shown
                                         + ": its bytes hash to " + r.digest
                                         + " (nothing stored)");
  auto type = oci::media_type_of(r.body);
  if (type.empty())
    if (auto ct = r.headers.find("content-type"); ct != r.headers.end())
      type = ct->second.substr(0, ct->second.find(';'));
  return std::pair{r.body, type + "\n" + r.digest};
}

} // namespace

// ---- pull ----------------------------------------------------------------------------

std::string progress_bar(uint64_t done, uint64_t total, double seconds) {
  constexpr int width = 24;
  double f = total > 0 ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total)) : 1;
  int full = static_cast<int>(f * width);
  std::string bar = "[";
  for (int i = 0; i < width; ++i)
    bar += i < full ? '=' : i == full ? '>' : ' ';
  bar += "] ";
  char buf[96];
  double mib = static_cast<double>(done) / (1 << 20), all = static_cast<double>(total) / (1 << 20);
  double rate = seconds > 0 ? mib / seconds : 0;
  std::string eta = "--";
  if (rate > 0 && total > done) {
    auto left = static_cast<long>((all - mib) / rate);
    eta = std::to_string(left / 60) + "m" + (left % 60 < 10 ? "0" : "") + std::to_string(left % 60)
          + "s";
  }
  std::snprintf(buf, sizeof buf, "%3d%% %.1f/%.1f MiB, %.1f MiB/s, %s left",
                static_cast<int>(f * 100), mib, all, rate, eta.c_str());
  return bar + buf;
}

expected<pull_result> pull(store& st, const reference& ref, const layer_ref& as,
                           const pull_options& o) {
  auto started = std::chrono::steady_clock::now();
  pull_result out;
  out.ref = ref;
  if (st.find(as))
    return make_error(errc::already_exists,
                      "layer " + as.to_string()
                        + " already exists (versions are immutable: rm it first or pick a "
                          "new version)");
  client cl{ref, o};
  auto say = [&](const std::string& s, bool live = false) {
    if (o.progress)
      o.progress(s, live);
  };

  const auto shown = ref.to_string();
  DSEC_TRY(first, get_manifest(cl, ref.digest.empty() ? ref.tag : ref.digest, shown));
  auto [body, type_digest] = std::move(first);
  auto nl = type_digest.find('\n');
  auto type = type_digest.substr(0, nl);
  auto digest = type_digest.substr(nl + 1);
  if (oci::is_index_type(type)) {
    DSEC_TRY(entries, oci::parse_index(body, "index " + shown));
    for (auto& e : entries)
      if (auto n = e.media_type.find('\n'); n != std::string::npos)
        e.media_type.resize(n);
    DSEC_TRY(pick, oci::pick_platform(entries, o.plat, "the index of " + shown));
    DSEC_TRY(second, get_manifest(cl, pick.digest, shown + " (" + o.plat.to_string() + ")"));
    body = std::move(second.first);
    digest = pick.digest;
  }
  DSEC_TRY(man, oci::parse_manifest(body, "manifest " + digest));
  out.manifest_digest = digest;

  // The config.
  DSEC_TRY(cr, cl.get("/v2/" + ref.repository + "/blobs/" + man.config.digest, {}));
  if (cr.status != 200)
    return refused(cr, cl, man.config.digest, false);
  if (cr.digest != man.config.digest)
    return make_error(errc::malformed, "digest mismatch for the config of " + shown
                                         + ": its bytes hash to " + cr.digest + ", expected "
                                         + man.config.digest + " (nothing stored)");
  DSEC_TRY(cfg, oci::parse_config(cr.body, "config " + man.config.digest));

  // The layers: into STATE/oci/downloads, each under its digest once it matches.
  auto downloads = st.dir() + "/oci/downloads";
  std::error_code ec;
  fs::create_directories(downloads, ec);
  if (ec)
    return sys_error("cannot create", downloads, ec.value());
  // What a pull killed mid-layer left: its .part-PID file, once PID is gone.
  for (const auto& e : fs::directory_iterator(downloads, ec)) {
    auto name = e.path().filename().string();
    auto dot = name.find(".part-");
    if (dot == std::string::npos)
      continue;
    auto pid = std::atol(name.c_str() + dot + 6);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      fs::remove(e.path(), ec);
  }
  std::vector<oci::layer_source> layers;
  std::vector<std::string> fetched_files;
  // The whole pull's bar: the bytes of the layers still to download.
  auto needs_download = [&](const oci::descriptor& l) {
    struct stat sb{};
    return !st.image_lower_for(l.digest)
           && !(::stat((downloads + "/" + l.digest.substr(7)).c_str(), &sb) == 0
                && S_ISREG(sb.st_mode));
  };
  uint64_t total = 0, done = 0;
  for (const auto& l : man.layers)
    if (needs_download(l))
      total += l.size;
  auto pull_t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < man.layers.size(); ++i) {
    const auto& l = man.layers[i];
    auto file = downloads + "/" + l.digest.substr(7);
    auto label = "layer " + std::to_string(i + 1) + "/" + std::to_string(man.layers.size()) + " "
                 + l.digest.substr(7, 12);
    layers.push_back({file, l.digest, l.media_type, l.digest + " of " + shown});
    fetched_files.push_back(file);
    if (st.image_lower_for(l.digest)) {
      say(label + ": already stored");
      continue;
    }
    struct stat sb{};
    if (::stat(file.c_str(), &sb) == 0 && S_ISREG(sb.st_mode)) {
      ++out.blobs_resumed;
      say(label + ": downloaded by an earlier pull");
      continue;
    }
    auto tmp = file + ".part-" + std::to_string(::getpid());
    unique_fd fd{::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)};
    if (!fd)
      return sys_error("cannot create", tmp);
    auto t0 = std::chrono::steady_clock::now();
    std::function<void(uint64_t)> on_bytes = [&](uint64_t n) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      double all_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - pull_t0).count();
      say(progress_bar(done + n, total, all_s) + "  " + label + ": " + std::to_string(n >> 20)
            + "/" + std::to_string(l.size >> 20) + " MiB, "
            + std::to_string(static_cast<int>(s > 0 ? (n >> 20) / s : 0)) + " MiB/s",
          true);
    };
    auto r = cl.get("/v2/" + ref.repository + "/blobs/" + l.digest, {}, fd.get(), tmp, &on_bytes);
    auto fail = [&](error e) {
      ::unlink(tmp.c_str());
      return e;
    };
    if (!r)
      return fail(std::move(r).error_value());
    if (r->status != 200)
      return fail(refused(*r, cl, l.digest, false));
    if (r->digest != l.digest)
      return fail(make_error(errc::malformed, "digest mismatch for layer " + l.digest + " of "
                                                + shown + ": its bytes hash to " + r->digest
                                                + " (nothing stored)"));
    if (::fsync(fd.get()) != 0 || ::rename(tmp.c_str(), file.c_str()) != 0)
      return fail(sys_error("cannot keep the download", file));
    out.bytes_fetched += r->bytes;
    done += l.size;
    ++out.blobs_fetched;
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    say(label + ": " + std::to_string(r->bytes) + " bytes in " + std::to_string(s).substr(0, 5)
        + " s");
  }

  DSEC_TRY(built, oci::build_image(st, as, layers, cfg.config, digest, shown, o.build));
  out.built = std::move(built);
  for (const auto& f : fetched_files)
    ::unlink(f.c_str());
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return out;
}

} // namespace dsec::registry

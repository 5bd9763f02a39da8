// The gateway's state and its impl, shared by the files that implement it
// (gateway.cpp: control plane and envd; ports.cpp: the sandboxes' ports).
// Private to tools/e2b; no CAF here beyond dsec::client's header.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "actors/client.hpp"
#include "tools/e2b/gateway.hpp"

namespace dsec::e2b {

using json = nlohmann::json;

uint64_t now_ms();
std::string rfc3339(uint64_t ms);
std::string random_hex(size_t bytes);
/// E2B's REST errors: {"code": status, "message": "..."}.
void rest_error(responder& r, int status, const std::string& msg);
int http_status(const error& e);
std::string describe(const error& e);
/// Whether the error says the sandbox itself is gone.
bool sandbox_gone(const error& e);

/// The sandbox and port a request is for: its Host "PORT-ID.DOMAIN" (what the
/// SDK's getHost gives; the port may be out of range), else its E2b-Sandbox-Id
/// and E2b-Sandbox-Port headers (port 0 if that is not a number); nullopt if
/// neither.
/// The egress policy a create or PUT /sandboxes/{id}/network asks of
/// template `tmpl` (egress.cpp): nullopt for the template's own; an error
/// naming the option that would widen it or does not parse.
struct egress_policy {
  std::vector<std::string> allow, deny;
};
expected<std::optional<egress_policy>> egress_of(const std::string& tmpl,
                                                 const template_def& def, const json& network,
                                                 std::optional<bool> internet);

struct host_target {
  unsigned long port = 0;
  std::string id;
};
std::optional<host_target> target_of(const http_request& head);

// ---- state ---------------------------------------------------------------------------

struct process {
  uint32_t pid = 0;
  json config; // ProcessConfig as given
  std::string tag;
  bool pty = false; // started with `pty`: its output is data {pty}, its input input {pty}
  std::mutex mu;
  std::vector<std::shared_ptr<responder>> subs; // streams that get its events
  bool ended = false;
  /// The command's handle in dsec (docs/actors.md "Process handles"): its
  /// stdin (when started with stdin: true) and its signals. Under `mu`.
  std::shared_ptr<dsec::process> handle;
};

// A watcher of CreateWatcher (WatchDir without a stream, as E2B's Python SDK
// uses it): its events wait here for GetWatcherEvents, at most
// max_polled_events (the oldest go first).
constexpr size_t max_polled_events = 10000;
constexpr size_t max_polled_watchers = 64; // a sandbox's
struct polled_watch {
  std::mutex mu;
  std::string pending, err;
  bool started = false, ended = false;
  std::pair<std::string, std::string> end; // its end as a Connect error (code empty: none)
  std::deque<json> events;
  std::shared_ptr<dsec::process> handle;
};

// A user of a sandbox's image, as a filesystem call that names it acts: its
// home (where relative paths start) and the owner of what the call makes.
struct fs_user {
  std::string home;
  uint32_t uid = 0;
  uint32_t gid = 0;
};

// A port of a sandbox that getHost's URLs reach (ports.cpp): where the node
// exposes it, once known; the connections waiting while it is being exposed.
struct sandbox_port {
  std::optional<exposed_port> at;
  std::vector<std::function<void(route)>> waiting;
};

struct sandbox {
  std::string id;
  std::string key;
  std::string tmpl;
  std::string token;
  json metadata = json::object();
  std::vector<std::string> env_vars; // K=V
  std::string cwd;
  const template_def* def = nullptr;
  uint64_t started_ms = 0;
  uint64_t end_ms = 0;
  bool paused = false;
  uint64_t paused_at_ms = 0;
  uint32_t next_pid = 1;
  std::map<uint32_t, std::shared_ptr<process>> procs;
  // CreateWatcher's watchers, by id, until RemoveWatcher (or the sandbox's end).
  std::map<std::string, std::shared_ptr<polled_watch>> watchers;
  uint64_t next_watcher = 1;
  // The users the filesystem calls named, as its image has them (fs_user).
  std::map<std::string, fs_user> users;
  // Its ports as getHost reaches them (under impl::mu); with allowPublicTraffic
  // false, each connection must carry e2b-traffic-access-token: traffic_token.
  std::map<uint16_t, sandbox_port> ports;
  bool restricted = false;
  std::string traffic_token;
};

// Where a filesystem call's relative paths start (watches' too): a user's
// home (as envd's do), else the sandbox's cwd.
inline const std::string& base_of(const sandbox& s, const std::optional<fs_user>& u) {
  return u ? u->home : s.cwd;
}

struct gateway::impl {
  client* c = nullptr;
  gateway_options o;
  std::map<std::string, std::unique_ptr<session>> sessions; // by API key
  std::mutex mu;
  std::map<std::string, std::shared_ptr<sandbox>> sandboxes; // by id

  // ---- lookups -----------------------------------------------------------------
  std::shared_ptr<sandbox> find(const std::string& id) {
    std::lock_guard<std::mutex> g{mu};
    auto it = sandboxes.find(id);
    if (it == sandboxes.end())
      return nullptr;
    auto& s = *it->second;
    if (!s.paused && s.end_ms && now_ms() > s.end_ms + 2000) {
      // Past its TTL: dsec destroyed it.
      sandboxes.erase(it);
      return nullptr;
    }
    return it->second;
  }
  std::shared_ptr<sandbox> find_for(const std::string& key, const std::string& id) {
    auto s = find(id);
    return s && s->key == key ? s : nullptr;
  }
  void forget(const std::string& id) {
    std::lock_guard<std::mutex> g{mu};
    sandboxes.erase(id);
  }

  session& sess(const std::string& key) { return *sessions.at(key); }

  json sandbox_json(const sandbox& s, bool detail) {
    std::lock_guard<std::mutex> g{mu};
    json j{{"sandboxID", s.id},
           {"templateID", s.tmpl},
           {"alias", s.tmpl},
           {"clientID", "dsec"},
           {"envdVersion", envd_version},
           {"startedAt", rfc3339(s.started_ms)},
           {"endAt", rfc3339(s.paused ? s.end_ms + (now_ms() - s.paused_at_ms) : s.end_ms)},
           {"state", s.paused ? "paused" : "running"},
           {"cpuCount", s.def->env.cpus > 0 ? static_cast<int>(s.def->env.cpus + 0.999) : 1},
           {"memoryMB", s.def->env.memory / (1024 * 1024)},
           {"diskSizeMB", s.def->env.disk / (1024 * 1024)},
           {"metadata", s.metadata}};
    if (detail) {
      j["envdAccessToken"] = s.token;
      j["domain"] = domain_json();
      j["network"] = json{{"allowPublicTraffic", !s.restricted}};
      if (s.restricted)
        j["trafficAccessToken"] = s.traffic_token;
    }
    return j;
  }
  json domain_json() const { return o.domain.empty() ? json(nullptr) : json(o.domain); }
  json created_json(const sandbox& s) {
    json j{{"sandboxID", s.id},      {"templateID", s.tmpl},
           {"alias", s.tmpl},        {"clientID", "dsec"},
           {"envdVersion", envd_version}, {"envdAccessToken", s.token},
           {"domain", domain_json()}};
    if (s.restricted)
      j["trafficAccessToken"] = s.traffic_token;
    return j;
  }

  // ---- control plane -------------------------------------------------------------
  void control(http_request& req, std::shared_ptr<responder> r);
  void create(const std::string& key, http_request& req, std::shared_ptr<responder> r);
  void kill(const std::string& key, const std::string& id, std::shared_ptr<responder> r);
  void set_timeout(const std::string& key, const std::string& id, http_request& req,
                   std::shared_ptr<responder> r);
  void list(const std::string& key, http_request& req, std::shared_ptr<responder> r, bool v2);
  void connect(const std::string& key, const std::string& id, http_request& req,
               std::shared_ptr<responder> r, bool resume_only);
  void pause(const std::string& key, const std::string& id, std::shared_ptr<responder> r);
  /// PUT /sandboxes/{id}/network: the template's policy narrowed by the body.
  void update_network(const std::string& key, const std::string& id, http_request& req,
                      std::shared_ptr<responder> r);

  // ---- sandboxes' ports (ports.cpp) ------------------------------------------------
  /// gateway::tunnel: a request for PORT-ID.DOMAIN (or E2b-Sandbox-Port).
  bool tunnel(const http_request& head, std::function<void(route)> decide);
  /// Hands `decide` where `port` of `s` is exposed, exposing it first.
  void reach(std::shared_ptr<sandbox> s, uint16_t port, std::function<void(route)> decide);

  // ---- sandbox endpoint ----------------------------------------------------------
  void envd(http_request& req, std::shared_ptr<responder> r);
  void start(std::shared_ptr<sandbox> s, http_request& req, std::shared_ptr<responder> r);
  /// Start's second half: the command runs, its stream begins with its pid.
  void launch(std::shared_ptr<sandbox> s, exec_request x, std::shared_ptr<process> p,
              std::optional<std::pair<uint16_t, uint16_t>> pty_size,
              std::chrono::milliseconds keepalive, std::shared_ptr<responder> r);
  void attach(std::shared_ptr<sandbox> s, http_request& req, std::shared_ptr<responder> r);
  void signal(std::shared_ptr<sandbox> s, const json& body, std::shared_ptr<responder> r);
  void update(std::shared_ptr<sandbox> s, const json& body, std::shared_ptr<responder> r);
  void input(std::shared_ptr<sandbox> s, const std::string& method, const json& body,
             std::shared_ptr<responder> r);
  /// process.Process/StreamInput: the body's envelopes as they arrive.
  void stream_input(std::shared_ptr<sandbox> s, http_request& req, std::shared_ptr<responder> r);
  /// The reply to a process verb done through its handle (signal, update):
  /// {} once done; not_found for a command that ended; an invalid_argument
  /// as failed_precondition "process with pid N IF_INVALID" when given.
  completion<void> answer_of(std::shared_ptr<sandbox> s, std::shared_ptr<responder> r,
                             uint32_t pid, std::string if_invalid = {});
  /// The handle of the running process `pid` of `s`; replies not_found otherwise.
  std::shared_ptr<dsec::process> handle_of(sandbox& s, uint32_t pid, responder& r);
  void fs(std::shared_ptr<sandbox> s, const std::string& method, const json& body,
          const std::optional<fs_user>& u, std::shared_ptr<responder> r);
  /// The user `name` of `s`'s image (looked up once, by a command run as it),
  /// for a filesystem call: nullopt for root or no name (paths start at the
  /// sandbox's cwd, what is made is root's); `then` runs once.
  void as_user(std::shared_ptr<sandbox> s, const std::string& name,
               std::function<void(expected<std::optional<fs_user>>)> then);
  void watch_dir(std::shared_ptr<sandbox> s, http_request& req, std::shared_ptr<responder> r);
  void watch_from(std::shared_ptr<sandbox> s, const json& body, const std::string& base,
                  uint64_t timeout_ms, std::chrono::milliseconds every,
                  std::shared_ptr<responder> r);
  void create_watcher(std::shared_ptr<sandbox> s, const json& body, const std::string& base,
                      std::shared_ptr<responder> r);
  void watcher_call(std::shared_ptr<sandbox> s, const std::string& method, const json& body,
                    std::shared_ptr<responder> r);
  void get_file(std::shared_ptr<sandbox> s, http_request& req, std::shared_ptr<responder> r);
  void get_one(std::shared_ptr<sandbox> s, expected<std::string> path,
               std::shared_ptr<responder> r);
  void put_all(std::shared_ptr<sandbox> s, std::vector<std::pair<std::string, std::string>> files,
               std::optional<fs_user> u, std::shared_ptr<responder> r);
  void put_files(std::shared_ptr<sandbox> s, http_request& req, std::shared_ptr<responder> r);

  // A shell script run in the sandbox (collected), for the filesystem calls.
  void script(const sandbox& s, std::string text, std::vector<std::string> args,
              completion<exec_result> done) {
    exec_request x;
    x.argv = {"/bin/sh", "-c", std::move(text), "sh"};
    for (auto& a : args)
      x.argv.push_back(std::move(a));
    x.cwd = s.cwd;
    x.timeout_ms = 60'000;
    x.max_output = 64ull << 20;
    sess(s.key).exec_async(s.id, x, std::move(done));
  }
};

} // namespace dsec::e2b

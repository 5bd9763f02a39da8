#include "actors/warm_pool.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "runtime/units.hpp"

namespace dsec {

std::string pool_key(const environment& e) {
  // Every field that shapes the sandbox (layers, snapshot, limits, network
  // and its policy, exposed ports, host mounts, Chronus): a create must
  // never get a sandbox of another policy or with another's mounts. Only the
  // TTL (set at the claim) is left out, and the backend is a container's
  // for the function backend (whose sandboxes are containers); a microVM
  // pool is one of microVMs.
  auto k = e;
  k.ttl_ms = 0;
  if (k.backend != "microvm")
    k.backend = std::string{backend_container};
  return k.to_json();
}

bool poolable(const environment& e) {
  return e.backend == backend_container || e.backend == backend_function
         || e.backend == "microvm";
}

expected<pool_spec> parse_pool_spec(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_argument, "--pool '" + text + "': " + why
                                                + " (expected NAME@VERSION=N[,workdir=W@V]"
                                                  "[,tool=T@V][,memory=SIZE][,net][,chronus][,microvm])");
  };
  pool_spec out;
  std::vector<std::string> parts;
  std::stringstream ss(text);
  for (std::string p; std::getline(ss, p, ',');)
    parts.push_back(p);
  if (parts.empty())
    return bad("empty");
  auto eq = parts[0].rfind('=');
  if (eq == std::string::npos || eq == 0)
    return bad("no base layer and size");
  out.env.base = parts[0].substr(0, eq);
  if (out.env.base.find('@') == std::string::npos)
    return bad("the base layer must be NAME@VERSION");
  auto n = parts[0].substr(eq + 1);
  char* end = nullptr;
  unsigned long v = std::strtoul(n.c_str(), &end, 10);
  if (n.empty() || *end != 0 || v > 4096)
    return bad("the size must be a number from 0 to 4096");
  out.size = static_cast<uint32_t>(v);
  for (size_t i = 1; i < parts.size(); ++i) {
    const auto& p = parts[i];
    auto val = [&](const char* key) -> std::optional<std::string> {
      std::string pre = std::string(key) + "=";
      if (p.rfind(pre, 0) == 0)
        return p.substr(pre.size());
      return std::nullopt;
    };
    if (p == "net")
      out.env.net = true;
    else if (p == "microvm")
      out.env.backend = "microvm";
    else if (p == "chronus")
      out.env.chronus = true;
    else if (auto w = val("workdir"))
      out.env.workdir = *w;
    else if (auto t = val("tool"))
      out.env.tools.push_back(*t);
    else if (auto m = val("memory")) {
      auto sz = parse_size(*m, "memory");
      if (!sz)
        return bad(sz.error_value().message);
      out.env.memory = *sz;
    } else
      return bad("unknown part '" + p + "'");
  }
  return out;
}

bool memory_pressure(const std::string& psi_file, double avg10) {
  if (!psi_file.empty()) {
    std::ifstream in(psi_file);
    std::string line;
    while (in && std::getline(in, line)) {
      if (line.rfind("some ", 0) != 0)
        continue;
      auto at = line.find("avg10=");
      if (at == std::string::npos)
        break;
      return std::strtod(line.c_str() + at + 6, nullptr) >= avg10;
    }
    if (in.is_open() || line.rfind("some ", 0) == 0)
      return false; // read, and nothing says pressure
  }
  std::ifstream mi("/proc/meminfo");
  uint64_t total = 0, avail = 0;
  for (std::string k; mi >> k;) {
    uint64_t v = 0;
    mi >> v;
    if (k == "MemTotal:")
      total = v;
    else if (k == "MemAvailable:")
      avail = v;
    mi.ignore(64, '\n');
  }
  return total > 0 && avail * 20 < total;
}

uint64_t warm_pools::set(const environment& env, const std::string& asked_key,
                         const session_actor& owner, const std::string& owner_id, uint32_t size,
                         std::vector<std::string>& orphans) {
  auto key = pool_key(env);
  auto addr = owner.address();
  for (auto it = pools_.begin(); it != pools_.end(); ++it) {
    auto& p = it->second;
    if (p.key != key || p.owner.address() != addr)
      continue;
    if (size == 0) {
      release(p, orphans);
      for (const auto& id : p.warming) {
        member_.erase(id);
        released_.insert(id);
        orphans.push_back(id);
      }
      pools_.erase(it);
      return 0;
    }
    p.target = size;
    p.asked_key = asked_key;
    while (p.ready.size() > size) { // the newest go
      auto id = p.ready.back();
      p.ready.pop_back();
      member_.erase(id);
      released_.insert(id);
      orphans.push_back(id);
      ++p.evicted;
    }
    return p.id;
  }
  if (size == 0)
    return 0;
  auto id = next_++;
  auto& p = pools_[id];
  p.id = id;
  p.key = std::move(key);
  p.asked_key = asked_key;
  p.env = env;
  p.owner = owner;
  p.owner_id = owner_id;
  p.target = size;
  return id;
}

void warm_pools::release(pool& p, std::vector<std::string>& orphans) {
  for (const auto& id : p.ready) {
    member_.erase(id);
    released_.insert(id);
    orphans.push_back(id);
    ++p.evicted;
  }
  p.ready.clear();
}

void warm_pools::drop_owner(const caf::actor_addr& owner, std::vector<std::string>& orphans) {
  drop_where([&](const pool& p) { return p.owner && p.owner.address() == owner; }, orphans);
}

void warm_pools::drop_sessions(std::vector<std::string>& orphans) {
  drop_where([](const pool& p) { return static_cast<bool>(p.owner); }, orphans);
}

void warm_pools::drop_where(const std::function<bool(const pool&)>& drop,
                            std::vector<std::string>& orphans) {
  for (auto it = pools_.begin(); it != pools_.end();) {
    if (drop(it->second)) {
      release(it->second, orphans);
      for (const auto& id : it->second.warming) {
        member_.erase(id);
        released_.insert(id);
        orphans.push_back(id);
      }
      it = pools_.erase(it);
    } else {
      ++it;
    }
  }
}

std::optional<std::string> warm_pools::take(const environment& env,
                                            const caf::actor_addr& session) {
  if (pools_.empty())
    return std::nullopt;
  auto key = pool_key(env);
  pool* best = nullptr;
  for (auto& [id, p] : pools_) {
    if (p.key != key || p.ready.empty())
      continue;
    if (p.owner && p.owner.address() == session) {
      best = &p; // its own first
      break;
    }
    if (!p.owner && !best)
      best = &p;
  }
  if (!best)
    return std::nullopt;
  auto id = best->ready.front(); // the oldest: the longest warm
  best->ready.pop_front();
  member_.erase(id);
  ++best->claimed;
  return id;
}

std::optional<std::string> warm_pools::evict(bool only_microvm) {
  auto eligible = [&](const pool& p) { return !only_microvm || p.env.backend == "microvm"; };
  pool* most = nullptr;
  for (auto& [id, p] : pools_)
    if (eligible(p) && !p.ready.empty() && (!most || p.ready.size() > most->ready.size()))
      most = &p;
  if (!most) {
    // Then one still being made.
    for (auto& [pid, p] : pools_)
      if (eligible(p) && !p.warming.empty()) {
        auto id = *p.warming.begin();
        p.warming.erase(p.warming.begin());
        member_.erase(id);
        released_.insert(id);
        ++p.evicted;
        return id;
      }
    return std::nullopt;
  }
  auto id = most->ready.back();
  most->ready.pop_back();
  member_.erase(id);
  released_.insert(id);
  ++most->evicted;
  return id;
}

void warm_pools::warming(uint64_t pool, const std::string& id) {
  auto it = pools_.find(pool);
  if (it == pools_.end())
    return;
  it->second.warming.insert(id);
  ++it->second.refills;
  member_[id] = pool;
}

bool warm_pools::ready(const std::string& id) {
  auto m = member_.find(id);
  if (m == member_.end())
    return released_.count(id) > 0;
  auto& p = pools_.at(m->second);
  p.warming.erase(id);
  p.ready.push_back(id);
  return true;
}

bool warm_pools::gone(const std::string& id) {
  if (released_.erase(id) > 0)
    return true;
  auto m = member_.find(id);
  if (m == member_.end())
    return false;
  auto& p = pools_.at(m->second);
  p.warming.erase(id);
  std::erase(p.ready, id);
  member_.erase(m);
  return true;
}

std::vector<std::pair<uint64_t, uint32_t>> warm_pools::wanted(uint32_t room) const {
  std::vector<std::pair<uint64_t, uint32_t>> out;
  if (pressure_ || room == 0)
    return out;
  for (const auto& [id, p] : pools_) {
    auto have = static_cast<uint32_t>(p.ready.size() + p.warming.size());
    if (have < p.target)
      out.emplace_back(id, p.target - have);
  }
  // The emptiest first, then one at a time round the pools until no room.
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.second > b.second; });
  std::vector<std::pair<uint64_t, uint32_t>> fair;
  uint32_t left = room;
  for (auto& w : out) {
    uint32_t k = std::min(w.second, left);
    if (k == 0)
      break;
    fair.emplace_back(w.first, k);
    left -= k;
  }
  return fair;
}

const warm_pools::pool* warm_pools::find(uint64_t id) const {
  auto it = pools_.find(id);
  return it == pools_.end() ? nullptr : &it->second;
}

void warm_pools::set_pressure(bool on, std::vector<std::string>& orphans) {
  if (on && !pressure_)
    for (auto& [id, p] : pools_)
      release(p, orphans);
  pressure_ = on;
}

std::vector<pool_info> warm_pools::infos(const std::string& node) const {
  std::vector<pool_info> out;
  for (const auto& [id, p] : pools_) {
    pool_info i;
    i.node = node;
    i.env = p.env;
    i.owner = p.owner_id;
    i.target = p.target;
    i.ready = static_cast<uint32_t>(p.ready.size());
    i.warming = static_cast<uint32_t>(p.warming.size());
    i.claimed = p.claimed;
    i.refills = p.refills;
    i.evicted = p.evicted;
    i.key = p.asked_key;
    out.push_back(std::move(i));
  }
  return out;
}

} // namespace dsec

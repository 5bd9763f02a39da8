#include "actors/trajectory.hpp"
#include "actors/types.hpp"

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include <algorithm>
#include <filesystem>
#include <cstring>
#include <unordered_map>

#include "runtime/chronus.hpp"
#include "runtime/sha256.hpp"
#include "runtime/trajectory.hpp"

namespace dsec {

std::string encode_record(const trajectory_record& r) {
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  auto copy = r;
  if (auto err = sink(copy))
    throw std::logic_error("serializing a trajectory record failed"); // a bug
  return {buf.begin(), buf.end()};
}

expected<trajectory_record> decode_record(std::string_view bytes) {
  trajectory_record r;
  caf::binary_deserializer source{nullptr, bytes.data(), bytes.size()};
  if (auto err = source(r))
    return make_error(errc::malformed, "a trajectory record does not parse: "
                                         + in_words(err));
  if (source.remaining() != 0)
    return make_error(errc::malformed, "a trajectory record has "
                                         + std::to_string(source.remaining())
                                         + " bytes too many");
  return r;
}

std::vector<std::string> expire_trajectories(const std::string& root, std::chrono::milliseconds keep,
                                             const std::function<bool(const std::string&)>& live) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  std::error_code ec;
  auto now = fs::file_time_type::clock::now();
  for (const auto& e : fs::directory_iterator(root, ec)) {
    auto id = e.path().filename().string();
    if (live(id))
      continue;
    // By its log's time; a dir without a log (a node's, of packs only) by the
    // newer of packs/ (a pack added) and its own.
    auto t = fs::last_write_time(e.path() / "log", ec);
    if (ec) {
      t = fs::file_time_type::min();
      bool any = false;
      for (const auto& p : {e.path() / "packs", e.path()}) {
        auto pt = fs::last_write_time(p, ec);
        if (!ec) {
          t = std::max(t, pt);
          any = true;
        }
      }
      if (!any)
        continue;
    }
    auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(now - t);
    if (idle < keep)
      continue;
    fs::remove_all(e.path(), ec);
    if (!ec)
      removed.push_back("the trajectory log of session " + id + " (unused for "
                        + std::to_string(idle.count() / 3'600'000) + " h)");
  }
  return removed;
}

bool same_command(const exec_request& a, const exec_request& b) {
  return a.argv == b.argv && a.env == b.env && a.cwd == b.cwd && a.uid == b.uid
         && a.gid == b.gid && a.input == b.input && a.trusted == b.trusted
         && a.pristine == b.pristine && a.transfer == b.transfer
         && a.transfer_path == b.transfer_path && a.user == b.user;
}

namespace {

// A tar number field: octal digits (NUL or space terminated), or GNU base-256.
bool tar_number(const char* f, size_t n, uint64_t& out) {
  out = 0;
  auto u = reinterpret_cast<const unsigned char*>(f);
  if (u[0] & 0x80) {
    for (size_t i = 1; i < n; ++i)
      out = (out << 8) | u[i];
    return true;
  }
  size_t i = 0;
  while (i < n && (f[i] == ' ' || f[i] == '\0'))
    ++i;
  bool any = false;
  for (; i < n && f[i] >= '0' && f[i] <= '7'; ++i) {
    out = out * 8 + static_cast<uint64_t>(f[i] - '0');
    any = true;
  }
  return any || i <= n;
}

} // namespace

std::string put_digest(const std::string& tar) {
  auto whole = [&] {
    sha256 h;
    h.update(tar.data(), tar.size());
    return to_hex(h.finish());
  };
  sha256 h;
  size_t off = 0;
  bool ended = false;
  while (off + 512 <= tar.size()) {
    const char* hdr = tar.data() + off;
    if (std::all_of(hdr, hdr + 512, [](char c) { return c == 0; })) {
      ended = true; // the end
      break;
    }
    uint64_t size = 0;
    if (!tar_number(hdr + 124, 12, size) || size > tar.size())
      return whole();
    char block[512];
    std::memcpy(block, hdr, 512);
    std::memset(block + 136, 0, 12); // mtime
    std::memset(block + 148, 0, 8);  // checksum (covers the mtime)
    h.update(block, 512);
    off += 512;
    size_t padded = static_cast<size_t>((size + 511) / 512 * 512);
    if (off + padded > tar.size())
      return whole();
    char type = hdr[156];
    if (type == 'x' || type == 'g') {
      // pax records "LEN KEY=VALUE\n": all but the times
      std::string_view recs{tar.data() + off, static_cast<size_t>(size)};
      while (!recs.empty()) {
        size_t sp = recs.find(' ');
        if (sp == std::string_view::npos)
          return whole();
        size_t len = 0;
        for (size_t i = 0; i < sp; ++i) {
          if (recs[i] < '0' || recs[i] > '9')
            return whole();
          len = len * 10 + static_cast<size_t>(recs[i] - '0');
        }
        if (len <= sp || len > recs.size())
          return whole();
        auto rec = recs.substr(0, len);
        auto key = rec.substr(sp + 1, rec.find('=') - sp - 1);
        if (key != "mtime" && key != "atime" && key != "ctime")
          h.update(rec.data(), rec.size());
        recs.remove_prefix(len);
      }
    } else {
      h.update(tar.data() + off, static_cast<size_t>(size));
    }
    off += padded;
  }
  if (!ended)
    return whole(); // no end-of-archive block: not a tar we understand
  return to_hex(h.finish());
}

expected<trajectory_plan> load_trajectory(const std::string& root, const std::string& id) {
  auto path = trajectory_dir(root, id) + "/log";
  uint64_t torn = 0;
  uint32_t format = 0;
  auto raw = trajectory_file::read(path, &torn, &format);
  if (!raw) {
    if (raw.error_value().code == errc::not_found)
      return make_error(errc::not_found, "no trajectory log for session " + id
                                           + " (it kept none, was closed, or never existed)");
    return std::move(raw).error_value();
  }
  if (format != trajectory_format)
    return make_error(errc::unsupported,
                      "trajectory log " + path + " is in record format " + std::to_string(format)
                        + "; this dsecd reads format " + std::to_string(trajectory_format)
                        + " (resume the session with a dsecd of the version that wrote it)");
  trajectory_plan plan;
  plan.torn_bytes = torn;
  plan.records = raw->size();
  std::unordered_map<std::string, size_t> box_of;
  std::unordered_map<uint64_t, size_t> group_of;
  bool opened = false;
  for (size_t i = 0; i < raw->size(); ++i) {
    auto rec = decode_record((*raw)[i]);
    if (!rec)
      return make_error(errc::malformed, "trajectory log " + path + ", record "
                                           + std::to_string(i + 1) + ": "
                                           + rec.error_value().message);
    auto& r = *rec;
    auto find_box = [&]() -> trajectory_plan::box* {
      auto it = box_of.find(r.sandbox);
      return it == box_of.end() ? nullptr : &plan.boxes[it->second];
    };
    auto find_group = [&](uint64_t number, const environment& env, uint32_t count) -> auto& {
      auto it = group_of.find(number);
      if (it == group_of.end()) {
        it = group_of.emplace(number, plan.groups.size()).first;
        trajectory_plan::group g;
        g.number = number;
        g.env = env;
        g.count = count;
        plan.groups.push_back(std::move(g));
      }
      plan.next_group = std::max(plan.next_group, number + 1);
      return plan.groups[it->second];
    };
    switch (r.kind) {
      case trajectory_record::opened:
        plan.options = r.options;
        opened = true;
        break;
      case trajectory_record::created: {
        auto& g = find_group(r.group, r.env, r.group_count);
        if (g.key.empty())
          g.key = r.group_key;
        if (g.tags.empty())
          g.tags = r.tags;
        g.ids.push_back(r.sandbox);
        g.keys.push_back(r.key);
        box_of[r.sandbox] = plan.boxes.size();
        trajectory_plan::box b;
        b.id = r.sandbox;
        b.env = r.env;
        b.group = r.group;
        b.key = r.key;
        b.group_key = r.group_key;
        b.tags = r.tags;
        plan.boxes.push_back(std::move(b));
        break;
      }
      case trajectory_record::failed: {
        auto& g = find_group(r.group, r.env, r.group_count);
        if (g.key.empty())
          g.key = r.group_key;
        g.failures.push_back(make_error(static_cast<errc>(r.fail_code ? r.fail_code : 40),
                                        r.fail_message));
        break;
      }
      case trajectory_record::event: {
        // Kept with its sandbox, before the step logged next (the command
        // that sent it); one that undecodable is left out.
        auto ev = decode_event(as_bytes(r.bytes));
        if (!ev)
          break;
        r.sandbox = ev->sandbox_id;
        if (auto* b = find_box())
          b->events.push_back({b->steps.size(), ev->seq, std::move(r.bytes), {},
                               ev->kind == chronus_kind::feedback});
        break;
      }
      case trajectory_record::answered: {
        auto fb = decode_feedback(as_bytes(r.bytes));
        if (!fb)
          break;
        if (auto* b = find_box())
          for (auto it = b->events.rbegin(); it != b->events.rend(); ++it)
            if (it->seq == fb->request_id) {
              if (it->answer.empty()) // the first answer is the one the command got
                it->answer = std::move(r.bytes);
              break;
            }
        break;
      }
      case trajectory_record::executed:
      case trajectory_record::put:
        if (auto* b = find_box())
          b->steps.push_back(std::move(r));
        break;
      case trajectory_record::network:
        if (auto* b = find_box())
          b->policies.push_back({b->steps.size(), std::move(r.env.allow), std::move(r.env.deny)});
        break;
      case trajectory_record::destroyed:
        if (auto* b = find_box())
          b->destroyed = true;
        break;
      case trajectory_record::truncated:
        if (auto* b = find_box()) {
          if (r.position < b->steps.size())
            b->steps.resize(r.position);
          // The events of the void steps (and of the command cut off) go too.
          std::erase_if(b->events, [&](const trajectory_plan::event& e) {
            return e.position >= r.position;
          });
          // So do the policies set after the last step kept: the rebuilt
          // sandbox's own (a network record after this one) says what it has.
          std::erase_if(b->policies, [&](const trajectory_plan::box::policy& p) {
            return p.position >= r.position;
          });
        }
        break;
      case trajectory_record::resumed:
        break;
      default:
        return make_error(errc::malformed, "trajectory log " + path + ", record "
                                             + std::to_string(i + 1) + " of unknown kind "
                                             + std::to_string(r.kind));
    }
  }
  if (!opened)
    return make_error(errc::malformed, "trajectory log " + path + " does not say how its session"
                                         " was opened (no first record)");
  // A step after which no pack could be taken (a full disk) cannot be rebuilt
  // past: the log of its sandbox ends before it, and a resume runs it again
  // on the state before it.
  for (auto& b : plan.boxes) {
    b.logged = b.steps.size();
    auto bad = std::find_if(b.steps.begin(), b.steps.end(), [](const trajectory_record& r) {
      return !r.pack_error.empty();
    });
    b.steps.erase(bad, b.steps.end());
    // Only the events before a step still logged can be replayed: the others
    // came from a command that runs again (or not) when the trainer gets there.
    std::erase_if(b.events, [&](const trajectory_plan::event& e) {
      return e.position >= b.steps.size();
    });
    plan.events += b.events.size();
  }
  for (auto& g : plan.groups)
    if (g.key.empty())
      g.key = "#" + std::to_string(g.number);
  return plan;
}

} // namespace dsec

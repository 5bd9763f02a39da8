#include "actors/trajectory.hpp"

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include <algorithm>
#include <unordered_map>

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
                                         + caf::to_string(err));
  if (source.remaining() != 0)
    return make_error(errc::malformed, "a trajectory record has "
                                         + std::to_string(source.remaining())
                                         + " bytes too many");
  return r;
}

bool same_command(const exec_request& a, const exec_request& b) {
  return a.argv == b.argv && a.env == b.env && a.cwd == b.cwd && a.uid == b.uid
         && a.gid == b.gid && a.input == b.input && a.trusted == b.trusted;
}

bool same_environment(const environment& a, const environment& b) {
  return a.base == b.base && a.workdir == b.workdir && a.tools == b.tools
         && a.memory == b.memory && a.pids == b.pids && a.cpus == b.cpus && a.disk == b.disk
         && a.net == b.net && a.ttl_ms == b.ttl_ms && a.backend == b.backend
         && a.chronus == b.chronus;
}

expected<trajectory_plan> load_trajectory(const std::string& root, const std::string& id) {
  auto path = trajectory_dir(root, id) + "/log";
  uint64_t torn = 0;
  auto raw = trajectory_file::read(path, &torn);
  if (!raw) {
    if (raw.error_value().code == errc::not_found)
      return make_error(errc::not_found, "no trajectory log for session " + id
                                           + " (it kept none, was closed, or never existed)");
    return std::move(raw).error_value();
  }
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
        plan.groups.push_back({number, env, count, {}});
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
        g.ids.push_back(r.sandbox);
        box_of[r.sandbox] = plan.boxes.size();
        plan.boxes.push_back({r.sandbox, r.env, r.group, {}, false});
        break;
      }
      case trajectory_record::failed:
        find_group(r.group, r.env, r.group_count);
        break;
      case trajectory_record::executed:
      case trajectory_record::put:
        if (auto* b = find_box())
          b->steps.push_back(std::move(r));
        break;
      case trajectory_record::destroyed:
        if (auto* b = find_box())
          b->destroyed = true;
        break;
      case trajectory_record::truncated:
        if (auto* b = find_box(); b && r.position < b->steps.size())
          b->steps.resize(r.position);
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
  return plan;
}

} // namespace dsec

// microvm_disks (runtime/microvm_disks.hpp).
#include "runtime/microvm_disks.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "runtime/cgroup.hpp"
#include "runtime/sha256.hpp"
#include "runtime/store.hpp"

namespace dsec {

namespace fs = std::filesystem;

expected<std::unique_ptr<microvm_disks>> microvm_disks::open(const store& st,
                                                             std::vector<std::string>* collected) {
  auto top = st.dir() + "/microvm-disks";
  if (::mkdir(top.c_str(), 0700) != 0 && errno != EEXIST)
    return sys_error("cannot create", top);
  DSEC_TRY(owner, process_owner_name());
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(top, ec)) {
    auto name = e.path().filename().string();
    if (name == owner || process_owner_alive(name))
      continue;
    std::error_code rec;
    fs::remove_all(e.path(), rec);
    if (collected && !rec)
      collected->push_back(e.path().string());
  }
  auto dir = top + "/" + owner;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return sys_error("cannot create", dir);
  return std::unique_ptr<microvm_disks>(new microvm_disks(st, dir));
}

microvm_disks::~microvm_disks() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

size_t microvm_disks::made() const {
  std::lock_guard lock(mutex_);
  return ready_.size();
}

expected<std::vector<std::string>> microvm_disks::fit(const std::vector<std::string>& images,
                                                      size_t slots) {
  if (images.size() <= slots || slots == 0)
    return images;
  std::vector<std::string> out(images.begin(), images.begin() + static_cast<long>(slots - 1));
  // The lowest ones, lowest first (as flatten takes them).
  std::vector<std::string> merged(images.rbegin(),
                                  images.rbegin() + static_cast<long>(images.size() - slots + 1));
  sha256 h;
  for (const auto& p : merged) {
    h.update(p.data(), p.size());
    h.update("\n", 1);
  }
  auto key = to_hex(h.finish());
  std::unique_lock lock(mutex_);
  for (;;) {
    if (auto it = ready_.find(key); it != ready_.end()) {
      out.push_back(it->second);
      return out;
    }
    if (!building_.count(key))
      break;
    built_.wait(lock); // another VM makes it: wait for its outcome
  }
  building_.insert(key);
  auto tmp = dir_ + "/" + key + ".tmp" + std::to_string(next_tmp_++);
  lock.unlock();
  auto shown = "the lowest " + std::to_string(merged.size()) + " of the VM's "
               + std::to_string(images.size()) + " layer images";
  auto made = store_.flatten(merged, tmp, shown);
  auto path = dir_ + "/" + key + ".erofs";
  std::error_code ec;
  fs::remove_all(tmp + ".root", ec); // flatten's mount point (its child's namespace held the mount)
  expected<void> placed;
  if (made && ::rename(tmp.c_str(), path.c_str()) != 0)
    placed = sys_error("cannot rename", tmp);
  lock.lock();
  building_.erase(key);
  built_.notify_all();
  if (!made || !placed) {
    ::unlink(tmp.c_str());
    return !made ? std::move(made).error_value().in_step("merge_disks")
                 : std::move(placed).error_value().in_step("merge_disks");
  }
  ready_.emplace(key, path);
  out.push_back(path);
  return out;
}

} // namespace dsec

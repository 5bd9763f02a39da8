// The store's file utilities (see store_detail.hpp): the paths of its layout, the
// store lock, staging directories and their cleanup, the no-replace rename.
#include "runtime/store_detail.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "runtime/sys.hpp"

namespace dsec::store_detail {

namespace fs = std::filesystem;

std::string join(std::string_view a, std::string_view b) {
  std::string out{a};
  out += '/';
  out += b;
  return out;
}

std::string refs_dir(const std::string& dir) { return join(dir, "refs"); }
std::string blobs_dir(const std::string& dir) { return join(dir, "blobs/sha256"); }
std::string tmp_dir(const std::string& dir) { return join(dir, "tmp"); }
std::string system_dir(const std::string& dir) { return join(dir, "system"); }

std::string ref_path(const std::string& dir, const layer_ref& ref) {
  return join(refs_dir(dir), ref.to_string());
}

int rename_noreplace(const std::string& from, const std::string& to) {
  int r = ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE);
  if (r != 0 && errno == EINVAL)
    r = ::rename(from.c_str(), to.c_str());
  return r;
}

expected<unique_fd> lock_store(const std::string& dir, int op) {
  auto path = join(dir, "lock");
  unique_fd fd{sys::retry([&] {
    return ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  })};
  if (!fd)
    return sys_error("cannot open store lock", path);
  if (sys::retry([&] { return ::flock(fd.get(), op); }) != 0)
    return sys_error("cannot lock", path);
  return fd;
}

staging_dir::~staging_dir() {
  if (!path_.empty()) {
    std::error_code ec;
    fs::remove_all(path_, ec); // best effort: a leftover is cleaned by open()
  }
  // lock_ closes after the tree is gone, so open() never sees it half removed.
}

expected<staging_dir> staging_dir::create(const std::string& store_dir,
                                          std::string_view prefix) {
  // Under LOCK_SH so that open()'s cleanup (LOCK_EX) cannot see the directory
  // between mkdtemp and flock, when it looks abandoned.
  DSEC_TRY(store_lock, lock_store(store_dir, LOCK_SH));
  std::string templ = join(tmp_dir(store_dir), prefix) + "-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr)
    return sys_error("cannot create staging directory in", tmp_dir(store_dir));
  staging_dir out{templ};
  out.lock_.reset(sys::retry([&] {
    return ::open(templ.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }));
  if (!out.lock_)
    return sys_error("cannot open staging directory", templ);
  if (sys::retry([&] { return ::flock(out.lock_.get(), LOCK_EX); }) != 0)
    return sys_error("cannot lock staging directory", templ);
  return out;
}

expected<void> clean_tmp(const std::string& dir) {
  auto tmp = tmp_dir(dir);
  DIR* d = ::opendir(tmp.c_str());
  if (d == nullptr)
    return sys_error("cannot open", tmp);
  std::vector<std::string> stale;
  while (auto* ent = ::readdir(d)) {
    std::string_view name = ent->d_name;
    if (name == "." || name == "..")
      continue;
    auto path = join(tmp, name);
    // O_NONBLOCK: never hang on a fifo someone dropped here; O_NOFOLLOW: a
    // symlink is removed itself, never what it points to.
    unique_fd fd{::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)};
    if (fd && ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK)
      continue; // a live build owns it
    stale.push_back(std::move(path));
  }
  ::closedir(d);
  for (auto& path : stale) {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec)
      return sys_error("cannot remove stale staging entry", path, ec.value());
  }
  return {};
}

} // namespace dsec::store_detail

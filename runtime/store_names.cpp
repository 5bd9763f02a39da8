// The store's layer names and ref files (see store_detail.hpp): checking a
// layer_ref, the refs/NAME@VERSION format (written, parsed, read), digests, the
// natural order of names and versions; and the verbs over refs: list, find,
// lease, remove, is_digest.
#include "runtime/store_detail.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>

#include "runtime/io.hpp"
#include "runtime/sys.hpp"

namespace dsec {

namespace store_detail {

namespace {

template <class Int>
bool parse_int(std::string_view s, Int& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return !s.empty() && ec == std::errc{} && end == s.data() + s.size();
}

// Compares with digit runs as numbers: "9" < "10", "1.9" < "1.10".
int natural_compare(std::string_view a, std::string_view b) {
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      while (i < a.size() && a[i] == '0')
        ++i;
      while (j < b.size() && b[j] == '0')
        ++j;
      size_t si = i, sj = j;
      while (i < a.size() && digit(a[i]))
        ++i;
      while (j < b.size() && digit(b[j]))
        ++j;
      if (i - si != j - sj)
        return i - si < j - sj ? -1 : 1;
      if (int c = a.substr(si, i - si).compare(b.substr(sj, j - sj)); c != 0)
        return c < 0 ? -1 : 1;
      continue;
    }
    if (a[i] != b[j])
      return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]) ? -1 : 1;
    ++i;
    ++j;
  }
  if (i < a.size())
    return 1;
  if (j < b.size())
    return -1;
  // "01" and "1" are equal as numbers; plain order keeps the sort total.
  int c = a.compare(b);
  return c < 0 ? -1 : (c > 0 ? 1 : 0);
}

} // namespace

expected<void> check_ref(const layer_ref& ref) {
  DSEC_TRY(parsed, parse_layer_ref(ref.to_string()));
  if (!(parsed == ref))
    return make_error(errc::invalid_argument,
                      "malformed layer '" + ref.to_string() + "'");
  return {};
}

error unknown_layer(const layer_ref& ref) {
  return make_error(errc::not_found,
                    "unknown layer " + ref.to_string() + " (see 'dsec layer ls')");
}

namespace {

// Opens the ref file `path` of `ref` read-only; not_found if there is no such layer.
expected<unique_fd> open_ref(const std::string& path, const layer_ref& ref) {
  unique_fd fd{sys::retry([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); })};
  if (!fd)
    return errno == ENOENT ? unknown_layer(ref) : sys_error("cannot open", path);
  return fd;
}

} // namespace

bool valid_digest(std::string_view d) {
  if (d.size() != 7 + 64 || d.substr(0, 7) != "sha256:")
    return false;
  return std::all_of(d.begin() + 7, d.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

std::string blob_path_of(const std::string& dir, std::string_view digest) {
  return join(blobs_dir(dir), digest.substr(7));
}

std::string format_ref(const layer_info& info) {
  std::string out;
  out += "kind=" + std::string{to_string(info.kind)} + '\n';
  out += "digest=" + info.digest + '\n';
  out += "size=" + std::to_string(info.size) + '\n';
  out += "created=" + std::to_string(info.created) + '\n';
  out += "source=" + info.source + '\n';
  // An OCI image (store_image.cpp): its lowers, topmost first, and its config.
  for (const auto& d : info.lowers)
    out += "lower=" + d + '\n';
  if (!info.config.empty())
    out += "config=" + info.config + '\n';
  if (!info.manifest.empty())
    out += "manifest=" + info.manifest + '\n';
  if (!info.on.empty())
    out += "on=" + info.on + '\n';
  return out;
}

expected<layer_info> parse_ref(std::string_view text, const layer_ref& ref,
                               const std::string& path, const std::string& dir) {
  layer_info info;
  info.ref = ref;
  bool has_kind = false, has_size = false, has_created = false;
  auto corrupt = [&](const std::string& why) {
    auto e = make_error(errc::system_error, "corrupt layer ref " + path + ": " + why);
    e.path = path;
    return e;
  };
  while (!text.empty()) {
    auto nl = text.find('\n');
    auto line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line.empty())
      continue;
    auto eq = line.find('=');
    if (eq == std::string_view::npos)
      return corrupt("line '" + std::string{line} + "' is not KEY=VALUE");
    auto key = line.substr(0, eq);
    auto value = line.substr(eq + 1);
    if (key == "kind") {
      auto k = parse_layer_kind(value);
      if (!k)
        return corrupt(k.error_value().message);
      info.kind = *k;
      has_kind = true;
    } else if (key == "digest") {
      if (!valid_digest(value))
        return corrupt("bad digest '" + std::string{value} + "'");
      info.digest = value;
    } else if (key == "size") {
      if (!parse_int(value, info.size))
        return corrupt("bad size '" + std::string{value} + "'");
      has_size = true;
    } else if (key == "created") {
      if (!parse_int(value, info.created))
        return corrupt("bad created '" + std::string{value} + "'");
      has_created = true;
    } else if (key == "on") {
      info.on = value;
    } else if (key == "source") {
      info.source = value;
    } else if (key == "lower") {
      if (!valid_digest(value))
        return corrupt("bad lower '" + std::string{value} + "'");
      info.lowers.emplace_back(value);
    } else if (key == "config") {
      info.config = value;
    } else if (key == "manifest") {
      info.manifest = value;
    }
    // Unknown keys are skipped: a newer dsec may add fields.
  }
  if (!has_kind)
    return corrupt("no kind");
  if (info.digest.empty())
    return corrupt("no digest");
  if (!has_size)
    return corrupt("no size");
  if (!has_created)
    return corrupt("no created");
  if (!info.lowers.empty() && info.lowers.front() != info.digest)
    return corrupt("its first lower is not its digest");
  info.blob_path = blob_path_of(dir, info.digest);
  for (const auto& d : info.digests())
    info.blob_paths.push_back(blob_path_of(dir, d));
  return info;
}

expected<layer_info> read_ref(const std::string& dir, const layer_ref& ref) {
  auto path = ref_path(dir, ref);
  DSEC_TRY(fd, open_ref(path, ref));
  DSEC_TRY(text, read_all(fd.get(), path));
  return parse_ref(text, ref, path, dir);
}

expected<std::vector<layer_info>> read_all_refs(const std::string& dir) {
  auto refs = refs_dir(dir);
  DIR* d = ::opendir(refs.c_str());
  if (d == nullptr)
    return sys_error("cannot open", refs);
  std::vector<layer_ref> names;
  while (auto* ent = ::readdir(d)) {
    std::string_view name = ent->d_name;
    if (name.empty() || name.front() == '.')
      continue;
    if (auto ref = parse_layer_ref(name))
      names.push_back(std::move(*ref));
  }
  ::closedir(d);
  std::vector<layer_info> out;
  out.reserve(names.size());
  for (auto& ref : names) {
    auto info = read_ref(dir, ref);
    if (!info)
      return std::move(info).error_value();
    out.push_back(std::move(*info));
  }
  return out;
}

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 80))
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > 80)
    out += "...";
  return out;
}

error malformed_digest(std::string_view digest, std::string_view what) {
  return make_error(errc::invalid_argument,
                    "malformed digest '" + printable(digest) + "'" + std::string{what}
                      + " (expected sha256: and 64 lower-case hex digits)");
}

} // namespace store_detail

using namespace store_detail;

expected<std::vector<layer_info>> store::list() const {
  DSEC_TRY(lock, lock_store(dir_, LOCK_SH));
  DSEC_TRY(all, read_all_refs(dir_));
  std::sort(all.begin(), all.end(), [](const layer_info& a, const layer_info& b) {
    if (int c = natural_compare(a.ref.name, b.ref.name); c != 0)
      return c < 0;
    return natural_compare(a.ref.version, b.ref.version) < 0;
  });
  return all;
}

expected<layer_info> store::find(const layer_ref& ref) const {
  DSEC_TRY_VOID(check_ref(ref));
  DSEC_TRY(lock, lock_store(dir_, LOCK_SH));
  return read_ref(dir_, ref);
}

expected<layer_lease> store::lease(const layer_ref& ref) const {
  DSEC_TRY_VOID(check_ref(ref));
  // LOCK_SH on the store: remove() takes LOCK_EX before it tests the ref's lock,
  // so it either finished before us (not_found) or sees our lease (in_use).
  DSEC_TRY(lock, lock_store(dir_, LOCK_SH));
  auto path = ref_path(dir_, ref);
  DSEC_TRY(fd, open_ref(path, ref));
  // Never waits: only remove() takes LOCK_EX on a ref, and only under the store's
  // LOCK_EX, which our LOCK_SH excludes.
  if (sys::retry([&] { return ::flock(fd.get(), LOCK_SH); }) != 0)
    return sys_error("cannot lock", path);
  DSEC_TRY(text, read_all(fd.get(), path));
  DSEC_TRY(info, parse_ref(text, ref, path, dir_));
  // A lease is a promise that the images can be mounted; check they are there.
  for (const auto& blob : info.blob_paths)
    if (::access(blob.c_str(), R_OK) != 0) {
      auto e = make_error(errc::system_error, "the image of layer " + ref.to_string()
                                                + " is missing (" + blob + ")");
      e.path = blob;
      e.sys_errno = errno;
      return e;
    }
  return layer_lease{std::move(fd), std::move(info)};
}

expected<void> store::remove(const layer_ref& ref) {
  DSEC_TRY_VOID(check_ref(ref));
  DSEC_TRY(lock, lock_store(dir_, LOCK_EX));
  auto path = ref_path(dir_, ref);
  DSEC_TRY(fd, open_ref(path, ref));
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK)
      return make_error(errc::in_use, "layer " + ref.to_string()
                                        + " is in use by a sandbox; remove the "
                                          "sandboxes that use it first");
    return sys_error("cannot lock", path);
  }
  DSEC_TRY(text, read_all(fd.get(), path));
  // A corrupt ref is still removed (rm is how one gets rid of it); only its blob
  // stays, since we cannot tell which one it is.
  auto info = parse_ref(text, ref, path, dir_);

  if (::unlink(path.c_str()) != 0)
    return sys_error("cannot remove", path);
  DSEC_TRY_VOID(fsync_dir(refs_dir(dir_)));
  if (!info)
    return {};

  // Delete the blob only when no other ref names it. If any other ref cannot be
  // read we cannot prove that, and keep it.
  // (An OCI image's lowers count too: each goes only when no ref has it.)
  auto others = read_all_refs(dir_);
  if (!others)
    return {};
  bool removed = false;
  for (const auto& d : info->digests()) {
    bool shared = false;
    for (const auto& other : *others)
      for (const auto& od : other.digests())
        shared = shared || od == d;
    if (shared)
      continue;
    auto blob = blob_path_of(dir_, d);
    if (::unlink(blob.c_str()) != 0 && errno != ENOENT)
      return sys_error("removed " + ref.to_string() + " but cannot remove its image", blob);
    removed = true;
  }
  if (removed)
    DSEC_TRY_VOID(fsync_dir(blobs_dir(dir_)));
  return {};
}

bool store::is_digest(std::string_view digest) noexcept { return valid_digest(digest); }

} // namespace dsec

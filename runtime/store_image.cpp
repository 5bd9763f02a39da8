// dsec::store (see store.hpp), the part OCI images need (runtime/oci.hpp drives
// it): scratch directories, making one EROFS image of a layer's tree, the index
// from a layer tar's digest to the lower made from it, and committing a base
// made of several lowers.
//
//   STATE/oci/tars/<hex>   one line: the EROFS digest, then its size, of the lower
//                          made from the layer tar with sha256 <hex> (the
//                          registry's blob digest and the config's diff_id both
//                          point there). Only a hint: used while that blob is stored.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "runtime/io.hpp"
#include "runtime/mount.hpp"
#include "runtime/sha256.hpp"
#include "runtime/store_detail.hpp"
#include "runtime/sys.hpp"

namespace dsec {

namespace fs = std::filesystem;
using namespace store_detail;

struct scratch_dir::impl {
  explicit impl(staging_dir d) : dir(std::move(d)) {}
  staging_dir dir;
};

scratch_dir::scratch_dir(std::unique_ptr<impl> i) noexcept : impl_(std::move(i)) {}
scratch_dir::scratch_dir(scratch_dir&&) noexcept = default;
scratch_dir& scratch_dir::operator=(scratch_dir&&) noexcept = default;
scratch_dir::~scratch_dir() = default;

const std::string& scratch_dir::path() const noexcept {
  static const std::string none;
  return impl_ ? impl_->dir.path() : none;
}

namespace {

std::string tars_dir(const std::string& dir) { return join(dir, "oci/tars"); }

bool valid_prefix(std::string_view prefix) {
  return !prefix.empty() && prefix.size() <= 32
         && std::all_of(prefix.begin(), prefix.end(), [](char c) {
              return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
            });
}

} // namespace

expected<scratch_dir> store::scratch(std::string_view prefix) const {
  if (!valid_prefix(prefix))
    return make_error(errc::invalid_argument,
                      "bad scratch prefix '" + printable(prefix)
                        + "' (1 to 32 letters, digits, '-' or '_')");
  DSEC_TRY(dir, staging_dir::create(dir_, prefix));
  return scratch_dir{std::make_unique<scratch_dir::impl>(std::move(dir))};
}

expected<image_lower> store::make_image(const std::string& tree, const std::string& out,
                                        const std::string& subject,
                                        std::vector<std::string>& skipped) const {
  // An image layer's whiteouts are its own deletions: kept (rules{}).
  DSEC_TRY(scan, scan_source(tree, skipped, {}));
  DSEC_TRY_VOID(run_tool(mkfs_argv("", out, tree, scan.exclude, scan.sparse), subject));
  unique_fd fd{sys::retry([&] { return ::open(out.c_str(), O_RDONLY | O_CLOEXEC); })};
  if (!fd)
    return sys_error("cannot open the new image", out);
  DSEC_TRY(hex, sha256_hex_of_file(fd.get()));
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0)
    return sys_error("cannot stat", out);
  // Sealed and durable before it can become a blob, as in build().
  if (::fchmod(fd.get(), 0444) != 0 || ::fsync(fd.get()) != 0)
    return sys_error("cannot seal the new image", out);
  image_lower l;
  l.digest = "sha256:" + hex;
  l.size = static_cast<uint64_t>(st.st_size);
  l.image = out;
  return l;
}

std::optional<image_lower> store::image_lower_for(std::string_view tar_digest) const {
  if (!valid_digest(tar_digest))
    return std::nullopt;
  auto path = join(tars_dir(dir_), tar_digest.substr(7));
  unique_fd fd{::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC)};
  if (!fd)
    return std::nullopt;
  auto text = read_all(fd.get(), path);
  if (!text)
    return std::nullopt;
  std::string_view t = *text;
  auto sp = t.find(' ');
  if (sp == std::string_view::npos)
    return std::nullopt;
  image_lower l;
  l.digest = std::string{t.substr(0, sp)};
  auto size_text = t.substr(sp + 1);
  while (!size_text.empty() && size_text.back() == '\n')
    size_text.remove_suffix(1);
  auto [end, ec] =
    std::from_chars(size_text.data(), size_text.data() + size_text.size(), l.size);
  if (!valid_digest(l.digest) || ec != std::errc{} || end != size_text.data() + size_text.size())
    return std::nullopt;
  struct stat st{};
  if (::stat(blob_path_of(dir_, l.digest).c_str(), &st) != 0 || !S_ISREG(st.st_mode)
      || static_cast<uint64_t>(st.st_size) != l.size)
    return std::nullopt;
  l.tar_digests.emplace_back(tar_digest);
  return l;
}

expected<import_result> store::commit_image(const layer_ref& ref,
                                            std::vector<image_lower> lowers,
                                            const std::string& config,
                                            const std::string& manifest,
                                            const std::string& source) {
  DSEC_TRY_VOID(check_ref(ref));
  const auto name = ref.to_string();
  if (lowers.empty())
    return make_error(errc::invalid_argument, "image " + name + " has no layers");
  for (const auto* text : {&config, &manifest, &source})
    if (text->find('\n') != std::string::npos)
      return make_error(errc::invalid_argument,
                        "the config, manifest or source of image " + name
                          + " contains a newline");
  for (const auto& l : lowers)
    if (!valid_digest(l.digest))
      return malformed_digest(l.digest, " for a lower of image " + name);

  DSEC_TRY(staging, staging_dir::create(dir_, "image"));
  DSEC_TRY(lock, lock_store(dir_, LOCK_EX));
  if (::access(ref_path(dir_, ref).c_str(), F_OK) == 0)
    return make_error(errc::already_exists,
                      "layer " + name
                        + " already exists (versions are immutable: rm it first or "
                          "pick a new version)");

  import_result result;
  auto& info = result.info;
  info.ref = ref;
  info.kind = layer_kind::base;
  info.digest = lowers.front().digest;
  info.created = static_cast<int64_t>(::time(nullptr));
  info.source = source;
  info.config = config;
  info.manifest = manifest;
  info.blob_path = blob_path_of(dir_, info.digest);
  for (const auto& l : lowers) {
    info.lowers.push_back(l.digest);
    info.blob_paths.push_back(blob_path_of(dir_, l.digest));
    info.size += l.size;
  }

  // The blobs first; a failure takes the ones this call added away again.
  std::vector<std::string> added;
  auto undo = [&] {
    for (const auto& b : added)
      ::unlink(b.c_str());
  };
  bool all_shared = true;
  for (const auto& l : lowers) {
    auto blob = blob_path_of(dir_, l.digest);
    if (::access(blob.c_str(), F_OK) == 0)
      continue; // stored already (another image, or a layer twice in this one)
    all_shared = false;
    if (l.image.empty()) {
      undo();
      return make_error(errc::not_found, "the lower " + l.digest + " of image " + name
                                           + " is no longer stored");
    }
    if (rename_noreplace(l.image, blob) == 0)
      added.push_back(blob);
    else if (errno != EEXIST) {
      undo();
      return sys_error("cannot store blob", blob);
    }
  }
  if (!added.empty())
    if (auto r = fsync_dir(blobs_dir(dir_)); !r) {
      undo();
      return std::move(r).error_value();
    }
  if (auto r = write_ref(dir_, staging.path(), info); !r) {
    undo();
    return std::move(r).error_value();
  }
  result.deduplicated = all_shared;

  // The index: a hint, so a failure here loses only speed.
  std::error_code ec;
  fs::create_directories(tars_dir(dir_), ec);
  for (const auto& l : lowers)
    for (const auto& t : l.tar_digests) {
      if (!valid_digest(t))
        continue;
      auto path = join(tars_dir(dir_), std::string_view{t}.substr(7));
      auto tmp = path + ".tmp";
      unique_fd fd{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
      if (!fd)
        continue;
      if (!write_all(fd.get(), l.digest + ' ' + std::to_string(l.size) + '\n', tmp)
          || ::rename(tmp.c_str(), path.c_str()) != 0)
        ::unlink(tmp.c_str());
    }
  return result;
}

// A read-only overlay of the images, read by mkfs.erofs in a child process
// that attaches it in a mount namespace of its own.
expected<image_lower> store::flatten(const std::vector<std::string>& blobs_lowest_first,
                                     const std::string& out, const std::string& shown) const {
  std::vector<layer_mount> mounts;
  std::vector<int> fds; // topmost first
  for (auto it = blobs_lowest_first.rbegin(); it != blobs_lowest_first.rend(); ++it) {
    DSEC_TRY(m, layer_mount::open(*it, -1));
    mounts.push_back(std::move(m));
  }
  for (const auto& m : mounts)
    fds.push_back(m.dir_fd());
  DSEC_TRY(view, make_lower_view(fds));
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0)
    return sys_error("pipe");
  unique_fd rd{pipefd[0]}, wr{pipefd[1]};
  pid_t pid = ::fork();
  if (pid < 0)
    return sys_error("fork");
  if (pid == 0) {
    rd.reset();
    // mkfs.erofs wants a path (it takes the realpath of its source), so the
    // view is attached, in a mount namespace of this child alone that dies
    // with it: nothing is ever attached where anyone else sees it.
    std::string msg;
    auto target = out + ".root";
    if (::unshare(CLONE_NEWNS) != 0)
      msg = "cannot make a private mount namespace: " + std::string{std::strerror(errno)};
    else if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
      msg = "cannot make the mounts private: " + std::string{std::strerror(errno)};
    else if (::mkdir(target.c_str(), 0755) != 0)
      msg = "cannot create " + target;
    else if (sys::move_mount(view.get(), "", AT_FDCWD, target.c_str(),
                             MOVE_MOUNT_F_EMPTY_PATH) != 0)
      msg = "cannot attach the merged view: " + std::string{std::strerror(errno)};
    else {
      std::vector<std::string> sk;
      auto r = make_image(target, out, shown, sk);
      if (!r)
        msg = r.error_value().to_string();
    }
    if (!msg.empty())
      (void) !::write(wr.get(), msg.data(), msg.size());
    ::_exit(msg.empty() ? 0 : 1);
  }
  wr.reset();
  auto msg = read_all(rd.get(), "the flattening child");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return make_error(errc::tool_failed, "cannot flatten " + shown + ": "
                                           + (msg && !msg->empty() ? *msg : "it failed"));
  unique_fd img{sys::retry([&] { return ::open(out.c_str(), O_RDONLY | O_CLOEXEC); })};
  if (!img)
    return sys_error("cannot open", out);
  DSEC_TRY(hex, sha256_hex_of_file(img.get()));
  auto digest = "sha256:" + hex;
  struct stat sb{};
  if (::stat(out.c_str(), &sb) != 0)
    return sys_error("cannot stat", out);
  image_lower l;
  l.digest = digest;
  l.size = static_cast<uint64_t>(sb.st_size);
  l.image = out;
  return l;
}

} // namespace dsec

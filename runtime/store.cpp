// dsec::store (see store.hpp): opening a store, building a layer from a directory or
// a tar archive, and committing a layer (blob, then ref), which import shares. The
// rest of the class is in store_names.cpp (refs: list, find, lease, remove),
// store_import.cpp (stage, import, open_blob) and store_system.cpp (the system
// layer), over the helpers of store_files.cpp and store_tools.cpp
// (store_detail.hpp lists them).
#include "runtime/store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "runtime/io.hpp"
#include "runtime/sha256.hpp"
#include "runtime/store_detail.hpp"
#include "runtime/sys.hpp"

namespace dsec {

namespace fs = std::filesystem;

using namespace store_detail;

namespace store_detail {

expected<void> write_ref(const std::string& dir, const std::string& staging,
                         const layer_info& info) {
  auto ref_file = ref_path(dir, info.ref);
  auto tmp_ref = join(staging, "ref");
  unique_fd fd{sys::retry([&] {
    return ::open(tmp_ref.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  })};
  if (!fd)
    return sys_error("cannot create", tmp_ref);
  DSEC_TRY_VOID(write_all(fd.get(), format_ref(info), tmp_ref));
  if (::fsync(fd.get()) != 0)
    return sys_error("cannot sync", tmp_ref);
  fd.reset();
  if (rename_noreplace(tmp_ref, ref_file) != 0)
    return sys_error("cannot commit layer ref", ref_file);
  if (auto r = fsync_dir(refs_dir(dir)); !r) {
    ::unlink(ref_file.c_str());
    return r;
  }
  return {};
}

expected<bool> commit_layer(const std::string& dir, const std::string& staging,
                            const std::string& image, const layer_info& info) {
  const auto& blob = info.blob_path;
  bool added_blob = false;
  if (rename_noreplace(image, blob) == 0) {
    added_blob = true;
    if (auto r = fsync_dir(blobs_dir(dir)); !r) {
      ::unlink(blob.c_str());
      return std::move(r).error_value();
    }
  } else if (errno != EEXIST) {
    return sys_error("cannot store blob", blob);
  }

  // From here a failure must take the new blob away again.
  auto commit_ref = [&] { return write_ref(dir, staging, info); };
  if (auto r = commit_ref(); !r) {
    if (added_blob)
      ::unlink(blob.c_str());
    return std::move(r).error_value();
  }
  return !added_blob;
}

} // namespace store_detail

// ---------------------------------------------------------------------------

expected<store> store::open(std::string state_dir) {
  if (state_dir.empty())
    return make_error(errc::invalid_argument, "the state directory is empty");
  std::error_code ec;
  fs::path p = fs::absolute(state_dir, ec);
  if (ec)
    return sys_error("cannot resolve state directory", state_dir, ec.value());
  std::string dir = p.lexically_normal().string();
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();

  for (auto sub : {std::string{}, join(dir, "blobs/sha256"), refs_dir(dir), tmp_dir(dir),
                   system_dir(dir)}) {
    auto path = sub.empty() ? dir : sub;
    fs::create_directories(path, ec);
    if (ec)
      return sys_error("cannot create state directory", path, ec.value());
  }
  DSEC_TRY(lock, lock_store(dir, LOCK_EX));
  DSEC_TRY_VOID(clean_tmp(dir));
  return store{std::move(dir)};
}

expected<build_result> store::build(layer_kind kind, const layer_ref& ref,
                                    const std::string& src, const build_options& options) {
  auto started = std::chrono::steady_clock::now();
  DSEC_TRY_VOID(check_ref(ref));
  if (!options.compress.empty() && options.compress != "lz4" && options.compress != "lz4hc")
    return make_error(errc::invalid_argument,
                      "unknown compression '" + options.compress
                        + "' (expected lz4 or lz4hc, or none)");

  // The source: checked first, so a typo is reported before any work is done.
  struct stat st{};
  if (src.empty())
    return make_error(errc::invalid_argument, "the layer source path is empty");
  if (::stat(src.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      auto e = make_error(errc::not_found, "layer source " + src + " does not exist");
      e.path = src;
      return e;
    }
    return sys_error("cannot access layer source", src);
  }
  if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
    auto e = make_error(errc::invalid_argument,
                        "layer source " + src
                          + " is neither a directory nor a tar archive (a regular file)");
    e.path = src;
    return e;
  }
  std::string source;
  {
    char* resolved = ::realpath(src.c_str(), nullptr);
    if (resolved == nullptr)
      return sys_error("cannot resolve layer source", src);
    source = resolved;
    std::free(resolved);
  }
  if (source.find('\n') != std::string::npos)
    return make_error(errc::invalid_argument,
                      "layer source path '" + src + "' contains a newline");

  DSEC_TRY(staging, staging_dir::create(dir_, "build"));
  std::string tree = source;
  if (S_ISREG(st.st_mode)) {
    tree = join(staging.path(), "root");
    if (::mkdir(tree.c_str(), 0755) != 0 || ::chmod(tree.c_str(), 0755) != 0)
      return sys_error("cannot create", tree);
    // The coarse clock: file times come from it (or from a finer one), so a
    // directory tar touches never looks older than `before`.
    struct timespec before{};
    ::clock_gettime(CLOCK_REALTIME_COARSE, &before);
    // GNU tar detects compression itself, refuses member names with "..", and
    // creates symlinks that could lead outside the tree only after every other
    // member, so a hostile archive cannot write outside `tree`.
    // The archive is opened here, once, and tar reads that open file (its
    // descriptor 3): never waits on a fifo put in its place, and reads
    // exactly the regular file checked.
    unique_fd archive{
      sys::retry([&] { return ::open(source.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC); })};
    if (!archive)
      return sys_error("cannot open layer source", source);
    struct stat ast{};
    if (::fstat(archive.get(), &ast) != 0)
      return sys_error("cannot stat layer source", source);
    if (!S_ISREG(ast.st_mode)) {
      auto e = make_error(errc::invalid_argument,
                          "layer source " + src + " is no longer a regular file (it changed)");
      e.path = src;
      return e;
    }
    DSEC_TRY_VOID(run_tool({"tar", "--numeric-owner", "--same-owner", "--same-permissions",
                            "--xattrs", "--xattrs-include=*", "-xf", "/proc/self/fd/3", "-C",
                            tree},
                           source, archive.get()));
    // An archive without a "./" member (docker export has none) leaves the root's
    // mtime at extraction time, which would make every build of it a new digest.
    // Such a root is pinned to the epoch; a "./" member's own mtime is kept.
    struct stat root_st{};
    if (::stat(tree.c_str(), &root_st) != 0)
      return sys_error("cannot stat", tree);
    if (root_st.st_mtim.tv_sec > before.tv_sec
        || (root_st.st_mtim.tv_sec == before.tv_sec
            && root_st.st_mtim.tv_nsec >= before.tv_nsec)) {
      struct timespec epoch[2] = {{0, 0}, {0, 0}};
      if (::utimensat(AT_FDCWD, tree.c_str(), epoch, AT_SYMLINK_NOFOLLOW) != 0)
        return sys_error("cannot set the mtime of", tree);
    }
  }

  std::vector<std::string> skipped;
  source_rules rules;
  rules.refuse_overlay_metadata = kind != layer_kind::base && !options.whiteouts;
  DSEC_TRY(scan, scan_source(tree, skipped, rules));
  auto image = join(staging.path(), "image.erofs");
  if (auto made = run_tool(mkfs_argv(options.compress, image, tree, scan.exclude, scan.sparse),
                           source);
      !made) {
    // What mkfs.erofs says when a file it listed is gone or changed by the time
    // it reads it: name the likely cause, not only its words.
    auto e = std::move(made).error_value();
    if (e.message.find("llistxattr") != std::string::npos
        || e.message.find("No such file") != std::string::npos)
      e.message = "the layer source " + src
                  + " changed while mkfs.erofs read it (a file was removed, renamed or "
                    "replaced during the build; build from a tree nothing writes to): "
                  + e.message;
    return e;
  }

  unique_fd image_fd{sys::retry([&] { return ::open(image.c_str(), O_RDONLY | O_CLOEXEC); })};
  if (!image_fd)
    return sys_error("cannot open the new image", image);
  DSEC_TRY(hex, sha256_hex_of_file(image_fd.get()));
  struct stat image_st{};
  if (::fstat(image_fd.get(), &image_st) != 0)
    return sys_error("cannot stat", image);
  // Blobs are shared by every layer with the same bytes and mounted read-only:
  // nobody may write them. fsync before the rename so a crash cannot leave a
  // committed blob with missing data.
  if (::fchmod(image_fd.get(), 0444) != 0 || ::fsync(image_fd.get()) != 0)
    return sys_error("cannot seal the new image", image);

  build_result result;
  result.info.ref = ref;
  result.info.kind = kind;
  result.info.digest = "sha256:" + hex;
  result.info.size = static_cast<uint64_t>(image_st.st_size);
  result.info.source = source;
  result.info.blob_path = blob_path_of(dir_, result.info.digest);
  result.skipped = std::move(skipped);

  // Commit: blob, then ref, under LOCK_EX.
  // A taken name is only known once the image is: rebuilding the same content
  // as the same kind is a no-op (a script may build its layers every time);
  // anything else names both images, as versions are immutable.
  DSEC_TRY(lock, lock_store(dir_, LOCK_EX));
  if (auto existing = read_ref(dir_, ref)) {
    if (existing->digest != result.info.digest || existing->kind != kind)
      return make_error(errc::already_exists,
                        "layer " + ref.to_string() + " already exists as a "
                          + to_string(existing->kind) + " layer with image " + existing->digest
                          + "; this build is a " + to_string(kind) + " layer with image "
                          + result.info.digest
                          + " (versions are immutable: rm it first or pick a new version)");
    result.info = std::move(*existing);
    result.deduplicated = true;
    result.existed = true;
    result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return result;
  } else if (existing.error_value().code != errc::not_found) {
    return std::move(existing).error_value();
  }
  result.info.created = static_cast<int64_t>(::time(nullptr));
  DSEC_TRY(shared, commit_layer(dir_, staging.path(), image, result.info));
  result.deduplicated = shared; // the staging dir's removal drops our copy

  result.seconds =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

} // namespace dsec

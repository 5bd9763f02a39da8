// The store's import of a layer made elsewhere (see store.hpp): staged_file (an
// image being written into STATE/tmp, hashed as it goes), store::stage and
// store::import (checked, then committed like a build), and store::open_blob,
// which serves a blob to a peer.
#include "runtime/store_detail.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>

#include "runtime/io.hpp"
#include "runtime/sha256.hpp"
#include "runtime/sys.hpp"

namespace dsec {

using namespace store_detail;

struct staged_file::impl {
  explicit impl(staging_dir d) : dir(std::move(d)) {}
  staging_dir dir;
  std::string path;
  unique_fd fd;
  sha256 hash;
  uint64_t size = 0;
  std::string digest; // set once finished
};

staged_file::staged_file(std::unique_ptr<impl> i) noexcept : impl_(std::move(i)) {}
staged_file::staged_file(staged_file&&) noexcept = default;
staged_file& staged_file::operator=(staged_file&&) noexcept = default;
// The impl's staging_dir removes the directory, file included; its fd closes first.
staged_file::~staged_file() = default;

expected<void> staged_file::append(const void* data, size_t size) {
  if (!impl_)
    return make_error(errc::invalid_argument, "append to a moved-from staged file");
  if (!impl_->digest.empty())
    return make_error(errc::invalid_argument,
                      "append to " + impl_->path + " after its digest was taken");
  DSEC_TRY_VOID(write_all(impl_->fd.get(),
                          std::string_view{static_cast<const char*>(data), size}, impl_->path));
  impl_->hash.update(data, size);
  impl_->size += size;
  return {};
}

uint64_t staged_file::size() const noexcept { return impl_ ? impl_->size : 0; }

const std::string& staged_file::digest() {
  static const std::string none;
  if (!impl_)
    return none;
  if (impl_->digest.empty())
    impl_->digest = "sha256:" + to_hex(impl_->hash.finish());
  return impl_->digest;
}

expected<void> staged_file::rehash() {
  if (!impl_)
    return make_error(errc::invalid_argument, "rehash of a moved-from staged file");
  unique_fd in{sys::retry([&] { return ::open(impl_->path.c_str(), O_RDONLY | O_CLOEXEC); })};
  if (!in)
    return sys_error("cannot open", impl_->path);
  impl_->hash = sha256{};
  impl_->size = 0;
  std::string buf(1 << 20, '\0');
  for (;;) {
    auto n = sys::retry([&] { return ::read(in.get(), buf.data(), buf.size()); });
    if (n < 0)
      return sys_error("cannot read", impl_->path);
    if (n == 0)
      break;
    impl_->hash.update(buf.data(), static_cast<size_t>(n));
    impl_->size += static_cast<uint64_t>(n);
  }
  impl_->digest.clear();
  (void) digest();
  return {};
}

const std::string& staged_file::path() const noexcept {
  static const std::string none;
  return impl_ ? impl_->path : none;
}

expected<staged_file> store::stage(std::string_view prefix) const {
  if (prefix.empty() || prefix.size() > 32
      || !std::all_of(prefix.begin(), prefix.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
         }))
    return make_error(errc::invalid_argument,
                      "bad staging prefix '" + printable(prefix)
                        + "' (1 to 32 letters, digits, '-' or '_')");
  DSEC_TRY(dir, staging_dir::create(dir_, prefix));
  auto im = std::make_unique<staged_file::impl>(std::move(dir));
  im->path = join(im->dir.path(), "image");
  im->fd.reset(sys::retry([&] {
    return ::open(im->path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  }));
  if (!im->fd)
    return sys_error("cannot create", im->path);
  return staged_file{std::move(im)};
}

expected<import_result> store::import(layer_kind kind, const layer_ref& ref,
                                      const std::string& digest, uint64_t size,
                                      int64_t created, const std::string& source,
                                      staged_file file, const std::string& on) {
  // `file` is ours now: whatever happens below, its directory goes with it.
  DSEC_TRY_VOID(check_ref(ref));
  const auto name = ref.to_string();
  if (!file)
    return make_error(errc::invalid_argument, "no image to import for layer " + name);
  if (!valid_digest(digest))
    return malformed_digest(digest, " for layer " + name);
  if (source.find('\n') != std::string::npos)
    return make_error(errc::invalid_argument,
                      "the source of layer " + name + " contains a newline");
  if (on.find('\n') != std::string::npos)
    return make_error(errc::invalid_argument,
                      "the record of layer " + name + " contains a newline");
  auto& im = *file.impl_;
  struct stat st{};
  if (::fstat(im.fd.get(), &st) != 0)
    return sys_error("cannot stat", im.path);
  if (im.size != size || static_cast<uint64_t>(st.st_size) != size) {
    auto e = make_error(errc::invalid_argument,
                        "size mismatch for layer " + name + ": the image has "
                          + std::to_string(st.st_size) + " bytes, expected "
                          + std::to_string(size));
    e.path = im.path;
    return e;
  }
  const auto& got = file.digest();
  if (got != digest) {
    auto e = make_error(errc::invalid_argument, "digest mismatch for layer " + name
                                                  + ": the image's sha256 is " + got
                                                  + ", expected " + digest);
    e.path = im.path;
    return e;
  }
  // Sealed and durable before it can become a blob, as in build().
  if (::fchmod(im.fd.get(), 0444) != 0 || ::fsync(im.fd.get()) != 0)
    return sys_error("cannot seal the imported image", im.path);

  import_result result;
  DSEC_TRY(lock, lock_store(dir_, LOCK_EX));
  if (auto existing = read_ref(dir_, ref)) {
    if (existing->digest != digest)
      return make_error(errc::already_exists,
                        "layer " + name + " already exists with another image ("
                          + existing->digest + ", not " + digest
                          + "; versions are immutable)");
    result.info = std::move(*existing);
    result.existed = true;
    return result;
  } else if (existing.error_value().code != errc::not_found) {
    return std::move(existing).error_value();
  }
  result.info.ref = ref;
  result.info.kind = kind;
  result.info.digest = digest;
  result.info.size = size;
  result.info.created = created;
  result.info.source = source;
  result.info.on = on;
  result.info.blob_path = blob_path_of(dir_, digest);
  DSEC_TRY(shared, commit_layer(dir_, im.dir.path(), im.path, result.info));
  result.deduplicated = shared;
  return result;
}

expected<unique_fd> store::open_blob(std::string_view digest) const {
  if (!valid_digest(digest))
    return malformed_digest(digest, "");
  auto path = blob_path_of(dir_, digest);
  unique_fd fd{sys::retry([&] {
    return ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  })};
  if (!fd) {
    if (errno != ENOENT)
      return sys_error("cannot open blob", path);
    auto e = make_error(errc::not_found, "no image " + std::string{digest} + " in the store "
                                           + dir_);
    e.path = path;
    return e;
  }
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0)
    return sys_error("cannot stat blob", path);
  if (!S_ISREG(st.st_mode))
    return make_error(errc::system_error, "blob " + path + " is not a regular file");
  return fd;
}

} // namespace dsec

#include "runtime/trajectory.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstring>

#include "runtime/io.hpp"

namespace dsec {

namespace {

constexpr char magic[8] = {'D', 'S', 'E', 'C', 'T', 'R', 'J', '2'};        // + u32 format
constexpr char magic_v1[8] = {'D', 'S', 'E', 'C', 'T', 'R', 'J', '1'};     // format 1, implied
constexpr size_t header_size = sizeof magic + 4;

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

const std::array<uint32_t, 256> crc_table = make_crc_table();

uint32_t get_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v; // little-endian hosts only (x86-64, aarch64)
}

void put_u32(std::string& out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}

// Splits `data` into records; returns the offset just past the last whole one.
expected<uint64_t> parse(const std::string& data, const std::string& path,
                         std::vector<std::string>* out, uint32_t& format) {
  size_t off = 0;
  if (data.size() >= sizeof magic_v1 &&
      std::memcmp(data.data(), magic_v1, sizeof magic_v1) == 0) {
    off = sizeof magic_v1;
    format = 1;
  } else if (data.size() >= header_size && std::memcmp(data.data(), magic, sizeof magic) == 0) {
    off = header_size;
    format = get_u32(data.data() + sizeof magic);
  } else {
    return make_error(errc::malformed, "not a dsec trajectory log (no DSECTRJ2 or DSECTRJ1 "
                                       "header): " + path);
  }
  while (data.size() - off >= 8) {
    uint32_t len = get_u32(data.data() + off);
    uint32_t crc = get_u32(data.data() + off + 4);
    if (len > max_trajectory_record || data.size() - off - 8 < len)
      break;
    const char* payload = data.data() + off + 8;
    if (crc32c(payload, len) != crc)
      break;
    if (out)
      out->emplace_back(payload, len);
    off += 8 + static_cast<size_t>(len);
  }
  return off;
}

} // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) noexcept {
  auto p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i)
    crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

expected<trajectory_file> trajectory_file::open(const std::string& path, bool create,
                                                std::vector<std::string>* existing,
                                                uint32_t format) {
  trajectory_file f;
  f.path_ = path;
  f.fd_.reset(::open(path.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0600));
  if (!f.fd_) {
    if (errno == ENOENT)
      return make_error(errc::not_found, "no trajectory log at " + path);
    return sys_error("opening the trajectory log", path);
  }
  DSEC_TRY(data, read_all(f.fd_.get(), path, "reading the trajectory log"));
  if (data.empty()) {
    char header[header_size];
    std::memcpy(header, magic, sizeof magic);
    for (int i = 0; i < 4; ++i)
      header[sizeof magic + i] = static_cast<char>((format >> (8 * i)) & 0xff);
    if (::pwrite(f.fd_.get(), header, sizeof header, 0) != static_cast<ssize_t>(sizeof header))
      return sys_error("writing the trajectory log's header", path);
    f.size_ = sizeof header;
    f.format_ = format;
    DSEC_TRY_VOID(f.sync());
    // The new file's name must survive a crash as well as its bytes.
    auto slash = path.rfind('/');
    std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
    DSEC_TRY_VOID(fsync_dir(dir.empty() ? "/" : dir, "fsync of the trajectory log's directory"));
    return f;
  }
  DSEC_TRY(end, parse(data, path, existing, f.format_));
  f.size_ = end;
  f.torn_ = data.size() - end;
  if (f.torn_ > 0) {
    if (::ftruncate(f.fd_.get(), static_cast<off_t>(end)) < 0)
      return sys_error("cutting the torn tail of the trajectory log", path);
    f.synced_ = 0;
    DSEC_TRY_VOID(f.sync());
  }
  f.synced_ = f.size_;
  return f;
}

expected<std::vector<std::string>> trajectory_file::read(const std::string& path,
                                                         uint64_t* torn_bytes,
                                                         uint32_t* format) {
  unique_fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (!fd) {
    if (errno == ENOENT)
      return make_error(errc::not_found, "no trajectory log at " + path);
    return sys_error("opening the trajectory log", path);
  }
  DSEC_TRY(data, read_all(fd.get(), path, "reading the trajectory log"));
  std::vector<std::string> out;
  uint32_t fmt = 0;
  DSEC_TRY(end, parse(data, path, &out, fmt));
  if (format)
    *format = fmt;
  if (torn_bytes)
    *torn_bytes = data.size() - end;
  return out;
}

expected<void> trajectory_file::append(std::string_view payload) {
  if (payload.size() > max_trajectory_record)
    return make_error(errc::too_large, "a trajectory record of " + std::to_string(payload.size())
                                         + " bytes (at most "
                                         + std::to_string(max_trajectory_record) + ")");
  frame_.clear();
  put_u32(frame_, static_cast<uint32_t>(payload.size()));
  put_u32(frame_, crc32c(payload.data(), payload.size()));
  frame_.append(payload);
  size_t done = 0;
  while (done < frame_.size()) {
    ssize_t n = ::pwrite(fd_.get(), frame_.data() + done, frame_.size() - done,
                         static_cast<off_t>(size_ + done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      int err = errno;
      // Leave no half frame behind for the next append to follow.
      (void) ::ftruncate(fd_.get(), static_cast<off_t>(size_));
      return sys_error("appending to the trajectory log", path_, err);
    }
    done += static_cast<size_t>(n);
  }
  size_ += frame_.size();
  if (frame_.capacity() > (1u << 20))
    frame_ = std::string{}; // a big record: do not keep its buffer
  return {};
}

expected<void> trajectory_file::sync() {
  if (synced_ >= size_ && synced_ != 0)
    return {};
  if (::fdatasync(fd_.get()) < 0)
    return sys_error("fdatasync of the trajectory log", path_);
  synced_ = size_;
  return {};
}

} // namespace dsec

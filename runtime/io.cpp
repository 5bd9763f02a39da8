// io: see io.hpp.
#include "runtime/io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "runtime/fd.hpp"
#include "runtime/sys.hpp"

namespace dsec {

expected<std::string> read_all(int fd, std::string_view path, std::string_view what) {
  // A regular file's size is known: read it in one go (plus the read that sees
  // end of file). Anything else (procfs, a pipe) grows the buffer geometrically.
  struct stat st {};
  size_t first = 8192;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= 8192)
    first = static_cast<size_t>(st.st_size) + 1;
  std::string out(first, '\0');
  size_t got = 0;
  for (;;) {
    if (got == out.size())
      out.resize(out.size() * 2);
    auto n = sys::retry([&] { return ::read(fd, out.data() + got, out.size() - got); });
    if (n < 0)
      return sys_error(what, path);
    if (n == 0)
      break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

expected<std::string> read_file(int dirfd, const std::string& path) {
  unique_fd fd{sys::retry([&] { return ::openat(dirfd, path.c_str(), O_RDONLY | O_CLOEXEC); })};
  if (!fd)
    return sys_error("cannot open", path);
  return read_all(fd.get(), path);
}

expected<void> write_all(int fd, std::string_view data, std::string_view path,
                         std::string_view what) {
  while (!data.empty()) {
    auto n = sys::retry([&] { return ::write(fd, data.data(), data.size()); });
    if (n < 0)
      return sys_error(what, path);
    if (n == 0)
      return sys_error(what, path, EIO);
    data.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

expected<void> fsync_dir(const std::string& path, std::string_view what) {
  unique_fd fd{sys::retry([&] {
    return ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  })};
  if (!fd || ::fsync(fd.get()) != 0)
    return sys_error(what, path);
  return {};
}

} // namespace dsec

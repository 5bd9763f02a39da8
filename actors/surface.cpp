#include "actors/surface.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runtime/hex.hpp"
#include "runtime/fd.hpp"
#include "runtime/sys.hpp"

namespace dsec {

namespace {

std::atomic<uint64_t> refused{0};

uint64_t random_word() {
  uint64_t x = 0;
  size_t got = 0;
  auto* p = reinterpret_cast<unsigned char*>(&x);
  while (got < sizeof x) {
    auto n = ::getrandom(p + got, sizeof x - got, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      // Without randomness there is no key: nothing may run.
      std::fprintf(stderr, "dsec: getrandom failed: %s\n", std::strerror(errno));
      std::abort();
    }
    got += static_cast<size_t>(n);
  }
  return x;
}

void note_refusal(const char* what, bool keyed) {
  auto n = refused.fetch_add(1, std::memory_order_relaxed) + 1;
  if ((n & (n - 1)) == 0) { // 1, 2, 4, 8, ...: an attacker cannot flood the log
    std::fprintf(stdout, "dsecd: refused %s%s (%llu so far; docs/security.md)\n", what,
                 keyed ? ": an internal message without this daemon's key" : "",
                 static_cast<unsigned long long>(n));
    std::fflush(stdout);
  }
}

} // namespace

internal_key internal_key::random() {
  return {random_word(), random_word(), random_word(), random_word()};
}

std::string internal_key::to_hex() const {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (uint64_t w : {a, b, c, d})
    for (int shift = 60; shift >= 0; shift -= 4)
      out += digits[(w >> shift) & 15];
  return out;
}

expected<internal_key> internal_key::from_hex(std::string_view text) {
  if (text.size() != 64)
    return make_error(errc::malformed, "a key is 64 hex digits, not "
                                         + std::to_string(text.size()) + " characters");
  uint64_t w[4] = {};
  for (size_t i = 0; i < 64; ++i) {
    int v = hex_value(text[i]);
    if (v < 0)
      return make_error(errc::malformed, "a key is 64 hex digits; character "
                                           + std::to_string(i + 1) + " is not one");
    w[i / 16] = (w[i / 16] << 4) | static_cast<uint64_t>(v);
  }
  return internal_key{w[0], w[1], w[2], w[3]};
}

const internal_key& process_key() {
  static const internal_key key = internal_key::random();
  return key;
}

bool genuine(const internal_key& got, const internal_key& want, const char* what) {
  // No early exit: the time taken says nothing about how much matched.
  volatile uint64_t diff = (got.a ^ want.a) | (got.b ^ want.b) | (got.c ^ want.c)
                           | (got.d ^ want.d);
  if (diff == 0)
    return true;
  note_refusal(what, true);
  return false;
}

uint64_t refused_internal() noexcept {
  return refused.load(std::memory_order_relaxed);
}

void count_refusal(const char* what) {
  note_refusal(what, false);
}

error unauthorized(const char* what) {
  return make_error(errc::unauthorized,
                    std::string{what}
                      + " is internal to dsec and this message does not carry the key of its "
                        "daemon or cluster: refused (clients use the session and scheduler "
                        "verbs; nodes need the cluster's key, dsecd --cluster-key)");
}

expected<internal_key> load_cluster_key(const std::string& path, bool create) {
  if (path.empty())
    return make_error(errc::invalid_argument, "no cluster key file given");
  unique_fd fd{::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)};
  if (!fd && errno == ENOENT && create) {
    auto key = internal_key::random();
    auto text = key.to_hex() + "\n";
    auto tmp = path + ".tmp";
    {
      unique_fd out{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                           0600)};
      if (!out)
        return sys_error("creating the cluster key file", tmp);
      if (::write(out.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())
          || ::fsync(out.get()) < 0) {
        int err = errno;
        (void) ::unlink(tmp.c_str());
        return sys_error("writing the cluster key file", tmp, err);
      }
    }
    // link(), not rename(): a file someone else made meanwhile is kept, not replaced.
    if (::link(tmp.c_str(), path.c_str()) < 0 && errno != EEXIST) {
      int err = errno;
      (void) ::unlink(tmp.c_str());
      return sys_error("creating the cluster key file", path, err);
    }
    (void) ::unlink(tmp.c_str());
    fd.reset(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  }
  if (!fd) {
    if (errno == ENOENT)
      return make_error(errc::not_found,
                        "no cluster key file " + path
                          + " (a coordinator makes <state>/cluster.key; give every node a copy, "
                            "mode 0600, with --cluster-key FILE)");
    return sys_error("opening the cluster key file", path);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) < 0)
    return sys_error("stat of the cluster key file", path);
  if (!S_ISREG(st.st_mode))
    return make_error(errc::invalid_argument, "the cluster key file " + path
                                                + " is not a regular file");
  if (st.st_uid != ::geteuid())
    return make_error(errc::invalid_argument,
                      "the cluster key file " + path + " belongs to uid "
                        + std::to_string(st.st_uid) + ", not to this daemon's ("
                        + std::to_string(::geteuid()) + "): chown it");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return make_error(errc::invalid_argument, "the cluster key file " + path
                                                + " is open to group or others (mode " + mode
                                                + "): chmod 600 it");
  }
  char buf[130];
  ssize_t n = sys::retry([&] { return ::read(fd.get(), buf, sizeof buf); });
  if (n < 0)
    return sys_error("reading the cluster key file", path);
  std::string_view text{buf, static_cast<size_t>(n)};
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r'))
    text.remove_suffix(1);
  auto key = internal_key::from_hex(text);
  if (!key)
    return make_error(errc::malformed, "the cluster key file " + path + " holds no key: "
                                         + key.error_value().message);
  return *key;
}

expected<void> check_name(std::string_view name, const char* what) {
  auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_argument, std::string{what} + " '"
                                                + std::string{name.substr(0, 80)} + "' "
                                                + why);
  };
  if (name.empty())
    return make_error(errc::invalid_argument, std::string{what} + " is empty");
  if (name.size() > 128)
    return bad("is longer than 128 characters");
  if (name.front() == '.')
    return bad("starts with '.'");
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
          || c == '.' || c == '_' || c == '-'))
      return bad("has a character other than A-Z, a-z, 0-9, '.', '_' and '-'");
  return {};
}

} // namespace dsec

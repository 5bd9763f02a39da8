#include "actors/transport.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/scoped_actor.hpp>

#include <openssl/bio.h>
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "actors/types.hpp"
#include "actors/thread_guard.hpp"
#include "runtime/endpoint.hpp"
#include "runtime/log.hpp"

namespace dsec {

namespace {

// ---- the files --------------------------------------------------------------------

// The whole of a TLS file; a secret one must not be open to group or others.
expected<std::string> read_tls_file(const std::string& path, const char* what, bool secret) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT)
      return make_error(errc::not_found, std::string{"the TLS "} + what + " " + path
                                           + " is missing (tools/tls-certs makes ca.pem, "
                                             "cert.pem and key.pem)");
    return sys_error(std::string{"cannot open the TLS "} + what, path);
  }
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } c{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0)
    return sys_error(std::string{"cannot stat the TLS "} + what, path);
  if (!S_ISREG(st.st_mode))
    return make_error(errc::invalid_argument,
                      std::string{"the TLS "} + what + " " + path + " is not a regular file");
  if (secret && (st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return make_error(errc::invalid_argument,
                      std::string{"the TLS "} + what + " " + path
                        + " is open to group or others (mode " + mode + "): chmod 600 it");
  }
  std::string out;
  char buf[4096];
  for (;;) {
    auto n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return sys_error(std::string{"cannot read the TLS "} + what, path);
    if (n == 0)
      break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (1u << 20))
      return make_error(errc::too_large, std::string{"the TLS "} + what + " " + path
                                           + " is over 1 MiB: not a PEM file of dsec's");
  }
  return out;
}

struct x509_free {
  void operator()(X509* x) const { X509_free(x); }
};
struct pkey_free {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct bio_free {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct store_free {
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
};
struct store_ctx_free {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};
struct chain_free {
  void operator()(STACK_OF(X509) * s) const { sk_X509_pop_free(s, X509_free); }
};
using x509_ptr = std::unique_ptr<X509, x509_free>;

std::unique_ptr<BIO, bio_free> bio_of(const std::string& data) {
  return std::unique_ptr<BIO, bio_free>{BIO_new_mem_buf(data.data(), static_cast<int>(data.size()))};
}

// Every certificate in a PEM text, in order.
std::vector<x509_ptr> certificates_of(const std::string& pem) {
  std::vector<x509_ptr> out;
  auto bio = bio_of(pem);
  while (bio) {
    X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
    if (!x)
      break;
    out.emplace_back(x);
  }
  ERR_clear_error(); // the end of the text reads as an error
  return out;
}

// Never asks for a passphrase (OpenSSL's default would prompt on the terminal).
int no_passphrase(char*, int, int, void*) { return -1; }

// What a certificate, key and CA have to be for CAF's handshake to succeed.
expected<void> check_tls_files(const std::string& dir, const std::string& ca_pem,
                               const std::string& cert_pem, const std::string& key_pem) {
  auto ca_path = dir + "/ca.pem", cert_path = dir + "/cert.pem", key_path = dir + "/key.pem";
  auto cas = certificates_of(ca_pem);
  if (cas.empty())
    return make_error(errc::invalid_argument,
                      "the TLS CA " + ca_path + " holds no PEM certificate");
  auto chain = certificates_of(cert_pem);
  if (chain.empty())
    return make_error(errc::invalid_argument,
                      "the TLS certificate " + cert_path + " holds no PEM certificate");
  if (key_pem.find("ENCRYPTED") != std::string::npos)
    return make_error(errc::invalid_argument,
                      "the TLS key " + key_path
                        + " is encrypted with a passphrase: dsec needs it unencrypted (and "
                          "readable by its owner only)");
  std::unique_ptr<EVP_PKEY, pkey_free> key;
  if (auto bio = bio_of(key_pem))
    key.reset(PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr));
  ERR_clear_error();
  if (!key)
    return make_error(errc::invalid_argument,
                      "the TLS key " + key_path + " holds no PEM private key");
  if (X509_check_private_key(chain.front().get(), key.get()) != 1) {
    ERR_clear_error();
    return make_error(errc::invalid_argument, "the TLS key " + key_path
                                                + " is not the key of the certificate "
                                                + cert_path);
  }
  std::unique_ptr<X509_STORE, store_free> store{X509_STORE_new()};
  std::unique_ptr<STACK_OF(X509), chain_free> untrusted{sk_X509_new_null()};
  std::unique_ptr<X509_STORE_CTX, store_ctx_free> ctx{X509_STORE_CTX_new()};
  if (!store || !untrusted || !ctx)
    return make_error(errc::system_error, "OpenSSL: out of memory checking " + cert_path);
  for (auto& ca : cas)
    X509_STORE_add_cert(store.get(), ca.get());
  for (size_t i = 1; i < chain.size(); ++i) {
    X509_up_ref(chain[i].get());
    sk_X509_push(untrusted.get(), chain[i].get());
  }
  if (X509_STORE_CTX_init(ctx.get(), store.get(), chain.front().get(), untrusted.get()) != 1)
    return make_error(errc::system_error, "OpenSSL: cannot check " + cert_path);
  if (X509_verify_cert(ctx.get()) != 1) {
    auto why = X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()));
    ERR_clear_error();
    return make_error(errc::invalid_argument, "the TLS certificate " + cert_path
                                                + " is not valid under the CA " + ca_path
                                                + ": " + why);
  }
  return {};
}

// A private, sealed copy of `data` that CAF can open by name at every handshake:
// /proc/self/fd/N of a memfd kept open for the life of the process (equal
// contents share one). Falls back to `path` itself without /proc.
std::string sealed_copy(const std::string& data, const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::string> copies; // contents -> its path
  std::lock_guard<std::mutex> lock{mu};
  if (auto i = copies.find(data); i != copies.end())
    return i->second;
  int fd = ::memfd_create("dsec-tls", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return path;
  size_t done = 0;
  while (done < data.size()) {
    auto n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      ::close(fd);
      return path;
    }
    done += static_cast<size_t>(n);
  }
  (void) ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  auto copy = "/proc/self/fd/" + std::to_string(fd);
  if (::access(copy.c_str(), R_OK) != 0) {
    ::close(fd);
    return path;
  }
  copies.emplace(data, copy);
  return copy;
}

} // namespace

} // namespace dsec

// ---- OpenSSL's error queue --------------------------------------------------------
//
// OpenSSL keeps one error queue per thread, and SSL_get_error() reports
// SSL_ERROR_SSL whenever that queue is not empty, even when the call it is asked
// about only wants to be retried (WANT_READ). Its manual: "The current thread's
// error queue must be empty before the TLS/SSL I/O operation is attempted, or
// SSL_get_error() will not work reliably". CAF 0.17's OpenSSL module never
// empties it (only its logging would, and Debian builds CAF without logs), and
// every connection of a process shares the middleman's one I/O thread: one
// refused handshake (a plain client, a certificate from another CA) left its
// errors there, and the next read of every healthy connection that had to wait
// for data was taken for a failure, closing it. Anyone able to connect could
// thus cut every trainer off a dsecd. These definitions take the place of
// OpenSSL's own for CAF (the executable's, or the extension module's, come
// first in the dynamic linker's lookup), empty the queue as the manual asks,
// and call OpenSSL's. test/actors/tls.test.cpp keeps a trainer connected while
// clients are refused.

namespace {

template <class F>
F next_definition(const char* name) {
  auto f = reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
  if (!f)
    std::abort(); // libssl is linked in: it has them
  return f;
}

} // namespace

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static const auto openssl = next_definition<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return openssl(ssl, buf, num);
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static const auto openssl = next_definition<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return openssl(ssl, buf, num);
}

int SSL_accept(SSL* ssl) {
  static const auto openssl = next_definition<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  int r = openssl(ssl);
  if (r <= 0) {
    // A handshake that failed, not one that waits for more bytes: a refused
    // peer (no certificate, another CA, not TLS at all), logged once per 10 s.
    int e = SSL_get_error(ssl, r);
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
      char why[256] = "the handshake failed";
      if (auto code = ERR_peek_error(); code != 0)
        ERR_error_string_n(code, why, sizeof why);
      std::string peer = "?";
      sockaddr_storage sa{};
      socklen_t len = sizeof sa;
      char host[INET6_ADDRSTRLEN] = "";
      if (::getpeername(SSL_get_fd(ssl), reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
        if (sa.ss_family == AF_INET)
          ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&sa)->sin_addr, host, sizeof host);
        else if (sa.ss_family == AF_INET6)
          ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&sa)->sin6_addr, host,
                      sizeof host);
        peer = host;
      }
      dsec::log::refusal("tls", "handshake", "refused a TLS peer", {{"peer", peer}, {"why", why}});
    }
  }
  return r;
}

int SSL_connect(SSL* ssl) {
  static const auto openssl = next_definition<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return openssl(ssl);
}

} // extern "C"

namespace dsec {

// ---- configuration ----------------------------------------------------------------

expected<void> configure_tls(caf::actor_system_config& cfg, const tls_options& tls) {
  if (!tls.enabled())
    return {};
  auto dir = tls.dir;
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0)
    return errno == ENOENT
             ? make_error(errc::not_found, "the TLS directory " + dir
                                             + " does not exist (tools/tls-certs makes one)")
             : sys_error("cannot reach the TLS directory", dir);
  if (!S_ISDIR(st.st_mode))
    return make_error(errc::invalid_argument, "the TLS directory " + dir
                                                + " is not a directory (it holds ca.pem, "
                                                  "cert.pem and key.pem)");
  auto ca = read_tls_file(dir + "/ca.pem", "CA", false);
  if (!ca)
    return std::move(ca).error_value();
  auto cert = read_tls_file(dir + "/cert.pem", "certificate", false);
  if (!cert)
    return std::move(cert).error_value();
  auto key = read_tls_file(dir + "/key.pem", "key", true);
  if (!key)
    return std::move(key).error_value();
  if (auto ok = check_tls_files(dir, *ca, *cert, *key); !ok)
    return ok;
  // CAF opens these at every handshake and throws (ending the process) when it
  // cannot: it gets copies that nobody can change or remove.
  cfg.load<caf::openssl::manager>();
  cfg.openssl_cafile = sealed_copy(*ca, dir + "/ca.pem");
  cfg.openssl_certificate = sealed_copy(*cert, dir + "/cert.pem");
  cfg.openssl_key = sealed_copy(*key, dir + "/key.pem");
  cfg.openssl_capath.clear();
  cfg.openssl_passphrase.clear();
  return {};
}

bool tls_enabled(caf::actor_system& sys) {
  return sys.has_openssl_manager() && sys.openssl_manager().authentication_enabled();
}

caf::io::middleman_actor middleman_of(caf::actor_system& sys) {
  if (tls_enabled(sys))
    return sys.openssl_manager().actor_handle();
  return sys.middleman().actor_handle();
}

// ---- publish and connect ----------------------------------------------------------

expected<uint16_t> publish(caf::actor_system& sys, const caf::strong_actor_ptr& whom,
                           const std::set<std::string>& ifs, uint16_t port,
                           const std::string& host) {
  if (!whom)
    return make_error(errc::invalid_argument, "publish: no actor given");
  expected<uint16_t> out = make_error(errc::system_error, "publish: no answer");
  caller_thread_guard pin; // see thread_guard.hpp
  caf::scoped_actor self{sys};
  self->request(middleman_of(sys), caf::infinite, caf::publish_atom::value, port, whom, ifs,
                host, true)
    .receive([&](uint16_t actual) { out = actual; },
             [&](caf::error& e) {
               out = make_error(errc::system_error, "cannot listen on "
                                                      + format_endpoint(host, port) + ": "
                                                      + in_words(e));
             });
  return out;
}

expected<void> unpublish(caf::actor_system& sys, const caf::actor_addr& whom, uint16_t port) {
  expected<void> out{};
  caller_thread_guard pin; // see thread_guard.hpp
  caf::scoped_actor self{sys};
  self->request(middleman_of(sys), caf::infinite, caf::unpublish_atom::value, whom, port)
    .receive([] {},
             [&](caf::error& e) {
               out = make_error(errc::system_error, "cannot stop listening on port "
                                                      + std::to_string(port) + ": "
                                                      + in_words(e));
             });
  return out;
}

error connect_error(caf::actor_system& sys, const caf::error& e, const std::string& host,
                    uint16_t port) {
  bool tls = tls_enabled(sys);
  std::string why;
  auto code = errc::disconnected;
  // Under TLS a refused handshake shows as either error: as cannot_connect_to_node
  // when the peer's answer was already there when CAF first called SSL_connect.
  const std::string handshake =
    "the TLS handshake failed: the other side refused this side's certificate (cert.pem "
    "is not signed by its CA), this side refused the other's (it is not signed by this "
    "side's ca.pem), or the other side does not speak TLS (a dsecd without --tls)";
  if (e == caf::sec::cannot_connect_to_node)
    why = tls ? "nothing accepts connections there (is a dsecd running there with --listen "
                "at that address and --tls?), or " + handshake
              : "nothing accepts connections there (is dsecd running with --listen at that "
                "address?)";
  else if (e == caf::sec::disconnect_during_handshake)
    why = tls ? handshake
          : std::string{"the other side closed the connection during the handshake: it may "
                        "require TLS (dsecd --tls; connect with --tls DIR holding a "
                        "certificate from its CA)"}
              + (::geteuid() == 0
                   ? ""
                   : ", or it refused this user: a dsecd without --tls admits only "
                     "processes of root and of its group's members (dsecd --group, default "
                     "dsec), and this one runs as uid "
                     + std::to_string(::geteuid())
                     + " (refusals are counted in `node stats`; docs/security.md)");
  else if (e == caf::sec::unexpected_actor_messaging_interface)
    why = "what listens there is not the expected service of this version";
  else if (e == caf::sec::no_actor_published_at_port)
    why = "nothing is published on that port";
  else if (e == caf::sec::request_timeout) {
    code = errc::timeout;
    why = "no answer in time: what accepts connections there does not complete the "
          "handshake (is it a dsecd?"
          + std::string{tls ? " one with --tls?)" : " one without --tls?)"};
  } else
    why = in_words(e);
  return make_error(code, "cannot reach " + format_endpoint(host, port) + ": " + why);
}

expected<caf::strong_actor_ptr> connect(caf::actor_system& sys, const std::string& host,
                                        uint16_t port, const std::set<std::string>& ifs,
                                        std::chrono::milliseconds timeout) {
  expected<caf::strong_actor_ptr> out = make_error(errc::disconnected, "connect: no answer");
  caller_thread_guard pin; // see thread_guard.hpp
  caf::scoped_actor self{sys};
  self->request(middleman_of(sys), timeout, caf::connect_atom::value, host, port)
    .receive(
      [&](caf::node_id&, caf::strong_actor_ptr& whom, std::set<std::string>& theirs) {
        if (!whom)
          out = connect_error(sys, caf::sec::no_actor_published_at_port, host, port);
        else if (!ifs.empty() && !sys.assignable(theirs, ifs))
          out = connect_error(sys, caf::sec::unexpected_actor_messaging_interface, host, port);
        else
          out = std::move(whom);
      },
      [&](caf::error& e) { out = connect_error(sys, e, host, port); });
  return out;
}

} // namespace dsec

// registry: `dsec layer pull REF`, an image from an OCI distribution registry
// (the Docker Registry HTTP API v2) over libcurl, made into a base layer by
// oci::build_image.
//
// REF is [https://|http://]HOST[:PORT]/REPO[:TAG|@sha256:...]; without a
// scheme it is https, and a REF without a host (debian:12) means Docker Hub.
// http:// is refused unless HOST is a loopback address (localhost, 127.x, ::1).
// Authentication: a 401 with `WWW-Authenticate: Bearer realm=...` is answered
// by fetching a token from the realm (with the credentials, when given, as
// basic auth), one with `Basic` by the credentials; a registry that still
// answers 401 or 403 is errc::unauthenticated "the registry refused the
// credentials". TLS peers are checked against the system CAs or `ca_file`.
//
// Every blob is hashed while it streams and checked against its digest: the
// manifest (when REF names a digest), the config and each layer. A layer
// streams into STATE/oci/downloads/ under a temporary name and gets its digest
// as its name only when the bytes match (a mismatch is errc::malformed naming
// both digests, and nothing is kept). A pull that stops halfway (killed, a
// network error) leaves its complete layers there, and the next pull of an
// image with those layers uses them instead of fetching them again; a layer
// already made into a lower (another image has it) is not fetched at all.
// Once the image is committed, its downloads are removed.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "runtime/error.hpp"
#include "runtime/layer.hpp"
#include "runtime/oci.hpp"
#include "runtime/store.hpp"

namespace dsec::registry {

/// A parsed REF.
struct reference {
  std::string scheme = "https";
  std::string host;       ///< host[:port]
  std::string repository; ///< library/debian
  std::string tag;        ///< or empty when `digest` is set
  std::string digest;

  /// scheme://host/repository[:tag|@digest]
  [[nodiscard]] std::string to_string() const;
  /// The NAME@VERSION a pull stores it as without --as: the repository's last
  /// component and the tag (or the digest's first 12 hex digits), each cut to
  /// the characters a layer name may have.
  [[nodiscard]] std::string default_layer() const;
  static expected<reference> parse(std::string_view text);
};

/// True for localhost, 127.0.0.0/8 and [::1] (with or without a port).
bool is_loopback_host(std::string_view host_port);

struct pull_options {
  std::string ca_file;  ///< PEM CA bundle for TLS; empty: the system's
  std::string username; ///< credentials; empty: anonymous
  std::string password;
  oci::platform plat;   ///< the platform picked from a multi-arch index
  oci::build_options build;
  /// Progress lines; called often (bytes so far) when `live` is set.
  std::function<void(const std::string&, bool live)> progress;
};

/// What pull() did.
struct pull_result {
  oci::build_result built;
  reference ref;
  std::string manifest_digest;
  uint64_t bytes_fetched = 0; ///< layer bytes downloaded now
  size_t blobs_fetched = 0;
  size_t blobs_resumed = 0;   ///< complete downloads of an earlier pull, used
  double seconds = 0;
};

/// The pull's overall bar on a terminal: `[=====>   ]  42% 12.0/28.5 MiB,
/// 3.1 MiB/s, 0m05s left` for `done` of `total` bytes in `seconds`.
std::string progress_bar(uint64_t done, uint64_t total, double seconds);

/// Pulls `ref` into `st` as base layer `as`.
expected<pull_result> pull(store& st, const reference& ref, const layer_ref& as,
                           const pull_options& options);

} // namespace dsec::registry

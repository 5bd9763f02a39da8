// oci: container images (the OCI image spec, and Docker's v2 formats) as dsec
// layers. `dsec layer import oci:DIR | docker-archive:FILE` and `dsec layer
// pull REF` (runtime/registry.hpp) end here.
//
// An image becomes one base layer (layer_info::lowers) whose lowers are its
// layers, topmost first. Each image layer is its own EROFS blob: its tar is
// unpacked into an empty tree (unpack_layer: OCI whiteouts become overlay's,
// `.wh.NAME` a 0/0 character device NAME and `.wh..wh..opq` the xattr
// trusted.overlay.opaque=y on its directory), and that tree is made into an
// image exactly as `dsec layer build` makes one, so the same tar always gives
// the same blob, and two images sharing a layer share its blob and, on a node,
// its mount. The store remembers which lower each tar became, keyed by the
// digest under which the image names the tar and which dsec verified: the
// blob digest of the manifest (the compressed tar, for OCI layouts and
// registries) or, in a docker-archive, the config's diff_id (the uncompressed
// layer.tar it holds). A tar seen before is not unpacked again. Digests that
// were not verified (an OCI layer's diff_id) are never keys.
//
// When an image has more layers than `max_lowers`, its lowest ones are
// flattened into one lower: they are mounted as a read-only overlay, attached
// only in the private mount namespace of a child process, and that merged
// tree becomes one image.
//
// The image config's Env, WorkingDir, User, Entrypoint and Cmd are kept
// (runtime/image_config.hpp) in the layer's ref and shown by `dsec layer inspect`.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.hpp"
#include "runtime/image_config.hpp"
#include "runtime/layer.hpp"
#include "runtime/store.hpp"

namespace dsec::oci {

/// os/architecture[/variant], as in an index's platform.
struct platform {
  std::string os = "linux";
  std::string architecture = "amd64";
  std::string variant;

  [[nodiscard]] std::string to_string() const;
  /// "linux/amd64", "linux/arm64/v8"; invalid_argument otherwise.
  static expected<platform> parse(std::string_view text);
};

/// A content descriptor (mediaType, digest, size), and an index entry's platform.
struct descriptor {
  std::string media_type;
  std::string digest;
  uint64_t size = 0;
  std::optional<platform> plat;
};

/// A manifest: the config blob and the layers, lowest first.
struct manifest {
  descriptor config;
  std::vector<descriptor> layers;
};

/// Media types.
inline constexpr std::string_view oci_index = "application/vnd.oci.image.index.v1+json";
inline constexpr std::string_view oci_manifest = "application/vnd.oci.image.manifest.v1+json";
inline constexpr std::string_view docker_list =
  "application/vnd.docker.distribution.manifest.list.v2+json";
inline constexpr std::string_view docker_manifest =
  "application/vnd.docker.distribution.manifest.v2+json";

/// An index (OCI index or Docker manifest list): its manifests.
/// `what` names the document in errors.
expected<std::vector<descriptor>> parse_index(std::string_view json, std::string_view what);
/// A manifest (OCI or Docker v2 schema 2); an unsupported media type of the
/// manifest, its config or a layer is errc::unsupported naming it.
expected<manifest> parse_manifest(std::string_view json, std::string_view what);
/// The media type a document says it has ("mediaType"), or "" when it names none.
std::string media_type_of(std::string_view json);
/// True for an index or manifest list media type.
bool is_index_type(std::string_view media_type);

/// The manifest of `want` in `entries` (an index's); not_found naming the
/// platforms there are when none matches. A variant is compared only when
/// `want` names one.
expected<descriptor> pick_platform(const std::vector<descriptor>& entries,
                                   const platform& want, std::string_view what);

/// What an image config says: its config, and its rootfs diff_ids.
struct config_doc {
  image_config config;
  std::vector<std::string> diff_ids;
  platform plat;
};
expected<config_doc> parse_config(std::string_view json, std::string_view what);

/// What unpack_layer did.
struct unpack_result {
  uint64_t entries = 0;
  uint64_t whiteouts = 0;
  uint64_t opaque_dirs = 0;
  std::string digest;               ///< "sha256:..." of every byte read from the tar fd
  std::vector<std::string> skipped; ///< "NAME (a block device)"
};

/// Unpacks the image layer tar read from `fd` (plain, gzip, zstd, xz: libarchive
/// detects it) into the empty directory `root` (an absolute path without
/// symbolic links), as root: owners, modes, mtimes, xattrs (but
/// trusted.overlay.*, which only whiteouts make) and hard links within the
/// layer kept; OCI whiteouts converted (see above); device nodes skipped.
/// Refused, errc::invalid_argument naming the entry: a ".." component, an
/// entry through a symbolic link, a hard link to a name this layer does not
/// have. Directories the tar implies without an entry, and a root without a
/// "./" entry, get mtime 0, so the same tar always gives the same tree.
/// `shown` names the tar in messages.
expected<unpack_result> unpack_layer(int fd, const std::string& shown, const std::string& root);

/// One layer of an image to build: a file holding its tar and how it is named.
struct layer_source {
  std::string path;       ///< the tar (compressed or not)
  std::string digest;     ///< the digest it must have ("sha256:..."), checked
  std::string media_type; ///< for messages
  std::string shown;      ///< how messages name it
};

struct build_options {
  /// The most lowers an image keeps; the lowest layers beyond are flattened
  /// into one (0: default_max_lowers).
  size_t max_lowers = 0;
  /// Called after each layer with a line for the user ("layer 2/5 ...").
  std::function<void(const std::string&)> progress;
};
inline constexpr size_t default_max_lowers = 32;

/// What build_image did.
struct build_result {
  import_result stored;
  size_t layers = 0;    ///< the image's layers
  size_t converted = 0; ///< unpacked and made into an image now
  size_t reused = 0;    ///< found in the store by their tar's digest
  size_t flattened = 0; ///< lowest layers merged into one lower
  std::vector<std::string> skipped;
  double seconds = 0;
};

/// Makes base layer `ref` of the image whose layers are `layers` (lowest
/// first): each layer's tar is checked against its digest while it is read
/// (a mismatch is errc::malformed naming both, and nothing is stored), made
/// into a lower or found in the store, flattened beyond max_lowers, and
/// committed with `config` (store::commit_image). `manifest_digest` and
/// `source` go into the ref.
expected<build_result> build_image(store& st, const layer_ref& ref,
                                   const std::vector<layer_source>& layers,
                                   const image_config& config,
                                   const std::string& manifest_digest,
                                   const std::string& source, const build_options& options);

/// `dsec layer import SPEC`: SPEC is oci:DIR (an OCI image layout; DIR:TAG or
/// an index naming one image picks it by org.opencontainers.image.ref.name; a
/// multi-platform index by `plat`) or docker-archive:FILE (`docker save`
/// output; its first image).
expected<build_result> import_image(store& st, const layer_ref& ref, std::string_view spec,
                                    const platform& plat, const build_options& options);

/// sha256 of a file's bytes, "sha256:..." (for blobs read from a layout).
expected<std::string> file_digest(const std::string& path);

} // namespace dsec::oci

// oci (see oci.hpp): image documents (index, manifest, config) read with
// nlohmann::json, building a base layer of an image's layers, flattening the
// lowest ones, and `dsec layer import oci:DIR | docker-archive:FILE`.
#include "runtime/oci.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "runtime/fd.hpp"
#include "runtime/io.hpp"
#include "runtime/mount.hpp"
#include "runtime/sha256.hpp"
#include "runtime/sys.hpp"
#include "runtime/untar.hpp"

namespace dsec::oci {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

error bad(std::string_view what, const std::string& why) {
  return make_error(errc::invalid_argument, std::string{what} + ": " + why);
}

expected<json> parse_json(std::string_view text, std::string_view what) {
  auto j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded())
    return bad(what, "not valid JSON");
  if (!j.is_object())
    return bad(what, "not a JSON object");
  return j;
}

std::string string_at(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string{};
}

expected<std::vector<std::string>> strings_at(const json& j, const char* key,
                                              std::string_view what) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null())
    return out;
  if (!it->is_array())
    return bad(what, std::string{key} + " is not an array");
  for (const auto& v : *it) {
    if (!v.is_string())
      return bad(what, std::string{key} + " holds a value that is not a string");
    out.push_back(v.get<std::string>());
  }
  return out;
}

bool digest_ok(std::string_view d) { return store::is_digest(d); }

expected<descriptor> parse_descriptor(const json& j, std::string_view what) {
  if (!j.is_object())
    return bad(what, "a descriptor is not an object");
  descriptor d;
  d.media_type = string_at(j, "mediaType");
  d.digest = string_at(j, "digest");
  if (!digest_ok(d.digest))
    return bad(what, "descriptor digest '" + d.digest.substr(0, 80)
                       + "' is not sha256: and 64 lower-case hex digits");
  auto size = j.find("size");
  if (size == j.end() || !size->is_number_unsigned())
    return bad(what, "descriptor " + d.digest + " has no size");
  d.size = size->get<uint64_t>();
  if (auto p = j.find("platform"); p != j.end() && p->is_object()) {
    platform pl;
    pl.os = string_at(*p, "os");
    pl.architecture = string_at(*p, "architecture");
    pl.variant = string_at(*p, "variant");
    d.plat = pl;
  }
  return d;
}

bool supported_layer(std::string_view t) {
  return t == "application/vnd.oci.image.layer.v1.tar"
         || t == "application/vnd.oci.image.layer.v1.tar+gzip"
         || t == "application/vnd.oci.image.layer.v1.tar+zstd"
         || t == "application/vnd.docker.image.rootfs.diff.tar.gzip"
         || t == "application/vnd.docker.image.rootfs.diff.tar";
}

} // namespace

// ---- documents ---------------------------------------------------------------------

std::string platform::to_string() const {
  return os + "/" + architecture + (variant.empty() ? "" : "/" + variant);
}

expected<platform> platform::parse(std::string_view text) {
  platform p;
  auto a = text.find('/');
  if (a == std::string_view::npos || a == 0 || a + 1 == text.size())
    return make_error(errc::invalid_argument,
                      "bad platform '" + std::string{text}
                        + "' (expected OS/ARCH[/VARIANT], e.g. linux/amd64)");
  p.os = text.substr(0, a);
  auto rest = text.substr(a + 1);
  auto b = rest.find('/');
  p.architecture = rest.substr(0, b);
  p.variant = b == std::string_view::npos ? std::string{} : std::string{rest.substr(b + 1)};
  if (p.architecture.empty() || (b != std::string_view::npos && p.variant.empty()))
    return make_error(errc::invalid_argument, "bad platform '" + std::string{text} + "'");
  return p;
}

std::string media_type_of(std::string_view text) {
  auto j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return {};
  return string_at(j, "mediaType");
}

bool is_index_type(std::string_view t) { return t == oci_index || t == docker_list; }

expected<std::vector<descriptor>> parse_index(std::string_view text, std::string_view what) {
  DSEC_TRY(j, parse_json(text, what));
  auto it = j.find("manifests");
  if (it == j.end() || !it->is_array())
    return bad(what, "an index without \"manifests\"");
  std::vector<descriptor> out;
  for (const auto& m : *it) {
    DSEC_TRY(d, parse_descriptor(m, what));
    // A layout's index.json names its images by ref.name.
    if (auto ann = m.find("annotations"); ann != m.end() && ann->is_object())
      if (auto n = ann->find("org.opencontainers.image.ref.name");
          n != ann->end() && n->is_string())
        d.media_type += "\n" + n->get<std::string>(); // split again by the layout reader
    out.push_back(std::move(d));
  }
  return out;
}

expected<manifest> parse_manifest(std::string_view text, std::string_view what) {
  DSEC_TRY(j, parse_json(text, what));
  auto type = string_at(j, "mediaType");
  if (!type.empty() && type != oci_manifest && type != docker_manifest)
    return make_error(errc::unsupported,
                      std::string{what} + ": unsupported manifest media type '" + type
                        + "' (dsec reads " + std::string{oci_manifest} + " and "
                        + std::string{docker_manifest} + ")");
  if (j.contains("schemaVersion") && j["schemaVersion"] != 2)
    return make_error(errc::unsupported, std::string{what} + ": manifest schemaVersion "
                                           + j["schemaVersion"].dump() + " (dsec reads 2)");
  manifest m;
  auto c = j.find("config");
  if (c == j.end())
    return bad(what, "a manifest without a config");
  DSEC_TRY(cd, parse_descriptor(*c, what));
  m.config = std::move(cd);
  if (!m.config.media_type.empty()
      && m.config.media_type != "application/vnd.oci.image.config.v1+json"
      && m.config.media_type != "application/vnd.docker.container.image.v1+json")
    return make_error(errc::unsupported, std::string{what} + ": unsupported config media type '"
                                           + m.config.media_type + "' (not a container image)");
  auto ls = j.find("layers");
  if (ls == j.end() || !ls->is_array())
    return bad(what, "a manifest without layers");
  for (const auto& l : *ls) {
    DSEC_TRY(d, parse_descriptor(l, what));
    if (!supported_layer(d.media_type))
      return make_error(errc::unsupported, std::string{what} + ": layer " + d.digest
                                             + " has the unsupported media type '"
                                             + d.media_type + "'");
    m.layers.push_back(std::move(d));
  }
  if (m.layers.empty())
    return bad(what, "a manifest with no layers");
  return m;
}

expected<descriptor> pick_platform(const std::vector<descriptor>& entries, const platform& want,
                                   std::string_view what) {
  std::string have;
  for (const auto& e : entries) {
    if (!e.plat)
      continue;
    if (e.plat->os == want.os && e.plat->architecture == want.architecture
        && (want.variant.empty() || e.plat->variant == want.variant))
      return e;
    have += (have.empty() ? "" : ", ") + e.plat->to_string();
  }
  return make_error(errc::not_found, std::string{what} + " has no image for platform "
                                       + want.to_string() + " (it has: "
                                       + (have.empty() ? "none named" : have) + ")");
}

expected<config_doc> parse_config(std::string_view text, std::string_view what) {
  DSEC_TRY(j, parse_json(text, what));
  config_doc d;
  d.plat.os = string_at(j, "os");
  d.plat.architecture = string_at(j, "architecture");
  d.plat.variant = string_at(j, "variant");
  if (auto c = j.find("config"); c != j.end() && c->is_object()) {
    DSEC_TRY(cfg, image_config::from_json(c->dump()));
    d.config = std::move(cfg);
  }
  if (auto r = j.find("rootfs"); r != j.end() && r->is_object()) {
    DSEC_TRY(ids, strings_at(*r, "diff_ids", what));
    d.diff_ids = std::move(ids);
  }
  return d;
}

expected<std::string> file_digest(const std::string& path) {
  unique_fd fd{sys::retry([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); })};
  if (!fd)
    return sys_error("cannot open", path);
  DSEC_TRY(hex, sha256_hex_of_file(fd.get()));
  return "sha256:" + hex;
}

// ---- building an image ---------------------------------------------------------------

namespace {

std::string canonical(const std::string& p) {
  std::error_code ec;
  auto c = fs::canonical(p, ec);
  return ec ? p : c.string();
}

} // namespace

expected<build_result> build_image(store& st, const layer_ref& ref,
                                   const std::vector<layer_source>& layers,
                                   const image_config& config,
                                   const std::string& manifest_digest, const std::string& source,
                                   const build_options& options) {
  auto started = std::chrono::steady_clock::now();
  build_result out;
  out.layers = layers.size();
  if (layers.empty())
    return make_error(errc::invalid_argument, "image " + ref.to_string() + " has no layers");
  if (st.find(ref))
    return make_error(errc::already_exists,
                      "layer " + ref.to_string()
                        + " already exists (versions are immutable: rm it first or pick a "
                          "new version)");
  DSEC_TRY(scratch, st.scratch("image"));
  const auto work = canonical(scratch.path());

  std::vector<image_lower> lowest_first;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& l = layers[i];
    if (auto known = st.image_lower_for(l.digest)) {
      lowest_first.push_back(std::move(*known));
      ++out.reused;
      if (options.progress)
        options.progress("layer " + std::to_string(i + 1) + "/" + std::to_string(layers.size())
                         + " " + l.digest.substr(7, 12) + ": already stored");
      continue;
    }
    auto tree = work + "/tree-" + std::to_string(i);
    if (::mkdir(tree.c_str(), 0755) != 0)
      return sys_error("cannot create", tree);
    unique_fd fd{sys::retry([&] { return ::open(l.path.c_str(), O_RDONLY | O_CLOEXEC); })};
    if (!fd)
      return sys_error("cannot open layer", l.path);
    DSEC_TRY(u, unpack_layer(fd.get(), l.shown, tree));
    if (u.digest != l.digest)
      return make_error(errc::malformed, "digest mismatch for layer " + l.shown + ": its bytes hash to "
                                           + u.digest + ", the image names " + l.digest
                                           + " (nothing stored)");
    for (auto& s : u.skipped)
      out.skipped.push_back(l.digest.substr(7, 12) + ": " + s);
    std::vector<std::string> sk;
    DSEC_TRY(img, st.make_image(tree, work + "/layer-" + std::to_string(i) + ".erofs", l.shown, sk));
    std::error_code ec;
    fs::remove_all(tree, ec);
    img.tar_digests.push_back(l.digest);
    lowest_first.push_back(std::move(img));
    ++out.converted;
    if (options.progress)
      options.progress("layer " + std::to_string(i + 1) + "/" + std::to_string(layers.size())
                       + " " + l.digest.substr(7, 12) + ": " + std::to_string(u.entries)
                       + " entries, " + std::to_string(u.whiteouts) + " whiteouts");
  }

  // Too many lowers: the lowest ones become one.
  size_t max = options.max_lowers == 0 ? default_max_lowers : options.max_lowers;
  if (lowest_first.size() > max) {
    size_t n = lowest_first.size() - max + 1;
    std::vector<std::string> blobs;
    for (size_t i = 0; i < n; ++i) {
      const auto& l = lowest_first[i];
      // A lower made now is still in the scratch dir; a reused one is stored.
      blobs.push_back(!l.image.empty() ? l.image
                                       : st.dir() + "/blobs/sha256/" + l.digest.substr(7));
    }
    DSEC_TRY(flat, st.flatten(blobs, work + "/flat.erofs",
                           "the lowest " + std::to_string(n) + " layers of " + ref.to_string()));
    lowest_first.erase(lowest_first.begin(), lowest_first.begin() + static_cast<long>(n));
    lowest_first.insert(lowest_first.begin(), std::move(flat));
    out.flattened = n;
    if (options.progress)
      options.progress("flattened the lowest " + std::to_string(n) + " layers into one");
  }

  std::vector<image_lower> topmost_first(lowest_first.rbegin(), lowest_first.rend());
  DSEC_TRY(stored, st.commit_image(ref, std::move(topmost_first), config.to_json(),
                                   manifest_digest, source));
  out.stored = std::move(stored);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return out;
}

// ---- import --------------------------------------------------------------------------

namespace {

expected<std::string> read_small(const std::string& path, uint64_t limit = 16 << 20) {
  unique_fd fd{sys::retry([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); })};
  if (!fd) {
    if (errno == ENOENT) {
      auto e = make_error(errc::not_found, path + " does not exist");
      e.path = path;
      return e;
    }
    return sys_error("cannot open", path);
  }
  struct stat sb{};
  if (::fstat(fd.get(), &sb) != 0)
    return sys_error("cannot stat", path);
  if (!S_ISREG(sb.st_mode) || static_cast<uint64_t>(sb.st_size) > limit)
    return make_error(errc::invalid_argument, path + " is not a regular file of at most "
                                                + std::to_string(limit) + " bytes");
  return read_all(fd.get(), path);
}

std::string blob_in(const std::string& dir, const std::string& digest) {
  return dir + "/blobs/sha256/" + digest.substr(7);
}

// Reads a blob of the layout and checks its digest.
expected<std::string> read_blob(const std::string& dir, const descriptor& d) {
  auto path = blob_in(dir, d.digest);
  DSEC_TRY(text, read_small(path));
  sha256 h;
  h.update(text.data(), text.size());
  auto got = "sha256:" + to_hex(h.finish());
  if (got != d.digest)
    return make_error(errc::malformed, "digest mismatch for " + path + ": its bytes hash to "
                                         + got + ", expected " + d.digest);
  return text;
}

expected<build_result> import_layout(store& st, const layer_ref& ref, std::string dir,
                                     const std::string& tag, const platform& plat,
                                     const build_options& options, const std::string& source) {
  DSEC_TRY(layout, read_small(dir + "/oci-layout"));
  (void) layout;
  DSEC_TRY(index_text, read_small(dir + "/index.json"));
  DSEC_TRY(entries, parse_index(index_text, dir + "/index.json"));
  // Split the ref names parse_index put after the media type.
  std::vector<std::string> names;
  for (auto& e : entries) {
    auto nl = e.media_type.find('\n');
    names.push_back(nl == std::string::npos ? std::string{} : e.media_type.substr(nl + 1));
    if (nl != std::string::npos)
      e.media_type.resize(nl);
  }
  std::vector<descriptor> chosen;
  for (size_t i = 0; i < entries.size(); ++i)
    if (tag.empty() || names[i] == tag)
      chosen.push_back(entries[i]);
  if (chosen.empty())
    return make_error(errc::not_found, "the OCI layout " + dir + " has no image named '" + tag
                                         + "'");
  descriptor m;
  if (chosen.size() == 1 && !is_index_type(chosen[0].media_type)) {
    m = chosen[0];
  } else {
    // Several images, or an index: by platform.
    std::vector<descriptor> candidates;
    for (const auto& c : chosen) {
      if (is_index_type(c.media_type)) {
        DSEC_TRY(sub_text, read_blob(dir, c));
        DSEC_TRY(sub, parse_index(sub_text, "index " + c.digest));
        for (auto& s : sub) {
          auto nl = s.media_type.find('\n');
          if (nl != std::string::npos)
            s.media_type.resize(nl);
          candidates.push_back(std::move(s));
        }
      } else {
        candidates.push_back(c);
      }
    }
    DSEC_TRY(p, pick_platform(candidates, plat, "the OCI layout " + dir));
    m = std::move(p);
  }
  DSEC_TRY(mtext, read_blob(dir, m));
  DSEC_TRY(man, parse_manifest(mtext, "manifest " + m.digest));
  DSEC_TRY(ctext, read_blob(dir, man.config));
  DSEC_TRY(cfg, parse_config(ctext, "config " + man.config.digest));
  std::vector<layer_source> layers;
  for (const auto& l : man.layers)
    layers.push_back({blob_in(dir, l.digest), l.digest, l.media_type,
                      l.digest + " (" + blob_in(dir, l.digest) + ")"});
  return build_image(st, ref, layers, cfg.config, m.digest, source, options);
}

expected<build_result> import_docker_archive(store& st, const layer_ref& ref,
                                             const std::string& file,
                                             const build_options& options,
                                             const std::string& source) {
  // Unpacked (it is a plain tar of JSON files and layer tars) with the code
  // that copies out of sandboxes, which trusts nothing in it.
  DSEC_TRY(scratch, st.scratch("docker-archive"));
  unique_fd dfd{::open(scratch.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (!dfd)
    return sys_error("cannot open", scratch.path());
  {
    // Mapped, not read: an archive holds the whole image.
    unique_fd afd{sys::retry([&] { return ::open(file.c_str(), O_RDONLY | O_CLOEXEC); })};
    if (!afd) {
      auto e = errno == ENOENT ? make_error(errc::not_found, file + " does not exist")
                               : sys_error("cannot open", file);
      e.path = file;
      return e;
    }
    struct stat sb{};
    if (::fstat(afd.get(), &sb) != 0)
      return sys_error("cannot stat", file);
    if (!S_ISREG(sb.st_mode) || sb.st_size == 0)
      return make_error(errc::invalid_argument, file + " is not a docker archive (a tar file)");
    void* map = ::mmap(nullptr, static_cast<size_t>(sb.st_size), PROT_READ, MAP_PRIVATE,
                       afd.get(), 0);
    if (map == MAP_FAILED)
      return sys_error("cannot map", file);
    auto u = untar_beneath(dfd.get(), scratch.path(),
                           std::string_view{static_cast<const char*>(map),
                                            static_cast<size_t>(sb.st_size)},
                           022);
    ::munmap(map, static_cast<size_t>(sb.st_size));
    if (!u)
      return std::move(u).error_value();
  }
  const auto dir = canonical(scratch.path());
  // Every file the manifest names must be the archive's own: a symbolic link
  // in the archive must not make dsec read a host file as a layer.
  auto inside = [&](const std::string& rel) -> expected<std::string> {
    auto path = canonical(dir + "/" + rel);
    if (path.rfind(dir + "/", 0) != 0)
      return bad(file, "manifest.json names '" + rel + "', which is not inside the archive");
    return path;
  };
  DSEC_TRY(mtext, read_small(dir + "/manifest.json"));
  auto j = json::parse(mtext, nullptr, false);
  if (j.is_discarded() || !j.is_array() || j.empty() || !j[0].is_object())
    return bad(file, "manifest.json is not a non-empty array of images");
  const auto& img = j[0];
  auto config_path = string_at(img, "Config");
  DSEC_TRY(layer_paths, strings_at(img, "Layers", file + ": manifest.json"));
  if (config_path.empty() || layer_paths.empty())
    return bad(file, "manifest.json names no Config or no Layers");
  for (const auto* p : {&config_path})
    if (p->find("..") != std::string::npos || p->front() == '/')
      return bad(file, "manifest.json names '" + *p + "' outside the archive");
  DSEC_TRY(config_file, inside(config_path));
  DSEC_TRY(ctext, read_small(config_file));
  DSEC_TRY(cfg, parse_config(ctext, file + ": " + config_path));
  if (cfg.diff_ids.size() != layer_paths.size())
    return bad(file, "the config has " + std::to_string(cfg.diff_ids.size())
                       + " diff_ids for " + std::to_string(layer_paths.size()) + " layers");
  std::vector<layer_source> layers;
  for (size_t i = 0; i < layer_paths.size(); ++i) {
    const auto& p = layer_paths[i];
    if (p.find("..") != std::string::npos || p.empty() || p.front() == '/')
      return bad(file, "manifest.json names the layer '" + p + "' outside the archive");
    if (!digest_ok(cfg.diff_ids[i]))
      return bad(file, "bad diff_id '" + cfg.diff_ids[i].substr(0, 80) + "'");
    // A docker-archive's layers are the uncompressed tars the diff_ids name.
    DSEC_TRY(path, inside(p));
    layers.push_back({path, cfg.diff_ids[i], "docker layer.tar", file + ":" + p});
  }
  sha256 h;
  h.update(ctext.data(), ctext.size());
  return build_image(st, ref, layers, cfg.config, "sha256:" + to_hex(h.finish()), source,
                     options);
}

} // namespace

expected<build_result> import_image(store& st, const layer_ref& ref, std::string_view spec,
                                    const platform& plat, const build_options& options) {
  std::string s{spec};
  if (s.rfind("oci:", 0) == 0) {
    auto rest = s.substr(4);
    std::string tag;
    // oci:DIR[:TAG], as skopeo spells it.
    if (auto c = rest.rfind(':'); c != std::string::npos && c > 0
                                  && rest.find('/', c) == std::string::npos) {
      struct stat sb{};
      if (::stat(rest.c_str(), &sb) != 0) {
        tag = rest.substr(c + 1);
        rest.resize(c);
      }
    }
    if (rest.empty())
      return make_error(errc::invalid_argument, "oci: needs a directory (oci:DIR[:TAG])");
    auto dir = canonical(rest);
    struct stat sb{};
    if (::stat(dir.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode)) {
      auto e = make_error(errc::not_found, "OCI layout " + rest + " is not a directory");
      e.path = rest;
      return e;
    }
    return import_layout(st, ref, dir, tag, plat, options,
                         "oci:" + dir + (tag.empty() ? "" : ":" + tag));
  }
  if (s.rfind("docker-archive:", 0) == 0) {
    auto file = canonical(s.substr(15));
    return import_docker_archive(st, ref, file, options, "docker-archive:" + file);
  }
  return make_error(errc::invalid_argument,
                    "unknown image source '" + s
                      + "' (expected oci:DIR[:TAG] or docker-archive:FILE)");
}

} // namespace dsec::oci

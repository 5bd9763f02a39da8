// dsec-oci: `dsec layer import` and `dsec layer pull` (OCI images as base
// layers: runtime/oci.hpp, runtime/registry.hpp). The static dsec execs this
// (it needs libcurl and libarchive as shared libraries) as
//   dsec-oci [--state DIR] layer import|pull ARGS...
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/oci.hpp"
#include "runtime/registry.hpp"
#include "runtime/store.hpp"
#include "runtime/units.hpp"
#include "tools/dsec/cli.hpp"

namespace {

using namespace dsec;
using namespace dsec::cli;

void print_import_help() {
  std::printf(
    "Usage: dsec [--state DIR] layer import [--platform OS/ARCH[/VARIANT]] [--max-lowers N]\n"
    "                                       NAME@VERSION oci:DIR[:TAG] | docker-archive:FILE\n"
    "\n"
    "Makes base layer NAME@VERSION of a container image on disk:\n"
    "  oci:DIR[:TAG]        an OCI image layout (skopeo copy ... oci:DIR:TAG, umoci);\n"
    "                       TAG picks the image by its org.opencontainers.image.ref.name\n"
    "  docker-archive:FILE  the output of 'docker save' (its first image)\n"
    "\n"
    "Each image layer becomes its own EROFS image, stored once however many images\n"
    "share it (found again by the digest of its tar), with OCI whiteouts turned into\n"
    "overlayfs's; the layer's lowers are the image's layers in order. Every blob is\n"
    "checked against its digest (a mismatch stores nothing). The image config (Env,\n"
    "WorkingDir, User, Entrypoint, Cmd) is kept: 'dsec layer inspect' shows it, and\n"
    "'dsec run' uses it as its command's defaults.\n"
    "\n"
    "  --platform P     the image of an index to take (default linux/amd64)\n"
    "  --max-lowers N   the most lowers the layer keeps (default %zu): the lowest\n"
    "                   layers of a longer image are flattened into one\n",
    oci::default_max_lowers);
}

void print_pull_help() {
  std::printf(
    "Usage: dsec [--state DIR] layer pull [--as NAME@VERSION] [--platform OS/ARCH[/VARIANT]]\n"
    "                                     [--creds USER:PASS] [--ca-file PEM] [--max-lowers N]\n"
    "                                     REF\n"
    "\n"
    "Pulls an image from a registry (the Docker Registry HTTP API v2) and makes it a\n"
    "base layer, as 'dsec layer import' does.\n"
    "\n"
    "  REF             [https://|http://]HOST[:PORT]/REPO[:TAG|@sha256:DIGEST];\n"
    "                  http:// only for a loopback registry; no HOST: Docker Hub\n"
    "  --as N@V        the layer to make (default: REPO's last part @ TAG)\n"
    "  --platform P    the image of a multi-arch index (default linux/amd64)\n"
    "  --creds U:P     credentials (bearer-token or basic auth), else\n"
    "                  $DSEC_REGISTRY_CREDS; default anonymous\n"
    "  --ca-file PEM   CA certificates for the registry's TLS (default the system's)\n"
    "  --max-lowers N  as for import (default %zu)\n"
    "\n"
    "Every blob is checked against its digest as it streams; a mismatch keeps\n"
    "nothing. A pull that stops halfway keeps the layers it completed (in\n"
    "STATE/oci/downloads) and the next pull uses them; layers another image\n"
    "already has are not fetched at all. Progress goes to stderr on a terminal.\n",
    oci::default_max_lowers);
}

struct common {
  std::string plat, max_lowers;
};

int parse_args(std::string_view verb, args& a, std::vector<std::pair<const char*, std::string*>> opts,
               void (*help)(), std::vector<std::string>& positional) {
  while (!a.empty()) {
    if (a.help()) {
      help();
      return 0;
    }
    bool matched = false;
    for (auto& [name, value] : opts) {
      auto r = a.option(name, *value);
      if (!r)
        return usage_error(verb, r.error_value().message);
      if (*r) {
        matched = true;
        break;
      }
    }
    if (matched)
      continue;
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    positional.emplace_back(a.next());
  }
  return -1;
}

expected<oci::build_options> build_opts(const common& c, bool tty) {
  oci::build_options b;
  if (!c.max_lowers.empty()) {
    uint64_t n = 0;
    if (!parse_uint(c.max_lowers, 400, n) || n < 1)
      return make_error(errc::invalid_argument,
                        "--max-lowers: expected 1 to 400, not '" + c.max_lowers + "'");
    b.max_lowers = n;
  }
  if (tty)
    b.progress = [](const std::string& s) { std::fprintf(stderr, "\r\033[K%s\n", s.c_str()); };
  return b;
}

void report(const oci::build_result& r) {
  const auto& info = r.stored.info;
  std::printf("made base %s: %zu layers (%zu converted, %zu already stored%s), %zu lowers, "
              "%s, %.2f s\n",
              info.ref.to_string().c_str(), r.layers, r.converted, r.reused,
              r.flattened ? (", " + std::to_string(r.flattened) + " flattened").c_str() : "",
              info.lowers.size(), format_size(info.size).c_str(), r.seconds);
  for (const auto& s : r.skipped)
    std::fprintf(stderr, "dsec: layer import: left out %s\n", s.c_str());
}

int import_verb(const std::string& state, args& a) {
  constexpr std::string_view verb = "layer import";
  common c;
  std::vector<std::string> pos;
  if (int rc = parse_args(verb, a, {{"--platform", &c.plat}, {"--max-lowers", &c.max_lowers}},
                          print_import_help, pos);
      rc >= 0)
    return rc;
  if (pos.size() != 2)
    return usage_error(verb, pos.size() < 2 ? "expected NAME@VERSION and SOURCE"
                                            : "unexpected argument '" + pos[2] + "'");
  auto ref = parse_layer_ref(pos[0]);
  if (!ref)
    return usage_error(verb, ref.error_value().message);
  oci::platform plat;
  if (!c.plat.empty()) {
    auto p = oci::platform::parse(c.plat);
    if (!p)
      return usage_error(verb, p.error_value().message);
    plat = *p;
  }
  auto b = build_opts(c, ::isatty(2) != 0);
  if (!b)
    return usage_error(verb, b.error_value().message);
  auto st = store::open(state);
  if (!st)
    return fail(st.error_value());
  auto r = oci::import_image(*st, *ref, pos[1], plat, *b);
  if (!r)
    return fail(r.error_value());
  report(*r);
  return 0;
}

int pull_verb(const std::string& state, args& a) {
  constexpr std::string_view verb = "layer pull";
  common c;
  std::string as, creds, ca;
  std::vector<std::string> pos;
  if (int rc = parse_args(verb, a,
                          {{"--platform", &c.plat}, {"--max-lowers", &c.max_lowers},
                           {"--as", &as}, {"--creds", &creds}, {"--ca-file", &ca}},
                          print_pull_help, pos);
      rc >= 0)
    return rc;
  if (pos.size() != 1)
    return usage_error(verb, pos.empty() ? "expected REF" : "unexpected argument '" + pos[1] + "'");
  auto ref = registry::reference::parse(pos[0]);
  if (!ref)
    return usage_error(verb, ref.error_value().message);
  auto layer = parse_layer_ref(as.empty() ? ref->default_layer() : as);
  if (!layer)
    return usage_error(verb, "--as: " + layer.error_value().message);
  registry::pull_options o;
  if (!c.plat.empty()) {
    auto p = oci::platform::parse(c.plat);
    if (!p)
      return usage_error(verb, p.error_value().message);
    o.plat = *p;
  }
  bool tty = ::isatty(2) != 0;
  auto b = build_opts(c, tty);
  if (!b)
    return usage_error(verb, b.error_value().message);
  o.build = *b;
  o.ca_file = ca;
  if (creds.empty())
    if (const char* e = std::getenv("DSEC_REGISTRY_CREDS"))
      creds = e;
  if (!creds.empty()) {
    auto colon = creds.find(':');
    o.username = creds.substr(0, colon);
    o.password = colon == std::string::npos ? std::string{} : creds.substr(colon + 1);
  }
  if (tty)
    o.progress = [](const std::string& s, bool live) {
      std::fprintf(stderr, live ? "\r\033[K%s" : "\r\033[K%s\n", s.c_str());
    };
  auto st = store::open(state);
  if (!st)
    return fail(st.error_value());
  auto r = registry::pull(*st, *ref, *layer, o);
  if (!r)
    return fail(r.error_value());
  std::printf("pulled %s (%s): %zu blobs fetched (%s), %zu from an earlier pull\n",
              r->ref.to_string().c_str(), r->manifest_digest.c_str(), r->blobs_fetched,
              format_size(r->bytes_fetched).c_str(), r->blobs_resumed);
  report(r->built);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  global_options g;
  g.state_dir = default_state_dir();
  args a{argc, argv, 1};
  if (auto rc = parse_global_options(a, g))
    return *rc;
  if (a.next() != "layer")
    return usage_error("", "dsec-oci runs 'dsec layer import' and 'dsec layer pull'");
  auto verb = std::string{a.next()};
  if (verb == "import")
    return import_verb(g.state_dir, a);
  if (verb == "pull")
    return pull_verb(g.state_dir, a);
  return usage_error("layer", "dsec-oci has no verb '" + verb + "' (import or pull)");
}

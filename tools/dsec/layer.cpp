// dsec layer build | ls | rm | inspect: the command line over dsec::store;
// import and pull (OCI images) run dsec-oci (tools/dsec_oci.cpp).
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <ctime>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/layer.hpp"
#include "runtime/store.hpp"
#include "runtime/units.hpp"
#include "tools/dsec/cli.hpp"

namespace dsec::cli {

namespace {

std::string state_of(const global_options& g) {
  return g.state_dir.empty() ? default_state_dir() : g.state_dir;
}

// The store for a verb that only reads or removes: a state directory that does
// not exist is an error (a mistyped --state), never made empty.
expected<store> open_existing(const global_options& g) {
  auto dir = state_of(g);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return make_error(errc::not_found, "no layer store at " + dir
                                         + " (the directory does not exist; `dsec layer build` "
                                           "makes it, --state DIR or $DSEC_STATE names another)");
  return store::open(dir);
}

void print_layer_help(const std::string& state) {
  std::printf(
    "Usage: dsec [--state DIR] layer VERB ...\n"
    "\n"
    "Manages the local layer store: read-only EROFS images that sandboxes are made\n"
    "of (a base, a workdir and tool layers, joined with overlayfs).\n"
    "\n"
    "Verbs:\n"
    "  build --kind KIND [--compress ALG] NAME@VERSION SRC\n"
    "                      build a layer from a directory or a tar archive\n"
    "  ls                  list the layers in the store\n"
    "  rm NAME@VERSION     remove a layer\n"
    "  import NAME@VERSION oci:DIR[:TAG] | docker-archive:FILE\n"
    "                      make a base layer of a container image on disk\n"
    "  pull REF [--as NAME@VERSION]\n"
    "                      make a base layer of an image from a registry\n"
    "  inspect NAME@VERSION\n"
    "                      show a layer: its images (an image's lowers) and config\n"
    "\n"
    "The store lives in the state directory: the global --state DIR, else\n"
    "$DSEC_STATE, else /var/lib/dsec (now: %s).\n"
    "Run 'dsec layer VERB --help' for the options of one verb.\n",
    state.c_str());
}

void print_build_help() {
  std::printf(
    "Usage: dsec [--state DIR] layer build --kind base|workdir|tool [--compress lz4|lz4hc]\n"
    "                                      [--whiteouts] NAME@VERSION SRC\n"
    "\n"
    "Builds layer NAME@VERSION from SRC into a deterministic EROFS image in the store.\n"
    "\n"
    "  --kind KIND     the slot the layer fills in a sandbox (required):\n"
    "                  base     an operating system (docker export, debootstrap, busybox)\n"
    "                  workdir  a task's working tree\n"
    "                  tool     a grader, a compiler, a test runner\n"
    "  --compress ALG  compress the image: lz4 (fast) or lz4hc (smaller, slower to\n"
    "                  build). Default: uncompressed, the fastest to read; a sparse\n"
    "                  file's holes (of 1 MiB or more) then take no space.\n"
    "  --whiteouts     keep overlayfs whiteouts (0/0 character devices) and opaque or\n"
    "                  redirect directories (trusted.overlay.* xattrs) in a tool or\n"
    "                  workdir layer, where they hide or rename the files of the\n"
    "                  layers below; without it such a source is refused, naming the\n"
    "                  file. A base layer keeps them always.\n"
    "  NAME@VERSION    each part 1..128 of letters, digits and . _ + -, starting with a\n"
    "                  letter or digit. Versions are immutable: to change a layer, build\n"
    "                  a new version (or 'dsec layer rm' the old one first). Building\n"
    "                  the same content again under the same name and kind changes\n"
    "                  nothing and succeeds ('unchanged'); other content is refused,\n"
    "                  with both digests.\n"
    "  SRC             a directory, used as is, or a tar archive (plain, gzip, xz, zstd,\n"
    "                  ...; e.g. the output of 'docker export'). Owners, modes, mtimes and\n"
    "                  xattrs are kept (an mtime before 1970 or after 2100-01-01 becomes\n"
    "                  2100-01-01). The same content always gives the same digest and\n"
    "                  is stored once; mtimes count, so a tar of a directory has its\n"
    "                  digest only if it keeps sub-second mtimes (tar --format=posix).\n"
    "                  Device nodes and sockets are left out (each named\n"
    "                  on stderr): sandboxes get /dev from dsec's system layer. Fifos are\n"
    "                  kept.\n"
    "\n"
    "The store is the state directory: --state DIR before the verb, else $DSEC_STATE,\n"
    "else /var/lib/dsec.\n");
}

void print_ls_help() {
  std::printf(
    "Usage: dsec [--state DIR] layer ls\n"
    "\n"
    "Lists the layers in the store, sorted by name and version: NAME@VERSION, kind,\n"
    "image size, digest (first 12 hex digits of the sha256) and creation time (UTC).\n"
    "Diff layers (`dsec snapshot`) add ON: the environment each sits on, then the\n"
    "one below it, down to a base (\"snapshot=d1@1 <- base=debian@12 tool=t@1\").\n"
    "\n"
    "The store is the state directory: --state DIR before the verb, else $DSEC_STATE,\n"
    "else /var/lib/dsec.\n");
}

void print_rm_help() {
  std::printf(
    "Usage: dsec [--state DIR] layer rm NAME@VERSION\n"
    "\n"
    "Removes a layer from the store. Refused while a sandbox uses it. Its image is\n"
    "deleted unless another layer has the same content. The version can be built\n"
    "again afterwards.\n"
    "\n"
    "The store is the state directory: --state DIR before the verb, else $DSEC_STATE,\n"
    "else /var/lib/dsec.\n");
}

// Splits a verb's arguments into positionals, handling --help, `--` and the
// verb's options. Returns -1 to go on, else the exit status to return.
struct option_spec {
  const char* name;
  std::string* value; ///< an option with a value, or
  bool* flag = nullptr; ///< (value null) a flag
};

int parse_verb_args(std::string_view verb, args& a, const std::vector<option_spec>& options,
                    void (*help)(), std::vector<std::string>& positional) {
  while (!a.empty()) {
    if (a.help()) {
      help();
      return 0;
    }
    if (a.rest(positional))
      break;
    bool matched = false;
    for (const auto& o : options) {
      if (o.flag) {
        if (a.flag(o.name)) {
          *o.flag = true;
          matched = true;
          break;
        }
        continue;
      }
      auto r = a.option(o.name, *o.value);
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

std::string short_digest(const std::string& digest) {
  auto colon = digest.find(':');
  auto hex = colon == std::string::npos ? digest : digest.substr(colon + 1);
  return hex.substr(0, 12);
}

std::string iso_time(int64_t seconds) {
  time_t t = static_cast<time_t>(seconds);
  struct tm tm{};
  char buf[32];
  if (::gmtime_r(&t, &tm) == nullptr
      || std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
    return std::to_string(seconds);
  return buf;
}

int build_verb(const global_options& g, args& a) {
  constexpr std::string_view verb = "layer build";
  std::string kind_arg, compress;
  bool whiteouts = false;
  std::vector<std::string> positional;
  if (int rc = parse_verb_args(verb, a,
                               {{"--kind", &kind_arg},
                                {"--compress", &compress},
                                {"--whiteouts", nullptr, &whiteouts}},
                               print_build_help, positional);
      rc >= 0)
    return rc;
  if (kind_arg.empty())
    return usage_error(verb, "missing --kind (base, workdir or tool)");
  auto kind = parse_layer_kind(kind_arg);
  if (!kind)
    return usage_error(verb, kind.error_value().message);
  if (*kind == layer_kind::diff)
    return usage_error(verb, "--kind diff: diff layers are made by `dsec snapshot`, not built");
  if (!compress.empty() && compress != "lz4" && compress != "lz4hc")
    return usage_error(verb, "unknown --compress '" + compress + "' (expected lz4 or lz4hc)");
  if (positional.empty())
    return usage_error(verb, "missing NAME@VERSION and SRC");
  if (positional.size() == 1)
    return usage_error(verb, "missing SRC (a directory or a tar archive)");
  if (positional.size() > 2)
    return usage_error(verb, "unexpected argument '" + positional[2] + "'");
  auto ref = parse_layer_ref(positional[0]);
  if (!ref)
    return usage_error(verb, ref.error_value().message);

  auto st = store::open(state_of(g));
  if (!st)
    return fail(st.error_value());
  auto res = st->build(*kind, *ref, positional[1], build_options{compress, whiteouts});
  if (!res)
    return fail(res.error_value());
  const auto& info = res->info;
  if (res->existed) {
    std::printf("unchanged %s %s sha256:%s (the same content was already built as it)\n",
                to_string(info.kind), info.ref.to_string().c_str(),
                short_digest(info.digest).c_str());
    return 0;
  }
  std::printf("built %s %s sha256:%s (%s, %.2f s%s)\n", to_string(info.kind),
              info.ref.to_string().c_str(), short_digest(info.digest).c_str(),
              format_size(info.size).c_str(), res->seconds,
              res->deduplicated ? ", content already stored" : "");
  for (const auto& s : res->skipped)
    std::fprintf(stderr, "dsec: layer build: left out %s\n", s.c_str());
  return 0;
}

int ls_verb(const global_options& g, args& a) {
  constexpr std::string_view verb = "layer ls";
  std::vector<std::string> positional;
  if (int rc = parse_verb_args(verb, a, {}, print_ls_help, positional); rc >= 0)
    return rc;
  if (!positional.empty())
    return usage_error(verb, "unexpected argument '" + positional[0] + "'");

  auto st = open_existing(g);
  if (!st)
    return fail(st.error_value());
  auto layers = st->list();
  if (!layers)
    return fail(layers.error_value());
  if (layers->empty()) {
    std::printf("no layers in %s\n", st->dir().c_str());
    return 0;
  }

  // A diff layer (snapshots) shows its chain: what it sits on, down to a base.
  std::map<std::string, std::string> records;
  bool diffs = false;
  for (const auto& l : *layers) {
    records[l.ref.to_string()] = l.on;
    diffs = diffs || l.kind == layer_kind::diff;
  }
  auto chain = [&](const layer_info& l) {
    if (l.kind != layer_kind::diff)
      return std::string{};
    std::string out, rec = l.on;
    for (int depth = 0; depth < 64; ++depth) {
      out += (out.empty() ? "" : " <- ") + rec;
      auto at = rec.find("snapshot=");
      if (at == std::string::npos)
        break;
      auto parent = rec.substr(at + 9, rec.find(' ', at) == std::string::npos
                                         ? std::string::npos : rec.find(' ', at) - at - 9);
      auto it = records.find(parent);
      if (it == records.end()) {
        out += " <- (" + parent + " is gone)";
        break;
      }
      rec = it->second;
    }
    return out;
  };
  std::vector<std::vector<std::string>> rows{{"LAYER", "KIND", "SIZE", "DIGEST", "CREATED"}};
  if (diffs)
    rows.front().push_back("ON");
  for (const auto& l : *layers) {
    rows.push_back({l.ref.to_string(), to_string(l.kind), format_size(l.size),
                    short_digest(l.digest), iso_time(l.created)});
    if (diffs)
      rows.back().push_back(chain(l));
  }
  print_table(rows);
  return 0;
}

int rm_verb(const global_options& g, args& a) {
  constexpr std::string_view verb = "layer rm";
  std::vector<std::string> positional;
  if (int rc = parse_verb_args(verb, a, {}, print_rm_help, positional); rc >= 0)
    return rc;
  if (positional.empty())
    return usage_error(verb, "missing NAME@VERSION");
  if (positional.size() > 1)
    return usage_error(verb, "unexpected argument '" + positional[1] + "'");
  auto ref = parse_layer_ref(positional[0]);
  if (!ref)
    return usage_error(verb, ref.error_value().message);

  auto st = open_existing(g);
  if (!st)
    return fail(st.error_value());
  if (auto r = st->remove(*ref); !r)
    return fail(r.error_value());
  std::printf("removed %s\n", ref->to_string().c_str());
  return 0;
}

void print_inspect_help() {
  std::printf(
    "Usage: dsec [--state DIR] layer inspect NAME@VERSION\n"
    "\n"
    "Shows one layer: kind, size, digest, source, creation time; for an OCI image\n"
    "(dsec layer import | pull) its manifest digest, its lowers (EROFS images,\n"
    "topmost first) and its config (Env, WorkingDir, User, Entrypoint, Cmd), which\n"
    "'dsec run' uses as its command's defaults.\n");
}

int inspect_verb(const global_options& g, args& a) {
  constexpr std::string_view verb = "layer inspect";
  std::vector<std::string> positional;
  if (int rc = parse_verb_args(verb, a, {}, print_inspect_help, positional); rc >= 0)
    return rc;
  if (positional.size() != 1)
    return usage_error(verb, positional.empty() ? "missing NAME@VERSION"
                                                : "unexpected argument '" + positional[1] + "'");
  auto ref = parse_layer_ref(positional[0]);
  if (!ref)
    return usage_error(verb, ref.error_value().message);
  auto st = open_existing(g);
  if (!st)
    return fail(st.error_value());
  auto info = st->find(*ref);
  if (!info)
    return fail(info.error_value());
  std::printf("layer:    %s\nkind:     %s\nsize:     %s\ndigest:   %s\ncreated:  %s\nsource:   %s\n",
              info->ref.to_string().c_str(), to_string(info->kind),
              format_size(info->size).c_str(), info->digest.c_str(),
              iso_time(info->created).c_str(), info->source.c_str());
  if (!info->manifest.empty())
    std::printf("manifest: %s\n", info->manifest.c_str());
  if (!info->lowers.empty()) {
    std::printf("lowers:   %zu (topmost first)\n", info->lowers.size());
    for (const auto& d : info->lowers)
      std::printf("  %s\n", d.c_str());
  }
  if (!info->config.empty()) {
    auto j = nlohmann::json::parse(info->config, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      std::printf("config:   %s\n", info->config.c_str());
    else
      std::printf("config:\n%s\n",
                  j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  return 0;
}

// import and pull: dsec-oci, beside this binary, else $DSEC_OCI, else installed.
int hand_over_oci(const global_options& g, std::string_view verb, args& a) {
  std::string beside_dir;
  auto path = find_companion("dsec-oci", "DSEC_OCI", beside_dir);
  if (path.empty()) {
    std::fprintf(stderr, "dsec: layer %s needs dsec-oci, which was not found beside dsec, "
                         "$DSEC_OCI is not set, and not in " DSEC_LIBEXECDIR "\n",
                 std::string{verb}.c_str());
    return 1;
  }
  std::vector<std::string> words{path, "--state", state_of(g), "layer", std::string{verb}};
  while (!a.empty())
    words.emplace_back(a.next());
  std::vector<char*> argv;
  for (auto& w : words)
    argv.push_back(w.data());
  argv.push_back(nullptr);
  ::execv(path.c_str(), argv.data());
  std::fprintf(stderr, "dsec: layer %s: cannot run %s: %s\n", std::string{verb}.c_str(),
               path.c_str(), std::strerror(errno));
  return 1;
}

} // namespace

int layer_main(const global_options& g, args& a) {
  if (a.help()) {
    print_layer_help(state_of(g));
    return 0;
  }
  if (a.empty())
    return usage_error("layer", "missing verb (build, ls, rm, import, pull or inspect)");
  if (a.at_option())
    return usage_error("layer", "unknown option '" + std::string{a.peek()} + "'");
  auto verb = std::string{a.next()};
  if (verb == "build")
    return build_verb(g, a);
  if (verb == "ls")
    return ls_verb(g, a);
  if (verb == "rm")
    return rm_verb(g, a);
  if (verb == "inspect")
    return inspect_verb(g, a);
  if (verb == "import" || verb == "pull")
    return hand_over_oci(g, verb, a);
  return usage_error("layer", "unknown verb '" + verb
                                + "' (expected build, ls, rm, import, pull or inspect)");
}

} // namespace dsec::cli

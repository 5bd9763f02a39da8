// dsec layer build | ls | rm: the command line over dsec::store.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/layer.hpp"
#include "runtime/store.hpp"
#include "runtime/units.hpp"
#include "tools/dsec/cli.hpp"

namespace dsec::cli {

namespace {

std::string state_of(const global_options& g) {
  return g.state_dir.empty() ? default_state_dir() : g.state_dir;
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
    "\n"
    "The store lives in the state directory: the global --state DIR, else\n"
    "$DSEC_STATE, else /var/lib/dsec (now: %s).\n"
    "Run 'dsec layer VERB --help' for the options of one verb.\n",
    state.c_str());
}

void print_build_help() {
  std::printf(
    "Usage: dsec [--state DIR] layer build --kind base|workdir|tool [--compress lz4|lz4hc]\n"
    "                                      NAME@VERSION SRC\n"
    "\n"
    "Builds layer NAME@VERSION from SRC into a deterministic EROFS image in the store.\n"
    "\n"
    "  --kind KIND     the slot the layer fills in a sandbox (required):\n"
    "                  base     an operating system (docker export, debootstrap, busybox)\n"
    "                  workdir  a task's working tree\n"
    "                  tool     a grader, a compiler, a test runner\n"
    "  --compress ALG  compress the image: lz4 (fast) or lz4hc (smaller, slower to\n"
    "                  build). Default: uncompressed, the fastest to read.\n"
    "  NAME@VERSION    each part 1..128 of letters, digits and . _ + -, starting with a\n"
    "                  letter or digit. Versions are immutable: to change a layer, build\n"
    "                  a new version (or 'dsec layer rm' the old one first).\n"
    "  SRC             a directory, used as is, or a tar archive (plain, gzip, xz, zstd,\n"
    "                  ...; e.g. the output of 'docker export'). Owners, modes, mtimes and\n"
    "                  xattrs are kept. The same content always gives the same digest and\n"
    "                  is stored once. Device nodes and sockets are left out (each named\n"
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
  std::string* value;
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
  std::vector<std::string> positional;
  if (int rc = parse_verb_args(verb, a, {{"--kind", &kind_arg}, {"--compress", &compress}},
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
  auto res = st->build(*kind, *ref, positional[1], build_options{compress});
  if (!res)
    return fail(res.error_value());
  const auto& info = res->info;
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

  auto st = store::open(state_of(g));
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
  std::vector<size_t> width(rows.front().size(), 0);
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); ++i)
      width[i] = std::max(width[i], row[i].size());
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size())
        line.append(width[i] - row[i].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
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

  auto st = store::open(state_of(g));
  if (!st)
    return fail(st.error_value());
  if (auto r = st->remove(*ref); !r)
    return fail(r.error_value());
  std::printf("removed %s\n", ref->to_string().c_str());
  return 0;
}

} // namespace

int layer_main(const global_options& g, args& a) {
  if (a.help()) {
    print_layer_help(state_of(g));
    return 0;
  }
  if (a.empty())
    return usage_error("layer", "missing verb (build, ls or rm)");
  if (a.at_option())
    return usage_error("layer", "unknown option '" + std::string{a.peek()} + "'");
  auto verb = std::string{a.next()};
  if (verb == "build")
    return build_verb(g, a);
  if (verb == "ls")
    return ls_verb(g, a);
  if (verb == "rm")
    return rm_verb(g, a);
  return usage_error("layer", "unknown verb '" + verb + "' (expected build, ls or rm)");
}

} // namespace dsec::cli

// dsec --connect HOST:PORT cp: files into and out of a daemon's sandbox, as tar
// archives made and unpacked by the host's tar. An archive that comes out of a
// sandbox is untrusted (the sandbox's own tar made it): it is checked and
// rewritten before the host's tar, running as root, sees it.
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tools/dsec/remote.hpp"

extern char** environ;

namespace dsec::cli::remote {

namespace {

const char* cp_usage = R"(usage: dsec --connect HOST:PORT cp SRC DST

Copies files between this machine and a sandbox of the daemon. Exactly one of
SRC and DST is in a sandbox, written ID:/ABSOLUTE/PATH; the other is a local
path.

  dsec ... cp ./src ID:/work        copies the file or directory ./src into the
                                    sandbox's directory /work (it must exist):
                                    /work/src
  dsec ... cp ID:/work/out ./res    copies the sandbox's file or directory
                                    /work/out into the local directory ./res
                                    (it must exist): ./res/out

Both directions go through tar archives: this machine's tar packs and unpacks
here, the sandbox's tar (its image must have one, e.g. busybox) there. What
comes out of a sandbox is not trusted: files land owned by the user running
dsec, with its umask and without set-user-ID or set-group-ID bits; device
nodes and fifos are skipped (with a warning); existing local directories keep
their owners and modes; names with '..' or a leading '/' stay inside DST.

Options:
  -h, --help   this text
)";

// ID:/path, or nothing when `s` is a local path. An id has no '/'.
bool split_remote(const std::string& s, std::string& id, std::string& path) {
  auto colon = s.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= s.size()
      || s[colon + 1] != '/' || s.find('/') < colon)
    return false;
  id = s.substr(0, colon);
  path = s.substr(colon + 1);
  return true;
}

// Runs the host's `argv` (found in PATH) with `input` on its stdin (or
// /dev/null) and its stdout in `output` (or ours); stderr is ours. Returns its
// status, 128+N for a signal.
expected<int> run_tool(const std::vector<std::string>& argv, const std::string* input,
                       std::string* output) {
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  auto close_all = [&] {
    for (int fd : {in[0], in[1], out[0], out[1]})
      if (fd >= 0)
        ::close(fd);
  };
  if ((input && ::pipe2(in, O_CLOEXEC) < 0) || (output && ::pipe2(out, O_CLOEXEC) < 0)) {
    auto e = sys_error("pipe for " + argv[0]);
    close_all();
    return e;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (input)
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  else
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (output)
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  std::vector<char*> cargv;
  for (const auto& s : argv)
    cargv.push_back(const_cast<char*>(s.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, argv[0].c_str(), &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    close_all();
    if (rc == ENOENT)
      return make_error(errc::not_found, argv[0] + " is not installed on this machine");
    return sys_error("cannot run " + argv[0], {}, rc);
  }
  // Ours: only the ends we use stay open.
  if (input) {
    ::close(in[0]);
    in[0] = -1;
  }
  if (output) {
    ::close(out[1]);
    out[1] = -1;
  }
  if (input) { // tar -x writes nothing to a pipe of ours: no deadlock
    (void) write_all(in[1], *input); // stops early if tar exits (its status says why)
    ::close(in[1]);
    in[1] = -1;
  }
  if (output) {
    auto got = read_all(out[0]);
    ::close(out[0]);
    out[0] = -1;
    if (got)
      *output = std::move(*got);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR)
      return sys_error("waitpid " + argv[0]);
  if (WIFSIGNALED(status))
    return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

// ---- checking an untrusted tar archive --------------------------------------------

constexpr size_t block = 512;

size_t padded(uint64_t n) {
  return static_cast<size_t>((n + block - 1) / block * block);
}

// A numeric field: octal (ustar) or base-256 (GNU, first byte 0x80).
std::optional<uint64_t> number(const unsigned char* f, size_t len) {
  uint64_t v = 0;
  if (f[0] & 0x80) {
    if (f[0] != 0x80)
      return std::nullopt; // negative, or too large for us
    for (size_t i = 1; i < len; ++i) {
      if (v >> 56)
        return std::nullopt;
      v = v << 8 | f[i];
    }
    return v;
  }
  size_t i = 0;
  while (i < len && f[i] == ' ')
    ++i;
  for (; i < len && f[i] >= '0' && f[i] <= '7'; ++i) {
    if (v >> 60)
      return std::nullopt;
    v = v * 8 + (f[i] - '0');
  }
  for (; i < len; ++i)
    if (f[i] != ' ' && f[i] != '\0')
      return std::nullopt;
  return v;
}

bool checksum_ok(const unsigned char* h) {
  auto stored = number(h + 148, 8);
  if (!stored)
    return false;
  uint64_t u = 0;
  int64_t s = 0;
  for (size_t i = 0; i < block; ++i) {
    unsigned char c = i >= 148 && i < 156 ? ' ' : h[i];
    u += c;
    s += static_cast<signed char>(c);
  }
  return u == *stored || static_cast<uint64_t>(s) == *stored;
}

std::string field(const unsigned char* f, size_t len) {
  size_t n = 0;
  while (n < len && f[n])
    ++n;
  return std::string{reinterpret_cast<const char*>(f), n};
}

std::string name_of(const unsigned char* h) {
  std::string name = field(h, 100);
  if (std::memcmp(h + 257, "ustar", 5) == 0) {
    std::string prefix = field(h + 345, 155);
    if (!prefix.empty())
      name = prefix + "/" + name;
  }
  return name;
}

struct checked_tar {
  std::string archive;              ///< what the host's tar may unpack
  std::vector<std::string> skipped; ///< members left out, described
};

// Walks the archive the way GNU tar reads it, and rebuilds it from what it
// understood: regular files, directories, symbolic and hard links (with GNU
// long names or pax headers). Device nodes and fifos are left out, and so are
// hard links to them (the host's tar could not make those links). Anything
// that GNU tar might read differently from us is refused: bad checksums, global
// or sparse headers, unknown member types, data on members that have none.
expected<checked_tar> check_tar(const std::string& in) {
  auto refuse = [](const std::string& why) {
    return make_error(errc::invalid_argument, "refused the archive from the sandbox: " + why);
  };
  checked_tar out;
  std::string pending; // extended headers of the next member
  bool has_pax_size = false;
  uint64_t pax_size = 0;
  std::string long_name, pax_path, long_link, pax_link;
  std::set<std::string> dropped; // names of the devices and fifos left out
  bool had_pax = false, had_gnu = false;
  size_t pos = 0;
  auto at = [&](size_t p) { return reinterpret_cast<const unsigned char*>(in.data()) + p; };
  for (;;) {
    if (pos == in.size())
      break; // no end-of-archive blocks: tolerated
    if (pos + block > in.size())
      return refuse("it is truncated");
    const unsigned char* h = at(pos);
    bool zero = true;
    for (size_t i = 0; i < block && zero; ++i)
      zero = h[i] == 0;
    if (zero)
      break; // the end (GNU tar stops here too; whatever follows is dropped)
    if (!checksum_ok(h))
      return refuse("a header's checksum is wrong at offset " + std::to_string(pos));
    char type = static_cast<char>(h[156]);
    auto size = number(h + 124, 12);
    if (!size)
      return refuse("a header's size is malformed at offset " + std::to_string(pos));
    std::string name = !long_name.empty() ? long_name : !pax_path.empty() ? pax_path : name_of(h);
    if (type == 'x' || type == 'L' || type == 'K') {
      if (pos + block + *size > in.size())
        return refuse("it is truncated");
      std::string data = in.substr(pos + block, static_cast<size_t>(*size));
      if (type == 'x') {
        had_pax = true;
        // Records: "LEN key=value\n".
        size_t p = 0;
        while (p < data.size()) {
          size_t sp = data.find(' ', p);
          if (sp == std::string::npos)
            return refuse("a malformed pax header");
          size_t len = std::strtoull(data.c_str() + p, nullptr, 10);
          if (len <= sp - p || p + len > data.size() || data[p + len - 1] != '\n')
            return refuse("a malformed pax header");
          std::string rec = data.substr(sp + 1, p + len - 1 - (sp + 1));
          auto eq = rec.find('=');
          if (eq == std::string::npos)
            return refuse("a malformed pax header");
          std::string key = rec.substr(0, eq), value = rec.substr(eq + 1);
          if (key == "size") {
            char* end = nullptr;
            unsigned long long v = std::strtoull(value.c_str(), &end, 10);
            if (value.empty() || *end != '\0' || value[0] < '0' || value[0] > '9')
              return refuse("a malformed pax size");
            pax_size = v;
            has_pax_size = true;
          } else if (key == "path") {
            pax_path = value;
          } else if (key == "linkpath") {
            pax_link = value;
          } else if (key.rfind("GNU.sparse", 0) == 0) {
            return refuse("sparse files are not supported");
          }
          p += len;
        }
      } else {
        had_gnu = true;
        if (type == 'L')
          long_name = field(reinterpret_cast<const unsigned char*>(data.data()), data.size());
        else if (type == 'K')
          long_link = field(reinterpret_cast<const unsigned char*>(data.data()), data.size());
      }
      if (had_pax && had_gnu)
        return refuse("both pax and GNU extended headers for '" + name + "'");
      pending.append(in, pos, block + padded(*size));
      pos += block + padded(*size);
      continue;
    }
    uint64_t data_size = has_pax_size ? pax_size : *size;
    bool keep = true;
    switch (type) {
      case '0':
      case '\0':
      case '7':
        if (!name.empty() && name.back() == '/' && data_size != 0)
          return refuse("'" + name + "' has data but is named like a directory");
        break;
      case '1':
      case '2':
      case '5':
        if (data_size != 0)
          return refuse("'" + name + "' is a link or directory with data");
        if (type == '1'
            && dropped.count(!long_link.empty() ? long_link
                             : !pax_link.empty() ? pax_link
                                                 : field(h + 157, 100))) {
          out.skipped.push_back(name + " (a hard link to a device node or fifo)");
          dropped.insert(name);
          keep = false;
        }
        break;
      case '3':
      case '4':
      case '6':
        if (data_size != 0)
          return refuse("'" + name + "' is a device or fifo with data");
        out.skipped.push_back(name + (type == '6' ? " (a fifo)" : " (a device node)"));
        dropped.insert(name);
        keep = false;
        break;
      default:
        return refuse("'" + name + "' has a member type ('" + std::string(1, type)
                      + "') dsec does not copy out");
    }
    size_t total = block + padded(data_size);
    if (pos + total > in.size())
      return refuse("it is truncated");
    if (keep) {
      out.archive += pending;
      out.archive.append(in, pos, total);
    }
    pending.clear();
    has_pax_size = false;
    long_name.clear();
    pax_path.clear();
    long_link.clear();
    pax_link.clear();
    had_pax = had_gnu = false;
    pos += total;
  }
  if (!pending.empty())
    return refuse("it ends inside an extended header");
  out.archive.append(2 * block, '\0');
  return out;
}

// The daemon's error about one side of the copy, named "cp: source|destination X".
int side_failed(const char* side, const std::string& where, error e) {
  while (!e.message.empty() && std::isspace(static_cast<unsigned char>(e.message.back())))
    e.message.pop_back(); // the sandbox's tar ends its complaint with a newline
  e.message = std::string{"cp: "} + side + " " + where + ": " + e.message;
  return fail(e);
}

} // namespace

int cp_main(context& ctx, args& a) {
  auto verb = ctx.verb("cp");
  std::vector<std::string> pos;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(cp_usage, stdout);
      return 0;
    }
    if (a.peek() == "--") {
      a.rest(pos);
      break;
    }
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    pos.emplace_back(a.next());
  }
  if (pos.size() != 2)
    return usage_error(verb, "expected SRC DST, got " + std::to_string(pos.size())
                               + " argument" + (pos.size() == 1 ? "" : "s"));
  const auto& src = pos[0];
  const auto& dst = pos[1];
  std::string src_id, src_path, dst_id, dst_path;
  bool src_remote = split_remote(src, src_id, src_path);
  bool dst_remote = split_remote(dst, dst_id, dst_path);
  if (src_remote == dst_remote)
    return usage_error(verb, src_remote ? "both SRC and DST are in a sandbox; one must be local"
                                        : "neither SRC nor DST is in a sandbox (ID:/ABSOLUTE/PATH)");
  if (!src_remote) {
    // ---- local -> sandbox
    struct stat st;
    if (::lstat(src.c_str(), &st) < 0)
      return fail(sys_error("cp: source", src));
    std::string p = src;
    while (p.size() > 1 && p.back() == '/')
      p.pop_back();
    std::string parent, name;
    if (p == "/") {
      parent = "/";
      name = ".";
    } else if (auto slash = p.rfind('/'); slash == std::string::npos) {
      parent = ".";
      name = p;
    } else {
      parent = slash == 0 ? "/" : p.substr(0, slash);
      name = p.substr(slash + 1);
    }
    std::string tar;
    auto rc = run_tool({"tar", "-c", "-f", "-", "--numeric-owner", "-C", parent, "--", name},
                       nullptr, &tar);
    if (!rc)
      return fail(make_error(rc.error_value().code, "cp: source " + src + ": cannot pack it: "
                                                      + rc.error_value().to_string()));
    if (*rc != 0)
      return fail(make_error(errc::tool_failed, "cp: source " + src
                                                  + ": packing it failed (tar exited with "
                                                  + std::to_string(*rc) + ")"));
    auto c = ctx.connect();
    if (!c)
      return fail(c.error_value());
    auto put = (*c)->put(dst_id, dst_path, std::move(tar));
    if (!put)
      return side_failed("destination", dst, std::move(put).error_value());
    return 0;
  }
  // ---- sandbox -> local
  struct stat st;
  if (::stat(dst.c_str(), &st) < 0)
    return fail(sys_error("cp: destination", dst));
  if (!S_ISDIR(st.st_mode))
    return fail(make_error(errc::invalid_argument, "cp: destination " + dst
                                                     + " is not a directory"));
  // ID:/dir/ copies dir itself, as ./dir/ does the other way (the daemon
  // would pack the contents of /dir/ without its name).
  while (src_path.size() > 1 && src_path.back() == '/')
    src_path.pop_back();
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  auto got = (*c)->get(src_id, src_path);
  if (!got)
    return side_failed("source", src, std::move(got).error_value());
  auto checked = check_tar(*got);
  if (!checked)
    return side_failed("source", src, std::move(checked).error_value());
  for (const auto& s : checked->skipped)
    std::fprintf(stderr, "dsec: cp: skipped %s\n", s.c_str());
  auto rc = run_tool({"tar", "-x", "-f", "-", "-C", dst, "--no-same-owner",
                      "--no-same-permissions", "--no-overwrite-dir"},
                     &checked->archive, nullptr);
  if (!rc)
    return fail(make_error(rc.error_value().code, "cp: destination " + dst
                                                    + ": cannot unpack into it: "
                                                    + rc.error_value().to_string()));
  if (*rc != 0)
    return fail(make_error(errc::tool_failed, "cp: destination " + dst
                                                + ": unpacking into it failed (tar exited with "
                                                + std::to_string(*rc) + ")"));
  return 0;
}

} // namespace dsec::cli::remote

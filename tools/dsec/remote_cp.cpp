// dsec --connect HOST:PORT cp: files into and out of a daemon's sandbox, as tar
// archives. Into a sandbox, the host's tar packs the local files (the
// sandbox's tar unpacks them there). Out of one, the archive is untrusted (the
// sandbox's own tar, or whatever the agent put in its place, made it): it is
// read with libarchive and unpacked by runtime/untar.hpp, which never writes
// outside DST nor through a symbolic link, whatever the archive holds and
// whatever DST held before; no host tar sees it.
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/fd.hpp"
#include "runtime/untar.hpp"
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

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

Both directions go through tar archives: this machine's tar packs here, the
sandbox's tar (its image must have one, e.g. busybox) packs and unpacks there.
What comes out of a sandbox is not trusted, and dsec unpacks it itself: files
land owned by the user running dsec, with its umask and without set-user-ID,
set-group-ID or sticky bits; device nodes and fifos are skipped (with a
warning); nothing is written through a symbolic link, neither one the archive
made nor one DST had (such an entry stops the copy with an error); a leading
'/' is dropped, a name with '..', outside the copied name, or a hard link to
anything but a file of the same archive stops the copy; existing local
directories keep their owners and modes, other existing names are replaced.

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
    auto got = read_all(out[0], "the output of tar", "reading");
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
  // The copied name: every entry must be it or below it.
  auto top = src_path.substr(src_path.rfind('/') + 1);
  unique_fd dest{::open(dst.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (!dest)
    return fail(sys_error("cp: destination", dst));
  mode_t mask = ::umask(0);
  ::umask(mask);
  auto unpacked = untar_beneath(dest.get(), dst, *got, mask, top);
  if (!unpacked)
    return side_failed("source", src, std::move(unpacked).error_value());
  for (const auto& w : unpacked->warnings)
    std::fprintf(stderr, "dsec: cp: warning: %s\n", w.c_str());
  for (const auto& s : unpacked->skipped)
    std::fprintf(stderr, "dsec: cp: skipped %s\n", s.c_str());
  return 0;
}

} // namespace dsec::cli::remote

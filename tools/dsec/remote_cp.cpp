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
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/transfer.hpp"
#include "runtime/fd.hpp"
#include "runtime/untar.hpp"
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

extern char** environ;

namespace dsec::cli::remote {

namespace {

const char* cp_usage = R"(usage: dsec --connect HOST:PORT cp SRC DST

Copies files between this machine and a sandbox of the daemon, as docker cp
does. Exactly one of SRC and DST is in a sandbox, written ID:/ABSOLUTE/PATH;
the other is a local path, or '-' (a tar stream on stdin or stdout).

  dsec ... cp ./src ID:/work        /work is a directory: copies the file or
                                    directory ./src into it (/work/src)
  dsec ... cp ./a.txt ID:/work/b.txt  /work/b.txt is not a directory: copies
                                    ./a.txt as /work/b.txt (/work must exist)
  dsec ... cp ID:/work/out ./res    ./res is a directory: ./res/out
  dsec ... cp ID:/work/out ./new    ./new is not a directory: copies out as
                                    ./new (its parent must exist)
  dsec ... cp - ID:/work            unpacks the tar stream read from stdin in
                                    the sandbox's directory /work
  dsec ... cp ID:/work/out -        writes a tar stream of /work/out to stdout

Transfers stream: nothing holds a whole copy in memory, here or in the
daemon (pieces of 512 KiB go in, each once the daemon took the one before; what
comes out is read at the pace this side writes it). Both directions go through
tar: this machine's tar packs here, the sandbox's tar (its image's, else the
node's static busybox) packs and unpacks there. What comes out of a sandbox is
not trusted, and dsec unpacks it itself: files land owned by the user running
dsec, with its umask and without set-user-ID, set-group-ID or sticky bits;
device nodes and fifos are skipped (with a warning); nothing is written
through a symbolic link, neither one the archive made nor one DST had (such an
entry stops the copy with an error); a leading '/' is dropped, a name with
'..', outside the copied name, or a hard link to anything but a file of the
same archive stops the copy; existing local directories keep their owners and
modes, other existing names are replaced. `cp ID:PATH -` writes the
sandbox's archive as it is (untrusted: unpack it with care). An interrupted
copy leaves what was unpacked so far.

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

// The daemon's error about one side of the copy, named "cp: source|destination X".
int side_failed(const char* side, const std::string& where, error e) {
  while (!e.message.empty() && std::isspace(static_cast<unsigned char>(e.message.back())))
    e.message.pop_back(); // the sandbox's tar ends its complaint with a newline
  e.message = std::string{"cp: "} + side + " " + where + ": " + e.message;
  return fail(e);
}

} // namespace


namespace {

// The parent and last name of a path ("a" -> ".", "a"; "/a" -> "/", "a").
void split_path(std::string p, std::string& parent, std::string& name) {
  while (p.size() > 1 && p.back() == '/')
    p.pop_back();
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
}

// Whether PATH is a directory in the sandbox: its tar packs the name alone
// (--no-recursion) and the archive's first header says its type. False for
// a missing name or another kind; an error when the sandbox cannot say.
expected<bool> remote_is_dir(client& c, const std::string& id, const std::string& path) {
  std::string parent, name;
  split_path(path, parent, name);
  if (name == ".")
    return true;
  exec_request req;
  req.argv = {"tar", "-c", "-f", "-", "--no-recursion", "-C", parent, name};
  req.env = {transfer_tar_path};
  req.max_output = 64 * 1024;
  req.timeout_ms = 60 * 1000;
  req.idempotent = true; // it changes nothing
  auto r = c.exec(id, req);
  if (!r)
    return std::move(r).error_value();
  if (r->exit_code != 0)
    return false;
  if (r->out.size() < 512)
    return true; // it cannot say: into PATH, as before renames existed
  // The header must be PATH's own (the sandbox's tar may be anything): else
  // it cannot say either.
  std::string got{r->out.data(), ::strnlen(r->out.data(), 100)};
  while (got.size() > 1 && got.back() == '/')
    got.pop_back();
  if (got.rfind("./", 0) == 0)
    got.erase(0, 2);
  if (got != name)
    return true;
  return r->out[156] == '5';
}

// A BRE that matches `s` literally (GNU tar's --transform).
std::string bre_literal(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (std::strchr(".[]*^$\\|", ch))
      out += '\\';
    out += ch;
  }
  return out;
}

// The host's tar packing `name` of `parent` (as `rename`, when set) into a
// pipe: its pid and the pipe's read end.
expected<std::pair<pid_t, unique_fd>> spawn_pack(const std::string& parent,
                                                 const std::string& name,
                                                 const std::string& rename) {
  std::vector<std::string> argv = {"tar", "-c", "-f", "-", "--numeric-owner", "-C", parent};
  if (!rename.empty()) // the top name only; symbolic links' targets stay as they are
    argv.push_back("--transform=s|^" + bre_literal(name) + "|" + rename + "|S");
  argv.insert(argv.end(), {"--", name});
  int out[2];
  if (::pipe2(out, O_CLOEXEC) < 0)
    return sys_error("pipe for tar");
  unique_fd r{out[0]}, w{out[1]};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, w.get(), 1);
  std::vector<char*> cargv;
  for (const auto& x : argv)
    cargv.push_back(const_cast<char*>(x.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, "tar", &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0)
    return rc == ENOENT ? make_error(errc::not_found, "tar is not installed on this machine")
                        : sys_error("cannot run tar", {}, rc);
  return std::make_pair(pid, std::move(r));
}

int wait_tool(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR)
      return 255;
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

// A get's pieces between the thread that receives them and the one that
// unpacks them: at most two wait, so a slow disk here slows the sandbox's tar.
struct piece_queue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> pieces;
  bool ended = false, stop = false;
  std::string current; // the piece the reader looks at

  expected<void> push(std::string_view d) {
    std::unique_lock<std::mutex> lk{mu};
    cv.wait(lk, [&] { return pieces.size() < 2 || stop; });
    if (stop)
      return make_error(errc::closed, "the copy stopped");
    pieces.emplace_back(d);
    cv.notify_all();
    return {};
  }
  expected<std::string_view> pop() {
    std::unique_lock<std::mutex> lk{mu};
    cv.wait(lk, [&] { return !pieces.empty() || ended; });
    if (pieces.empty())
      return std::string_view{};
    current = std::move(pieces.front());
    pieces.pop_front();
    cv.notify_all();
    return std::string_view{current};
  }
  bool has_ended() {
    std::lock_guard<std::mutex> g{mu};
    return ended;
  }
  void finish(bool aborting) {
    std::lock_guard<std::mutex> g{mu};
    (aborting ? stop : ended) = true;
    cv.notify_all();
  }
};

void print_unpacked(const untar_result& u) {
  for (const auto& w : u.warnings)
    std::fprintf(stderr, "dsec: cp: warning: %s\n", w.c_str());
  for (const auto& s : u.skipped)
    std::fprintf(stderr, "dsec: cp: skipped %s\n", s.c_str());
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
    if (a.peek() != "-" && a.at_option())
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
  // The sandbox side's id, if it was given by name (`run --name`).
  auto named_id = [&](client& c) -> int {
    auto& id = src_remote ? src_id : dst_id;
    auto r = resolve_sandbox(c, id);
    if (!r)
      return side_failed(src_remote ? "source" : "destination", src_remote ? src : dst,
                         std::move(r).error_value());
    id = *r;
    return -1;
  };
  if (src == "-") {
    // ---- a tar stream on stdin -> a directory of the sandbox
    auto c = ctx.connect();
    if (!c)
      return fail(c.error_value());
    if (auto rc = named_id(**c); rc >= 0)
      return rc;
    auto put = (*c)->put_from(dst_id, dst_path, fd_source(0));
    if (!put)
      return side_failed("destination", dst, std::move(put).error_value());
    return 0;
  }
  if (dst == "-") {
    // ---- the sandbox's tar stream of PATH -> stdout
    while (src_path.size() > 1 && src_path.back() == '/')
      src_path.pop_back();
    auto c = ctx.connect();
    if (!c)
      return fail(c.error_value());
    if (auto rc = named_id(**c); rc >= 0)
      return rc;
    auto got = (*c)->get_into(src_id, src_path, fd_sink(1));
    if (!got)
      return side_failed("source", src, std::move(got).error_value());
    return 0;
  }
  if (!src_remote) {
    // ---- local -> sandbox
    struct stat st;
    if (::lstat(src.c_str(), &st) < 0)
      return fail(sys_error("cp: source", src));
    std::string parent, name;
    split_path(src, parent, name);
    auto c = ctx.connect();
    if (!c)
      return fail(c.error_value());
    if (auto rc = named_id(**c); rc >= 0)
      return rc;
    // docker cp: into DST when it is a directory, else as DST (a new name,
    // or a file replaced), in DST's parent.
    std::string into = dst_path, rename;
    bool must_be_dir = dst_path.back() == '/' || name == ".";
    if (!must_be_dir) {
      auto is_dir = remote_is_dir(**c, dst_id, dst_path);
      if (!is_dir)
        return side_failed("destination", dst, std::move(is_dir).error_value());
      if (!*is_dir) {
        std::string dparent, dname;
        split_path(dst_path, dparent, dname);
        into = dparent;
        if (dname != name)
          rename = dname;
      }
    }
    auto packer = spawn_pack(parent, name, rename);
    if (!packer)
      return fail(make_error(packer.error_value().code,
                             "cp: source " + src + ": cannot pack it: "
                               + packer.error_value().to_string()));
    auto& [pid, out] = *packer;
    auto put = (*c)->put_from(dst_id, into, fd_source(out.get()));
    out.reset(); // a tar still writing gets EPIPE
    int rc = wait_tool(pid);
    if (!put)
      return side_failed("destination", dst, std::move(put).error_value());
    if (rc != 0)
      return fail(make_error(errc::tool_failed, "cp: source " + src
                                                  + ": packing it failed (tar exited with "
                                                  + std::to_string(rc) + ")"));
    return 0;
  }
  // ---- sandbox -> local
  // ID:/dir/ copies dir itself, as ./dir/ does the other way (the daemon
  // would pack the contents of /dir/ without its name).
  while (src_path.size() > 1 && src_path.back() == '/')
    src_path.pop_back();
  // The copied name: every entry must be it or below it.
  auto top = src_path.substr(src_path.rfind('/') + 1);
  std::string into = dst, rename;
  struct stat st;
  if (::stat(dst.c_str(), &st) < 0 || !S_ISDIR(st.st_mode)) {
    if (dst.back() == '/')
      return fail(::stat(dst.c_str(), &st) < 0
                    ? sys_error("cp: destination", dst)
                    : make_error(errc::invalid_argument,
                                 "cp: destination " + dst + " is not a directory"));
    // docker cp: a name that is not a directory is the copy's new name.
    std::string dname;
    split_path(dst, into, dname);
    if (::stat(into.c_str(), &st) < 0)
      return fail(sys_error("cp: destination's directory", into));
    if (!S_ISDIR(st.st_mode))
      return fail(make_error(errc::invalid_argument,
                             "cp: destination's parent " + into + " is not a directory"));
    if (dname != top)
      rename = dname;
  }
  unique_fd dest{::open(into.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (!dest)
    return fail(sys_error("cp: destination", into));
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  if (auto rc = named_id(**c); rc >= 0)
    return rc;
  mode_t mask = ::umask(0);
  ::umask(mask);
  // The get runs on a thread of its own; this one unpacks as pieces come.
  piece_queue q;
  expected<uint64_t> got = uint64_t{0};
  std::thread getter([&] {
    got = (*c)->get_into(src_id, src_path, [&](std::string_view d) { return q.push(d); });
    q.finish(false);
  });
  auto unpacked = untar_stream(dest.get(), into, [&] { return q.pop(); }, mask, top, rename);
  bool get_ended = q.has_ended(); // then an unpacking error may be the get's
  if (!unpacked)
    q.finish(true); // stops the get (its sink fails, the daemon kills its tar)
  else
    for (;;) { // what follows the archive's end
      auto rest = q.pop();
      if (!rest || rest->empty())
        break;
    }
  getter.join();
  if (!unpacked && !get_ended)
    return side_failed("source", src, std::move(unpacked).error_value());
  if (!got)
    return side_failed("source", src, std::move(got).error_value());
  if (!unpacked)
    return side_failed("source", src, std::move(unpacked).error_value());
  print_unpacked(*unpacked);
  return 0;
}

} // namespace dsec::cli::remote

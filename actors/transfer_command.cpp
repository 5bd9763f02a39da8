// The command a transfer runs in a sandbox (transfer_command.hpp).
#include "actors/transfer_command.hpp"

#include "actors/transfer.hpp"

namespace dsec {

// What a put or get that found no tar says.
const char* const no_tar = "found no tar: the image has none and this node's system layer has no "
                     "busybox (install busybox-static on the node, or tar in the image)";


// What a failed tar of put or get (`what`: "get /work/x") means: a missing
// file or directory is not_found, a full disk too_large, anything else
// `otherwise` (a put's archive that tar refuses is the trainer's bad input, a
// get's failure the tool's) with tar's first line of stderr.
error tar_failure(const std::string& what, const exec_result& r, errc otherwise) {
  auto has = [&](const char* s) { return r.err.find(s) != std::string::npos; };
  if (has("No such file or directory") || has("Not a directory"))
    return make_error(errc::not_found, what + ": no such file or directory in the sandbox");
  if (has("No space left on device") || has("Disk quota exceeded"))
    return make_error(errc::too_large, what + ": the sandbox's writable layer is full (its"
                                               " environment's disk size)");
  auto line = r.err.substr(0, r.err.find('\n'));
  if (line.empty())
    line = r.signal ? "killed by signal " + std::to_string(r.signal) : "no message";
  return make_error(otherwise, what + ": tar in the sandbox exited with "
                                  + std::to_string(r.exit_code) + ": " + line);
}


// A transfer (exec_request.transfer) as the command the sandbox runs: its
// own tar, PATH, limits and handle settings; only the path, the window and
// the user come from the request.
expected<exec_request> transfer_command(const exec_request& in) {
  const auto& path = in.transfer_path;
  const char* verb = in.transfer == transfer_put ? "put" : "get";
  if (in.transfer != transfer_put && in.transfer != transfer_get)
    return make_error(errc::invalid_argument,
                      "transfer " + std::to_string(in.transfer) + " is not put (1) or get (2)");
  if (path.empty() || path.front() != '/')
    return make_error(errc::invalid_argument, std::string{verb} + ": the "
                                                + (in.transfer == transfer_put ? "destination"
                                                                               : "path")
                                                + " must be an absolute path, not '" + path
                                                + "'");
  if (!in.argv.empty() || in.detach || in.trusted)
    return make_error(errc::invalid_argument,
                      std::string{verb} + ": a transfer has no argv of its own, and is neither "
                                          "detached nor trusted");
  exec_request r;
  r.env = {put_get_path};
  // The sandbox's root by default, from /, whatever the image's User and
  // WorkingDir: transfers are the operator's.
  r.cwd = "/";
  r.uid = in.uid >= 0 ? in.uid : 0;
  r.gid = in.uid >= 0 ? in.gid : 0;
  r.timeout_ms = put_get_timeout_ms;
  r.max_output = 64 * 1024; // tar's complaints; a get's stdout streams
  r.handle = true;
  r.transfer = in.transfer;
  r.transfer_path = path;
  if (in.transfer == transfer_put) {
    r.argv = {"tar", "-x", "-f", "-", "-C", path};
    r.open_stdin = true;
    return r;
  }
  if (path.find_first_not_of('/') == std::string::npos)
    // tar would walk /proc and /dev, whose files change size as it reads.
    return make_error(errc::invalid_argument,
                      "get: the whole root (/) cannot be copied (it holds /proc and /dev); name "
                      "a directory, e.g. /work or /tmp");
  auto slash = path.find_last_of('/');
  std::string parent = slash == 0 ? "/" : path.substr(0, slash);
  std::string name = path.substr(slash + 1);
  r.argv = {"tar", "-c", "-f", "-", "-C", parent, name.empty() ? "." : name};
  r.stream = true;
  r.window = in.window > 0 ? in.window : transfer_window;
  return r;
}

// How a put's or get's tar (of `path`) failed, as their errors say it;
// nothing when it succeeded.
std::optional<error> tar_error(bool put, const std::string& path,
                               const expected<exec_result>& r) {
  auto what = put ? "put into " + path : "get " + path;
  if (!r) {
    auto e = r.error_value();
    if (e.code == errc::not_found && e.step == "execve")
      e.message = std::string{put ? "put " : "get "} + no_tar + ": " + e.message;
    return e;
  }
  if (r->timed_out)
    return make_error(errc::timeout, what + ": the sandbox's tar did not finish in "
                                       + std::to_string(put_get_timeout_ms / 1000) + " s");
  if (r->exit_code != 0 || r->signal != 0)
    return tar_failure(what, *r, put ? errc::invalid_argument : errc::tool_failed);
  return std::nullopt;
}

// What a transfer's tar ended with, as put's and get's errors say it.
expected<exec_result> transfer_outcome(const exec_request& req, expected<exec_result> r) {
  if (auto e = tar_error(req.transfer == transfer_put, req.transfer_path, r))
    return *e;
  r->out.clear();
  r->err.clear();
  return r;
}

// The whole-buffer put and get (put_atom, get_atom): the transfer's own
// command (transfer_command), with `tar` as its input and its output
// collected (at most 256 MiB) instead of streamed.
expected<exec_request> whole_buffer_command(uint8_t kind, const std::string& path,
                                            const std::string& tar) {
  exec_request in;
  in.transfer = kind;
  in.transfer_path = path;
  DSEC_TRY(r, transfer_command(in));
  r.transfer = transfer_none; // run as it is, its outcome is the caller's
  r.handle = r.open_stdin = r.stream = false;
  r.window = 0;
  r.input = tar;
  if (kind == transfer_get)
    r.max_output = 256ull << 20;
  return r;
}

expected<uint64_t> put_answer(const std::string& dir, uint64_t size,
                              const expected<exec_result>& r) {
  if (auto e = tar_error(true, dir, r))
    return *e;
  return size;
}

expected<std::string> get_answer(const std::string& path, expected<exec_result> r) {
  if (auto e = tar_error(false, path, r))
    return *e;
  if (r->truncated)
    return make_error(errc::invalid_argument, "get " + path + ": larger than 256 MiB");
  return std::move(r->out);
}

} // namespace dsec

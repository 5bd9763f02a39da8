// The command an exec_request asks for (actors/exec_command.hpp).
#include "actors/exec_command.hpp"

namespace dsec {

expected<command> make_command(const exec_request& req, const command_defaults& d) {
  command c;
  c.argv = req.argv.empty() ? d.argv : req.argv;
  if (c.argv.empty() || c.argv[0].empty())
    return make_error(errc::invalid_argument,
                      req.argv.empty() ? "no command given, and the sandbox's image has no "
                                         "Entrypoint or Cmd"
                                       : "no command given");
  c.env = merge_env(d.env, req.env);
  c.cwd = req.cwd.empty() ? d.cwd : req.cwd;
  // The image's User applies unless the request names a user (by number or
  // by name: start_exec looks the name up).
  bool given = req.uid >= 0 || !req.user.empty();
  if (!given && d.user_error)
    return *d.user_error;
  if (req.uid >= 0)
    c.uid = static_cast<uint32_t>(req.uid);
  else if (!given && d.user)
    c.uid = d.user->uid;
  if (req.gid >= 0)
    c.gid = static_cast<uint32_t>(req.gid);
  else if (!given && d.user)
    c.gid = d.user->gid;
  return c;
}

expected<void> apply_request_user(command& cmd, const exec_request& req, const user_files& files) {
  if (req.user.empty())
    return {};
  auto u = resolve_command_user(req.user, files);
  if (!u) // as a uid that does not work: status 126 on the command line
    return std::move(u).error_value().in_step("setuid");
  apply_command_user(cmd, std::move(*u), req.env);
  return {};
}

} // namespace dsec

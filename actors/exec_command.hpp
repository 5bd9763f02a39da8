// The command an exec_request asks for, with what it leaves out taken from
// the sandbox's base image (docs/images.md, "The image config"): shared by the
// container and microVM sandbox actors, so both apply one rule.
#pragma once

#include "actors/messages.hpp"
#include "runtime/container.hpp"
#include "runtime/image_config.hpp"

namespace dsec {

/// Its argv, else Entrypoint + Cmd; dsec's environment under the image's Env
/// under the request's; its cwd, else WorkingDir, else /; its uid and gid,
/// else the image's User, else root (a gid alone keeps the user's uid). A
/// user by name (req.user) is not looked up here: see apply_request_user.
expected<command> make_command(const exec_request& req, const command_defaults& d);

/// With req.user: looks the name (or number) up in `files` (the base image's
/// etc/passwd and etc/group, never the tree the agent writes) and makes `cmd`
/// run as that user (uid, gid, groups, HOME and USER unless req.env sets
/// them). Without req.user, `cmd` is left as it is. The error (step
/// "setuid") names what the image lacks.
expected<void> apply_request_user(command& cmd, const exec_request& req, const user_files& files);

} // namespace dsec

// dsec: the command line. Global options come before the verb; each verb lives
// in its own file and has its own --help.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "tools/dsec/cli.hpp"

namespace {

const char* usage = R"(usage: dsec [--state DIR] VERB [ARGS...]

dsec builds sandboxes from read-only EROFS layers (a base image, a working
directory, tool packages) joined by overlayfs under a private writable layer,
and runs commands in them, isolated by namespaces, a user namespace, seccomp,
Landlock and cgroups.

Verbs:
  layer build|ls|rm     build, list and remove layers in the local store
  run                   run one command in a fresh sandbox and destroy it

Global options:
  --state DIR           the state directory (layers, blobs); default $DSEC_STATE,
                        else /var/lib/dsec
  -h, --help            this text; 'dsec VERB --help' describes a verb
  --version             print the version

Examples:
  dsec layer build --kind base busybox@1 ./rootfs
  dsec run --base busybox@1 -- sh -c 'echo hello from $(hostname)'
)";

} // namespace

int main(int argc, char** argv) {
  using namespace dsec::cli;
  // `dsec run` hands descriptors 0, 1 and 2 to the command in the sandbox. If
  // one is closed, the next descriptor dsec opens takes its number (the
  // spawner's control socket, a layer lease) and would reach the sandbox as its
  // stdio: point closed ones at /dev/null first (open takes the lowest free
  // number, which is `fd` because the ones below it are open by then).
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
      continue;
    int null = ::open("/dev/null", O_RDWR);
    if (null != fd)
      return 125;
  }
  global_options g;
  g.state_dir = default_state_dir();
  args a{argc, argv, 1};
  while (a.at_option()) {
    if (a.help()) {
      std::fputs(usage, stdout);
      return 0;
    }
    if (a.flag("--version")) {
      std::printf("dsec %s\n", DSEC_VERSION);
      return 0;
    }
    std::string value;
    auto r = a.option("--state", value);
    if (!r)
      return usage_error("", r.error_value().message);
    if (*r) {
      if (value.empty())
        return usage_error("", "--state needs a directory");
      g.state_dir = value;
      continue;
    }
    std::fprintf(stderr, "dsec: unknown global option '%s'\nTry 'dsec --help'.\n",
                 std::string{a.peek()}.c_str());
    return 2;
  }
  if (a.empty()) {
    std::fputs(usage, stderr);
    return 2;
  }
  std::string verb{a.next()};
  if (verb == "layer")
    return layer_main(g, a);
  if (verb == "run")
    return run_main(g, a);
  if (verb == "help") {
    std::fputs(usage, stdout);
    return 0;
  }
  std::fprintf(stderr, "dsec: unknown verb '%s'\nTry 'dsec --help'.\n", verb.c_str());
  return 2;
}

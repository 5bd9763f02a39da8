// dsec: the command line. Global options come before the verb; each verb lives
// in its own file and has its own --help.
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tools/dsec/cli.hpp"

namespace {

const char* usage = R"(usage: dsec [--state DIR] VERB [ARGS...]
       dsec --connect HOST:PORT VERB [ARGS...]

dsec builds sandboxes from read-only EROFS layers (a base image, a working
directory, tool packages) joined by overlayfs under a private writable layer,
and runs commands in them, isolated by namespaces, a user namespace, seccomp,
Landlock and cgroups.

Verbs:
  layer build|ls|rm     build, list and remove layers in the local store
  layer import|pull     make a base layer of a container image (a layout, a
                        docker archive, a registry); layer inspect shows one
  run                   run one command in a fresh sandbox and destroy it
  top HOST:PORT...      a terminal view of dsecds' --metrics, redrawn every
                        second (runs dsec-top; docs/observability.md)

Verbs of a daemon (dsecd), with --connect HOST:PORT before the verb:
  ps                    list its sandboxes (--json)
  inspect               sandboxes as JSON
  run                   run a command in a fresh sandbox (--detach: leave it running)
  exec                  run a command in an existing sandbox
  cp                    copy files into or out of a sandbox
  rm                    destroy sandboxes
  logs, wait, kill      a sandbox's detached commands: their output (1 MiB
                        kept), their end, a signal to them
  attach ID             follow its detached command: output, signals, status
  stats ID..., top ID   what sandboxes use now (memory, CPU, tasks, disk, egress);
                        a sandbox's processes
  session open|close    open a session nobody owns, close one
  node stats            the daemon's counters and layer cache
  node cordon|uncordon|drain NODE
                        stop or resume new sandboxes on a node, or wait until it
                        is empty
  cluster status        the cluster's nodes (a coordinator)
  call, pool set|ls     the function backend and warm pools
  net ID                change an egress sandbox's network policy
  expose ID PORT        forward a port of the node to PORT inside a sandbox
  pause, resume         freeze a sandbox (its TTL stopped) and thaw it
  snapshot, fork        a sandbox's files as a diff layer; N sandboxes from them

Global options:
  --state DIR           the state directory (layers, blobs); default $DSEC_STATE,
                        else /var/lib/dsec
  --connect HOST:PORT   talk to the dsecd at HOST:PORT (runs dsec-client, found
                        beside dsec, else $DSEC_CLIENT, else in
                        )" DSEC_LIBEXECDIR R"()
  --tls DIR             with --connect: speak TLS with the CA, certificate and
                        key in DIR (ca.pem, cert.pem, key.pem), as a dsecd
                        started with --tls requires; default $DSEC_TLS
  -h, --help            this text; 'dsec VERB --help' describes a verb
  --version             print the version

Examples:
  dsec layer build --kind base busybox@1 ./rootfs
  dsec run --base busybox@1 -- sh -c 'echo hello from $(hostname)'
  dsec --connect 127.0.0.1:7070 run --detach --base busybox@1 -- sleep 600
  dsec --connect 127.0.0.1:7070 ps
)";

// The verbs of a daemon live in dsec-client (it needs CAF's shared libraries;
// this dsec is static): beside this binary, else $DSEC_CLIENT, else installed.
// Returns only if it cannot be run.
int hand_over(char** argv, bool run) {
  std::string beside;
  auto path = dsec::cli::find_companion("dsec-client", "DSEC_CLIENT", beside);
  const char* env = std::getenv("DSEC_CLIENT");
  int code = run ? 125 : 1; // `run` keeps its own convention for dsec's failures
  if (path.empty()) {
    std::fprintf(stderr,
                 "dsec: --connect needs dsec-client, which was not found "
                 "beside %s, $DSEC_CLIENT is not set, and not in " DSEC_LIBEXECDIR
                 " (set DSEC_CLIENT to its path)\n",
                 beside.empty() ? "dsec" : beside.c_str());
    return code;
  }
  ::execv(path.c_str(), argv);
  std::fprintf(stderr, "dsec: --connect: cannot run %s%s: %s\n", path.c_str(),
               env && path == env ? " (from $DSEC_CLIENT)" : "", std::strerror(errno));
  return code;
}

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
  if (auto rc = parse_global_options(a, g))
    return *rc;
  if (g.help) {
    if (g.connect) // the daemon's verbs: dsec-client describes them
      return hand_over(argv, false);
    std::fputs(usage, stdout);
    return 0;
  }
  if (g.version) {
    std::printf("dsec %s\n", DSEC_VERSION);
    return 0;
  }
  if (g.connect)
    return hand_over(argv, a.peek() == "run");
  if (!g.tls_dir.empty())
    return usage_error("", "--tls is for talking to a daemon: give --connect HOST:PORT too");
  if (a.empty()) {
    std::fputs(usage, stderr);
    return 2;
  }
  std::string verb{a.next()};
  if (verb == "layer")
    return layer_main(g, a);
  if (verb == "run")
    return run_main(g, a);
  if (verb == "top") {
    // dsec-top (it links cpp-httplib; this dsec is static).
    std::string beside;
    auto path = dsec::cli::find_companion("dsec-top", "DSEC_TOP", beside);
    if (path.empty()) {
      std::fprintf(stderr, "dsec: top needs dsec-top, which was not found beside dsec, "
                           "$DSEC_TOP is not set, and not in " DSEC_LIBEXECDIR "\n");
      return 1;
    }
    std::vector<std::string> words{path};
    while (!a.empty())
      words.emplace_back(a.next());
    std::vector<char*> av;
    for (auto& w : words)
      av.push_back(w.data());
    av.push_back(nullptr);
    ::execv(path.c_str(), av.data());
    std::fprintf(stderr, "dsec: top: cannot run %s: %s\n", path.c_str(), std::strerror(errno));
    return 1;
  }
  if (verb == "help") {
    std::fputs(usage, stdout);
    return 0;
  }
  for (const char* d : {"ps", "inspect", "exec", "cp", "rm", "session", "node", "cluster", "call", "pool",
                        "feedback", "net", "expose", "pause", "resume", "snapshot", "fork",
                        "logs", "wait", "kill", "stats", "attach"})
    if (verb == d) {
      std::fprintf(stderr,
                   "dsec: '%s' is a verb of a daemon: give --connect HOST:PORT before it "
                   "(dsec --connect HOST:PORT %s ...)\nTry 'dsec --help'.\n",
                   d, d);
      return 2;
    }
  std::fprintf(stderr, "dsec: unknown verb '%s'\nTry 'dsec --help'.\n", verb.c_str());
  return 2;
}

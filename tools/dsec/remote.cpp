// dsec-client: `dsec --connect HOST:PORT VERB ...`. The static dsec execs this
// program with its own argv when it sees --connect; it can be run directly too.
// This file: its main (the global options, as the static dsec reads them:
// global_options.hpp) and the list of verbs; each verb is in remote_VERB.cpp.
#include "tools/dsec/remote.hpp"

#include <fcntl.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "tools/dsec/global_options.hpp"

namespace dsec::cli::remote {

namespace {

const char* usage = R"(usage: dsec --connect HOST:PORT VERB [ARGS...]

Talks to the dsec daemon (dsecd) listening on HOST:PORT. Its sandboxes live in
the daemon, in sessions: `run` without --detach uses a session of its own, closed
when the command ends; detached sandboxes go to the daemon's "default" session
(or to one opened with `session open`) and live until `rm`, their TTL, or the
end of their session.

Verbs:
  ps [--session ID] [--filter F] [--json | --format F]
                                    list the sandboxes
  inspect ID...                     sandboxes as JSON: environment, limits, state,
                                    times
  run [OPTIONS] -- CMD [ARGS...]    run CMD in a fresh sandbox; --detach leaves it
                                    running and prints its id
  exec [OPTIONS] ID -- CMD [ARGS...]
                                    run CMD in sandbox ID
  cp SRC DST                        copy into or out of a sandbox (ID:/PATH)
  rm ID...                          destroy sandboxes
  logs ID [-f] [--tail N]           the output of its detached commands (run
                                    --detach, exec --detach), kept in a 1 MiB log
  wait ID                           wait for its detached CMD to end; print its code
  attach ID [--logs]                follow its detached CMD's output and exit with
                                    its status; our signals go on to it
  kill ID [-s SIGNAL]               signal its running detached commands
  stats ID... [--interval DUR]      what they use now: memory, CPU, tasks, disk,
                                    files, egress traffic
  top ID                            its processes (pid, user, state, memory, CPU)
  session open [OPTIONS]            open a session nobody owns; prints its id
  session resume ID                 reopen a session from its trajectory log
  session close ID                  close a session and destroy its sandboxes
  session watch ID                  print a session's Chronus events (JSON lines)
  feedback SANDBOX REQ [OPTIONS]    answer a Chronus feedback request
  node stats                        the daemon's counters and its layer cache
  node cordon|uncordon|drain NODE   stop or resume new sandboxes on NODE, or wait
                                    until it is empty (drain [--timeout DUR])
  cluster status [--json]           the cluster's nodes (a coordinator)
  call [OPTIONS] -- CMD [ARGS...]   the function backend: CMD in a fresh sandbox
                                    (from a warm pool), destroyed after
  pool set|ls                       warm pools of ready sandboxes
  net ID [--allow R] [--deny R]     change an egress sandbox's network policy
  expose ID PORT                    forward a port of its node to PORT inside
                                    sandbox ID; prints HOST:PORT
  pause ID... | resume ID...        freeze sandboxes (TTL stopped), thaw them
  snapshot ID --as NAME@VERSION     its writable layer as a diff layer
  fork ID [-n N]                    N new sandboxes with its files; prints their ids

Wherever a verb takes a sandbox ID, the sandbox's name (run --name) will do.

Global options:
  --connect HOST:PORT   the daemon (dsecd --listen); required
  --tls DIR             speak TLS with the CA, certificate and key in DIR
                        (ca.pem, cert.pem, key.pem; tools/tls-certs makes them),
                        as a dsecd started with --tls requires; default $DSEC_TLS
  --state DIR           accepted and ignored: the daemon has its own state
  -h, --help            this text; 'dsec --connect HOST:PORT VERB --help'
                        describes a verb
  --version             print the version

Layers are built on the daemon's machine, in its state directory:
'dsec --state DIR layer build ...' (no --connect).

Exit status: 0 on success; 1 when the daemon reported an error or cannot be
reached; 2 on a usage error. `run` and `exec` pass the command's status through
(see their --help).
)";

} // namespace

} // namespace dsec::cli::remote

int main(int argc, char** argv) {
  using namespace dsec::cli;
  // Descriptors 0-2 must be something, or the first sockets we open become them.
  for (int fd = 0; fd < 3; ++fd)
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF && ::open("/dev/null", O_RDWR) != fd)
      return 1;
  ::signal(SIGPIPE, SIG_IGN);
  args a{argc, argv, 1};
  global_options g; // --state is accepted and ignored: the daemon's state is its own
  if (auto rc = parse_global_options(a, g))
    return *rc;
  if (g.help) {
    std::fputs(remote::usage, stdout);
    return 0;
  }
  if (g.version) {
    std::printf("dsec %s\n", DSEC_VERSION);
    return 0;
  }
  if (!g.connect) {
    std::fprintf(stderr, "dsec: the daemon's verbs need --connect HOST:PORT before the verb\n"
                         "Try 'dsec --help'.\n");
    return 2;
  }
  if (a.empty()) {
    std::fputs(remote::usage, stderr);
    return 2;
  }
  remote::context ctx{*g.connect, dsec::tls_options{g.tls()}};
  std::string verb{a.next()};
  if (verb == "ps")
    return remote::ps_main(ctx, a);
  if (verb == "logs")
    return remote::logs_main(ctx, a);
  if (verb == "wait")
    return remote::wait_main(ctx, a);
  if (verb == "kill")
    return remote::kill_main(ctx, a);
  if (verb == "stats")
    return remote::stats_main(ctx, a);
  if (verb == "top")
    return remote::top_main(ctx, a);
  if (verb == "attach")
    return remote::attach_main(ctx, a);
  if (verb == "rm")
    return remote::rm_main(ctx, a);
  if (verb == "inspect")
    return remote::inspect_main(ctx, a);
  if (verb == "exec")
    return remote::exec_main(ctx, a);
  if (verb == "run")
    return remote::run_main(ctx, a);
  if (verb == "cp")
    return remote::cp_main(ctx, a);
  if (verb == "session")
    return remote::session_main(ctx, a);
  if (verb == "node")
    return remote::node_main(ctx, a);
  if (verb == "cluster")
    return remote::cluster_main(ctx, a);
  if (verb == "feedback")
    return remote::feedback_main(ctx, a);
  if (verb == "call")
    return remote::call_main(ctx, a);
  if (verb == "pool")
    return remote::pool_main(ctx, a);
  if (verb == "net")
    return remote::net_main(ctx, a);
  if (verb == "expose")
    return remote::expose_main(ctx, a);
  if (verb == "pause" || verb == "resume")
    return remote::pause_main(ctx, a, verb == "pause");
  if (verb == "snapshot")
    return remote::snapshot_main(ctx, a);
  if (verb == "fork")
    return remote::fork_main(ctx, a);
  if (verb == "help") {
    std::fputs(remote::usage, stdout);
    return 0;
  }
  if (verb == "layer") {
    std::fprintf(stderr, "dsec: layer works on a local store, not through --connect: run "
                         "'dsec --state DIR layer ...' on the daemon's machine, with its "
                         "state directory\n");
    return 2;
  }
  std::fprintf(stderr, "dsec: unknown verb '%s' for --connect\nTry 'dsec --connect %s "
                       "--help'.\n", verb.c_str(), ctx.where().c_str());
  return 2;
}


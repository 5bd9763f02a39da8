// dsec run: one command in a fresh sandbox, then the sandbox is destroyed.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fcntl.h>
#include <poll.h>

#include "runtime/builder.hpp"
#include "runtime/cgroup.hpp"
#include "runtime/container.hpp"
#include "runtime/defaults.hpp"
#include "runtime/image_config.hpp"
#include "runtime/io.hpp"
#include "runtime/layer.hpp"
#include "runtime/mount.hpp"
#include "runtime/pty.hpp"
#include "runtime/spawner.hpp"
#include "runtime/store.hpp"
#include "runtime/units.hpp"
#include "tools/dsec/cli.hpp"
#include "tools/dsec/run_options.hpp"

namespace dsec::cli {

namespace {

const char* run_usage = R"(usage: dsec run [OPTIONS] [-- CMD [ARGS...]]

Creates a sandbox from layers of the local store, runs CMD in it with this
terminal's stdin, stdout and stderr, passes its exit status through, and
destroys the sandbox with everything in it.

The sandbox's root is an overlay of, from top to bottom: its private writable
layer (a tmpfs, gone with the sandbox), dsec's system layer (/dev, /proc,
/tmp mount points), the tool layers (the last --tool on top), the workdir
layer, the base layer.

Layers:
  --base NAME@VERSION      the base image (required, unless --snapshot)
  --workdir NAME@VERSION   a working-directory layer
  --tool NAME@VERSION      a tool layer; repeat for several
  --snapshot NAME@VERSION  start from a diff layer (`dsec snapshot`): the
                           environment it records (its base, workdir, tools,
                           and the diffs below it), the diff on top; --tool
                           adds tools above it; no --base or --workdir

Environment of the command:
  -e, --env KEY[=VALUE]    add or replace a variable (repeatable); a bare
                           KEY takes our own value (none: left out); the defaults
                           are PATH, HOME=/root, LANG=C.UTF-8 and the host's TERM
  --env-file FILE          variables from FILE, a KEY[=VALUE] a line (# and
                           blank lines skipped)
  -w, --cwd DIR            working directory inside the sandbox (default /)
  -u, --user USER[:GROUP]  run as this user of the sandbox (default 0, the
                           sandbox's root, which has no privileges on the host):
                           names or numbers (UID[:GID]), looked up in the base's
                           /etc/passwd and /etc/group, which give the uid, gid,
                           supplementary groups, HOME and USER (a number with
                           no entry is that uid alone, its gid the same)
  --hostname NAME          the sandbox's hostname (default: its id)
  -t, --tty                CMD on a terminal of the sandbox (a pty: its
                           controlling terminal, stdin, stdout and stderr, one
                           output stream), sized as ours (24x80 when we have
                           none) and resized with our window; our stdin goes to
                           it as it is, a terminal of ours in raw mode while CMD
                           runs (restored on every way out: ^C, ^Z are keys for
                           CMD's terminal); the end of our stdin types ^D there.
                           TERM=xterm-256color unless -e sets it. (-it is the
                           same: a local run always passes its stdin)

A base made of an OCI image (dsec layer import | pull) gives the defaults of
its config: its Env under the --env given, its WorkingDir unless --cwd, its
User unless --user (a number, UID:GID, or a name from the image's
/etc/passwd), and its Entrypoint followed by its Cmd when no CMD is given (a
CMD given replaces both).

Isolation and limits (every sandbox has a memory and a pids limit and a
bounded writable layer; the defaults are what a dsecd with its default
--slots gives each sandbox on this machine, see below):
  -v, --volume HOST:SANDBOX[:OPTS]
                           bind-mount the host's directory or file HOST at
                           SANDBOX (made if missing; not "/", nor in /proc,
                           /dev, /sys); writable unless :ro; repeatable (16 at
                           most, no SANDBOX in another's). Its files keep their
                           host owners (an idmapped mount: host uid 1000 is
                           uid 1000 inside, root's files the sandbox root's);
                           nosuid and nodev; not in the writable layer or a
                           snapshot. OPTS, comma-separated: ro or rw; rbind
                           (the mounts beneath HOST are carried too, each with
                           the same attributes; without it they are not);
                           noidmap (a filesystem that cannot be idmapped, such
                           as ramfs: owners the sandbox does not map show as
                           nobody, and its root has only its host uid's rights)
  --net                    a private network namespace with a working loopback
                           (127.0.0.1); without it the sandbox has no network at
                           all, not even loopback. No route leads outside.
  --network none|loopback  the same choice by name (loopback = --net); egress
                           needs a daemon (dsec --connect HOST:PORT run)
  --memory SIZE|none       memory limit (e.g. 512m, 2g); OOM kills inside. It
                           also bounds the writable layer: a tmpfs, whose pages
                           are charged to the sandbox
  --pids N|none            most processes and threads at once
  --cpus N                 CPU bandwidth, in CPUs (e.g. 0.5, 2; default: none)
  --disk SIZE              size of the writable layer; writes past it fail with
                           ENOSPC. It also holds at most one file or directory
                           per 4 KiB of SIZE (at least 1024)
  --timeout DUR            wall-clock limit (e.g. 30s, 500ms, 2m, 1h30m): then the whole
                           sandbox is killed and dsec exits with 124

Other:
  --timings                print each creation step's duration on stderr
  -h, --help               this text

Exit status: CMD's own status; 128+N if a signal N killed it (137 also when the
sandbox ran out of memory and the kernel killed all of it); 124 on timeout;
126 if CMD cannot be executed (or --cwd, --user do not work), 127 if it is
not found; 125 if dsec itself failed (the message says which step and which
path).
)";

volatile sig_atomic_t pending_signal = 0;
volatile sig_atomic_t window_changed = 0;

void on_signal(int sig) {
  pending_signal = sig;
}

void on_winch(int) {
  window_changed = 1;
}

// -t: one step of the terminal's traffic, waiting at most `ms`: our stdin (as
// it is) into its master, its output to our stdout. False once the master
// reads its end (EIO: every holder of the slave closed it).
bool relay_terminal(int master, bool& stdin_open, int ms) {
  pollfd pf[2] = {{master, POLLIN, 0}, {stdin_open ? 0 : -1, POLLIN, 0}};
  if (::poll(pf, 2, ms) < 0)
    return true; // EINTR: a signal to forward
  char buf[16384];
  if (pf[0].revents) {
    for (;;) {
      auto n = ::read(master, buf, sizeof buf);
      if (n > 0) {
        // Our stdout gone: its output is dropped.
        (void) write_all(1, std::string_view(buf, static_cast<size_t>(n)), "stdout");
        continue;
      }
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        break;
      return false;
    }
  }
  if (stdin_open && pf[1].revents) {
    auto n = ::read(0, buf, sizeof buf);
    if (n > 0) {
      // The master is non-blocking: wait for room rather than drop keys.
      size_t off = 0;
      while (off < static_cast<size_t>(n)) {
        auto w = ::write(master, buf + off, static_cast<size_t>(n) - off);
        if (w > 0) {
          off += static_cast<size_t>(w);
        } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
          pollfd out{master, POLLOUT, 0};
          (void) ::poll(&out, 1, 100);
        } else {
          break; // it ended
        }
      }
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      stdin_open = false; // our end of file: its terminal's is ^D
      char eof = pty::eof_char(master);
      (void) !::write(master, &eof, 1);
    }
  }
  return true;
}

struct run_args {
  sandbox_options sb;
  command_spec cs;
  build_extras extras;
  command cmd;
  bool timings = false;
  bool tty = false;
};

// Parses the options; returns an exit status on error.
std::optional<int> parse(args& a, run_args& r) {
  r.sb.mounts_read_only = false; // docker's -v: the user is root here already
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(run_usage, stdout);
      auto m = machine_resources::probe();
      auto d = derive_defaults(m, default_slots, default_oversubscribe);
      std::printf("\nDefaults on this machine (%s of memory, pid_max %llu): --memory %s,\n"
                  "--pids %llu, --disk %s (runtime/defaults.hpp has the rule).\n",
                  format_size(m.memory_bytes).c_str(),
                  static_cast<unsigned long long>(m.pid_max),
                  format_size(*d.memory_bytes).c_str(),
                  static_cast<unsigned long long>(*d.pids), format_size(d.disk_bytes).c_str());
      return 0;
    }
    if (a.peek() == "--") {
      a.rest(r.cmd.argv);
      break;
    }
    auto p = parse_sandbox_option(a, "run", r.sb);
    if (p == parsed::no)
      p = parse_command_option(a, "run", r.cs);
    if (p == parsed::bad)
      return 2;
    if (p == parsed::yes)
      continue;
    std::string v;
    auto got = a.option("--hostname", v);
    if (!got)
      return usage_error("run", got.error_value().message);
    if (*got) {
      if (v.empty() || v.size() > 63)
        return usage_error("run", "--hostname: expected 1 to 63 characters");
      r.extras.hostname = v;
      continue;
    }
    if (a.flag("--timings")) {
      r.timings = true;
      continue;
    }
    if (a.flag("-t") || a.flag("--tty") || a.flag("-it") || a.flag("-ti")) {
      r.tty = true;
      continue;
    }
    if (a.at_option()) {
      // The options of a daemon's run: say where they belong, not "unknown".
      static constexpr std::string_view daemon_only[] = {
        "--detach", "--session", "--ttl", "--key", "--tag", "--chronus", "--trusted",
        "--pristine", "--idempotent", "-i", "--stdin", "--backend"};
      auto opt = a.peek().substr(0, a.peek().find('='));
      for (auto d : daemon_only)
        if (opt == d)
          return usage_error("run", std::string{opt} + " is an option of a daemon's run: give "
                                      "--connect HOST:PORT before the verb (dsec --connect "
                                      "HOST:PORT run " + std::string{opt} + " ...)");
      return usage_error("run", "unknown option '" + std::string{a.peek()} + "'");
    }
    return usage_error("run", "unexpected argument '" + std::string{a.peek()}
                                + "' (put the command after --)");
  }
  if (auto rc = check_sandbox_options("run", r.sb))
    return rc;
  if (r.sb.env.egress)
    return usage_error("run", "--network egress needs a node daemon with an uplink (dsecd "
                              "--uplink IFACE): use dsec --connect HOST:PORT run");
  if (!r.sb.env.expose.empty())
    return usage_error("run", "--expose needs a node daemon, which forwards the port: use"
                              " dsec --connect HOST:PORT run --net --expose PORT");
  r.cmd.cwd = r.cs.cwd;
  r.cmd.env = merge_env(command::default_env(), r.cs.env);
  if (r.tty) {
    bool term = false;
    for (const auto& kv : r.cs.env)
      term = term || kv.starts_with("TERM=") || kv == "TERM";
    if (!term) {
      std::erase_if(r.cmd.env, [](const std::string& e) { return e.starts_with("TERM="); });
      r.cmd.env.emplace_back("TERM=xterm-256color");
    }
  }
  return std::nullopt;
}

// The image's /etc/passwd: that of the first of its lowers (topmost first)
// that has one, read from its mounted image.
std::optional<std::string> image_passwd(const std::vector<std::string>& blobs) {
  for (const auto& b : blobs) {
    auto m = layer_mount::open(b, -1);
    if (!m)
      return std::nullopt;
    if (auto text = read_image_passwd(m->dir_fd()))
      return text;
  }
  return std::nullopt;
}

// Env, WorkingDir, User, Entrypoint and Cmd of an OCI image's config
// (layer_info::config) as the command's defaults (runtime/image_config.hpp);
// options given win.
std::optional<int> apply_image_config(const layer_info& base,
                                      const std::vector<std::string>& blobs, run_args& r) {
  if (base.config.empty())
    return std::nullopt;
  auto d = command_defaults::of(base.config, [&] { return image_passwd(blobs); });
  if (!d) {
    std::fprintf(stderr, "dsec: run: %s\n", d.error_value().message.c_str());
    return 125;
  }
  if (r.cmd.argv.empty())
    r.cmd.argv = d->argv;
  r.cmd.env = merge_env(d->env, r.cs.env);
  if (!r.cs.cwd_given)
    r.cmd.cwd = d->cwd;
  if (!r.cs.user_given && d->user_error) {
    std::fprintf(stderr, "dsec: run: %s\n", d->user_error->message.c_str());
    return 125;
  }
  if (!r.cs.user_given && d->user) {
    r.cmd.uid = d->user->uid;
    r.cmd.gid = d->user->gid;
  }
  return std::nullopt;
}

// --user USER[:GROUP] (names or numbers): looked up in the base's etc/passwd and
// etc/group (each from the first of its lowers, topmost first, that has it),
// as a daemon's sandbox does (actors/sandbox.cpp): uid, gid, supplementary
// groups, and HOME and USER unless --env sets them.
std::optional<int> apply_user_name(const std::vector<std::string>& blobs, run_args& r) {
  user_files files;
  for (const auto& b : blobs) {
    auto m = layer_mount::open(b, -1);
    if (!m)
      break;
    files.add_lower(m->dir_fd());
  }
  auto u = resolve_command_user(r.cs.user, files);
  if (!u) {
    std::fprintf(stderr, "dsec: run: %s\n", u.error_value().message.c_str());
    return 126;
  }
  apply_command_user(r.cmd, std::move(*u), r.cs.env);
  return std::nullopt;
}

void print_timings(const container& c, double total_ms) {
  std::fprintf(stderr, "dsec: sandbox %s created in %.3f ms:\n", c.id().c_str(), total_ms);
  bool child = false;
  for (const auto& t : c.timings()) {
    if (child)
      std::fprintf(stderr, "  %-20s %8.1f us   (in the sandbox)\n", t.name, t.ns / 1e3);
    else
      std::fprintf(stderr, "  %-20s %8.1f us\n", t.name, t.ns / 1e3);
    if (std::strcmp(t.name, "wait_ready") == 0)
      child = true;
  }
}

} // namespace

int run_main(const global_options& g, args& a) {
  run_args r;
  if (auto rc = parse(a, r))
    return *rc;
  constexpr int dsec_failed = 125;
  // A sandbox maps a range of host uids into its user namespace and mounts the
  // store's images: only root may. Say so, instead of the uid_map error.
  if (::geteuid() != 0)
    return fail(make_error(errc::unauthorized,
                           "a local run needs root (it maps a range of host uids into the "
                           "sandbox and mounts the store's images); run it as root, or ask a "
                           "daemon: dsec --connect HOST:PORT run ..."),
                dsec_failed);
  auto t_start = std::chrono::steady_clock::now();

  // The zygote sets itself up (~1.5 ms) while we open the store and mount.
  auto& env = r.sb.env;
  spawner::options sp_opts;
  sp_opts.netns_prewarm = env.net ? 0 : 1;
  auto sp = spawner::start(sp_opts);
  if (!sp)
    return fail(sp.error_value(), dsec_failed);

  // The default limits (runtime/defaults.hpp) for what the options leave out.
  {
    auto d = derive_defaults(machine_resources::probe(), default_slots, default_oversubscribe);
    if (r.sb.no_memory)
      d.memory_bytes.reset();
    if (r.sb.no_pids)
      d.pids.reset();
    d.apply(env);
  }

  auto st = store::open(g.state_dir);
  if (!st)
    return fail(st.error_value(), dsec_failed);
  // Leases keep `dsec layer rm` away from the layers while the sandbox runs.
  auto leases = lease_layers(*st, env, "--"); // topmost first
  if (!leases)
    return fail(leases.error_value(), dsec_failed);
  // The base's image config (an OCI image's) gives the command's defaults.
  if (auto rc = apply_image_config(leases->back().info(), leases->back().blob_paths(), r))
    return *rc;
  if (!r.cs.user.empty()) { // --user: the base image's /etc/passwd and /etc/group
    if (auto rc = apply_user_name(leases->back().blob_paths(), r))
      return *rc;
  }
  if (r.cmd.argv.empty())
    return usage_error("run", "no command given (dsec run [OPTIONS] -- CMD [ARGS...]), and the "
                              "base names none (no Entrypoint or Cmd)");
  auto sys_layer = st->system_layer();
  if (!sys_layer)
    return fail(sys_layer.error_value(), dsec_failed);

  std::vector<layer_mount> mounts;
  mounts.reserve(leases->size() + 1);
  auto mount_one = [&](const std::string& path) -> bool {
    auto m = layer_mount::open(path, (*sp)->userns_fd());
    if (!m) {
      fail(std::move(m).error_value().in_step("mount_layers"), dsec_failed);
      return false;
    }
    mounts.push_back(std::move(*m));
    return true;
  };
  if (!mount_one(*sys_layer))
    return dsec_failed;
  for (const auto& l : *leases)
    for (const auto& path : l.blob_paths()) // an OCI image has several
      if (!mount_one(path))
        return dsec_failed;
  std::vector<int> lowers;
  for (const auto& m : mounts)
    lowers.push_back(m.dir_fd());

  std::optional<cgroup_root> cgroups;
  auto cgroup_of = [&cgroups]() -> expected<const cgroup_root*> {
    if (!cgroups) {
      auto root = cgroup_root::detect();
      if (!root)
        return std::move(root).error_value();
      (void) root->collect_garbage(); // leftovers of a dsec that was killed
      cgroups.emplace(std::move(*root));
    }
    return &*cgroups;
  };

  // Forward these to the command; it has no terminal of its own.
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
    ::sigaction(sig, &sa, nullptr);

  // Any host path: whoever runs this is root on this host already.
  std::optional<host_mount_policy> host_paths;
  if (!env.mounts.empty()) {
    auto p = host_mount_policy::anything();
    if (!p)
      return fail(p.error_value(), dsec_failed);
    host_paths.emplace(std::move(*p));
    r.extras.host_mounts = &*host_paths;
  }
  auto t_create = std::chrono::steady_clock::now();
  auto c = build_sandbox(**sp, env, lowers, std::move(r.extras), cgroup_of, build_until::ready);
  if (!c)
    return fail(c.error_value(), dsec_failed);
  auto t_ready = std::chrono::steady_clock::now();
  if (r.timings)
    print_timings(**c, std::chrono::duration<double, std::milli>(t_ready - t_create).count());

  if (r.tty) {
    r.cmd.pty = pty_size{};
    for (int fd : {0, 1, 2})
      if (auto w = pty::size_of(fd)) {
        r.cmd.pty = pty_size{w->rows, w->cols};
        break;
      }
    struct sigaction wa{};
    wa.sa_handler = on_winch;
    sigemptyset(&wa.sa_mask);
    ::sigaction(SIGWINCH, &wa, nullptr);
    if (::isatty(0))
      (void) pty::make_raw(0); // restored by atexit, and below
  }
  auto id = (*c)->exec(r.cmd, stdio{0, 1, 2});
  unique_fd master = id ? (*c)->take_pty(*id) : unique_fd{};
  bool stdin_open = true, master_open = r.tty;
  if (!id)
    pty::restore();
  if (!id) {
    auto& e = id.error_value();
    fail(e);
    if (e.step == "execve")
      return e.sys_errno == ENOENT ? 127 : 126;
    return e.step == "chdir" || e.step == "setuid" ? 126 : dsec_failed;
  }
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (r.cs.timeout)
    deadline = t_start + *r.cs.timeout;
  for (;;) {
    // Wake up now and then to forward signals.
    auto slice = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    auto until = deadline && *deadline < slice ? *deadline : slice;
    if (master_open) {
      // The terminal's traffic, and the command's end polled in between.
      if (window_changed) {
        window_changed = 0;
        for (int fd : {0, 1, 2})
          if (auto w = pty::size_of(fd)) {
            (void) pty::resize(master.get(), *w);
            break;
          }
      }
      master_open = relay_terminal(master.get(), stdin_open, 50);
      until = std::chrono::steady_clock::now();
    }
    auto res = (*c)->wait(*id, until);
    if (res) {
      if (master) { // what it printed last (a slave held by a background
        // process does not keep us: only what is there now)
        bool no_stdin = false;
        while (master_open && relay_terminal(master.get(), no_stdin, 0)) {
          pollfd pf{master.get(), POLLIN, 0};
          if (::poll(&pf, 1, 0) <= 0)
            break;
        }
        pty::restore();
      }
      bool oom = (*c)->oom_killed();
      auto status = *res;
      if (status.signal != 0)
        std::fprintf(stderr, "dsec: the command was %s%s\n", status.to_string().c_str(),
                     oom ? " (out of memory: the --memory limit was reached)" : "");
      (void) (*c)->destroy();
      return status.shell_code();
    }
    if (res.error_value().code != errc::timeout) {
      bool oom = (*c)->oom_killed();
      fail(res.error_value());
      (void) (*c)->destroy();
      // Out of memory, the whole sandbox with it: the command was SIGKILLed.
      return oom ? 128 + SIGKILL : dsec_failed;
    }
    if (deadline && std::chrono::steady_clock::now() >= *deadline) {
      (void) (*c)->destroy();
      std::fprintf(stderr, "dsec: timed out after %s; the sandbox was killed\n",
                   format_duration(*r.cs.timeout).c_str());
      return 124;
    }
    if (int sig = pending_signal) {
      pending_signal = 0;
      (void) (*c)->signal(*id, sig);
    }
  }
}

} // namespace dsec::cli

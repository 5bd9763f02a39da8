/* probe: a small static binary that runs inside dsec sandboxes and answers
 * what a test asks (the crun way). Each subcommand does one thing and prints
 * its outcome on stdout: the data asked for, "ok", or the errno name of the
 * failure (e.g. "EPERM"). Whether an outcome is right is the test's business:
 * attempts at forbidden things exit 0 whatever happened.
 *
 * Exit status: 0 when the subcommand ran (attempts included), 1 when a read
 * such as cat or ls failed, 2 on a usage error; `exit N` and `kill-self SIG`
 * end as asked.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/io_uring.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
#include <linux/reboot.h>
#include <linux/userfaultfd.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/swap.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/timex.h>
#include <sys/un.h>
#include <time.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

/* ---- output helpers ----------------------------------------------------- */

static const char *err_name(int err) {
  const char *n = strerrorname_np(err);
  return n ? n : "E?";
}

/* Prints "ok" for rc >= 0, else the errno name. Always exits 0: an attempt. */
static int outcome(long rc) {
  if (rc < 0)
    printf("%s\n", err_name(errno));
  else
    printf("ok\n");
  return 0;
}

/* A failed read: its errno name, exit 1. */
static int failed(void) {
  printf("%s\n", err_name(errno));
  return 1;
}

static int usage(void) {
  fprintf(stderr, "usage: probe SUBCOMMAND [ARGS] (see test/probe/probe.c)\n");
  return 2;
}

static int parse_signal(const char *s) {
  static const struct { const char *name; int sig; } sigs[] = {
    {"HUP", SIGHUP}, {"INT", SIGINT}, {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
    {"SEGV", SIGSEGV}, {"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"STOP", SIGSTOP},
    {"ABRT", SIGABRT}, {"CONT", SIGCONT},
  };
  if (strncmp(s, "SIG", 3) == 0)
    s += 3;
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; ++i)
    if (strcmp(s, sigs[i].name) == 0)
      return sigs[i].sig;
  return atoi(s);
}

/* ---- files -------------------------------------------------------------- */

static int cmd_cat(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return failed();
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0)
    fwrite(buf, 1, (size_t)n, stdout);
  int err = errno;
  close(fd);
  errno = err;
  return n < 0 ? failed() : 0;
}

static int cmd_write(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return outcome(-1);
  size_t len = strlen(text);
  ssize_t n = write(fd, text, len);
  int err = errno;
  close(fd);
  errno = err;
  if (n >= 0 && (size_t)n != len)
    errno = EIO, n = -1;
  return outcome(n);
}

/* Writes `mb` MiB of zeros to `path`: "ok" or the errno name. */
static int cmd_fill(const char *path, const char *mb_s) {
  static char block[1 << 20];
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return outcome(-1);
  long rc = 0;
  for (long i = 0; i < atol(mb_s) && rc >= 0; ++i)
    for (size_t off = 0; off < sizeof block && rc >= 0; off += (size_t)rc)
      rc = write(fd, block + off, sizeof block - off);
  int err = errno;
  close(fd);
  errno = err;
  return outcome(rc);
}

/* Makes up to `n_s` empty files dir/0, dir/1, ...; prints how many it made,
 * then "ok" or the errno name of the first failure. */
static int cmd_touch_many(const char *dir, const char *n_s) {
  char name[4096];
  long n = atol(n_s), made = 0;
  int rc = 0;
  for (; made < n; ++made) {
    snprintf(name, sizeof name, "%s/%ld", dir, made);
    int fd = open(name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      rc = -1;
      break;
    }
    close(fd);
  }
  printf("%ld\n", made);
  return outcome(rc);
}

/* Swaps `path` between a regular file and a fifo for ever, each put in place
 * by rename(2) (so the name always exists): what a sandbox does to make a
 * host process that stats the name as a file then opens it block in
 * fifo_open. Prints "swapping" once it started; never returns. */
static int cmd_swap_fifo(const char *path) {
  char fifo[4096], file[4096];
  snprintf(fifo, sizeof fifo, "%s.fifo-tmp", path);
  snprintf(file, sizeof file, "%s.file-tmp", path);
  printf("swapping\n");
  for (;;) {
    if (mkfifo(fifo, 0644) == 0)
      (void)rename(fifo, path);
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      (void)!write(fd, "data\n", 5);
      close(fd);
      (void)rename(file, path);
    }
  }
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entries of a directory, sorted (without . and ..). */
static char **list_dir(const char *path, size_t *count) {
  DIR *d = opendir(path);
  if (!d)
    return NULL;
  size_t n = 0, cap = 16;
  char **names = malloc(cap * sizeof *names);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    if (n == cap)
      names = realloc(names, (cap *= 2) * sizeof *names);
    names[n++] = strdup(e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, cmp_str);
  *count = n;
  return names;
}

static int cmd_ls(const char *path) {
  size_t n;
  char **names = list_dir(path, &n);
  if (!names)
    return failed();
  for (size_t i = 0; i < n; ++i)
    printf("%s\n", names[i]);
  return 0;
}

/* FNV-1a of a file's bytes: enough to tell contents apart in a listing. */
static uint64_t hash_file(const char *path) {
  uint64_t h = 1469598103934665603ULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  unsigned char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0)
    for (ssize_t i = 0; i < n; ++i)
      h = (h ^ buf[i]) * 1099511628211ULL;
  close(fd);
  return h;
}

/* Every path under `path`, one line each: "PATH TYPE MODE SIZE HASH|TARGET". */
static void tree(const char *path) {
  size_t n;
  char **names = list_dir(path, &n);
  if (!names)
    return;
  for (size_t i = 0; i < n; ++i) {
    char full[4096];
    snprintf(full, sizeof full, "%s/%s", strcmp(path, "/") == 0 ? "" : path, names[i]);
    struct stat st;
    if (lstat(full, &st) < 0) {
      printf("%s ? %s\n", full, err_name(errno));
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      printf("%s d %o\n", full, st.st_mode & 07777);
      tree(full);
    } else if (S_ISLNK(st.st_mode)) {
      char target[4096];
      ssize_t len = readlink(full, target, sizeof target - 1);
      target[len < 0 ? 0 : len] = '\0';
      printf("%s l %s\n", full, target);
    } else if (S_ISREG(st.st_mode)) {
      printf("%s f %o %lld %016llx\n", full, st.st_mode & 07777, (long long)st.st_size,
             (unsigned long long)hash_file(full));
    } else {
      printf("%s o %o\n", full, st.st_mode & 07777);
    }
  }
}

/* ---- snapshots (issue 16) ------------------------------------------------- */

/* Every path under `path`, one line each, with what a snapshot must keep:
 * "PATH TYPE MODE UID GID NLINK LINKGROUP SIZE HASH|TARGET XATTRS", where
 * LINKGROUP numbers the inodes in the order first met (hard links share it)
 * and XATTRS lists the user.* xattrs as name=value. Skips /proc, /dev, /sys
 * and /.dsec (the system layer's, not the sandbox's). */
static unsigned long snap_inos[65536];
static size_t snap_n;

static size_t link_group(unsigned long ino) {
  for (size_t i = 0; i < snap_n; ++i)
    if (snap_inos[i] == ino)
      return i;
  if (snap_n < sizeof snap_inos / sizeof snap_inos[0])
    snap_inos[snap_n++] = ino;
  return snap_n - 1;
}

static void print_xattrs(const char *full) {
  char names[8192];
  ssize_t n = llistxattr(full, names, sizeof names);
  for (ssize_t i = 0; i < n; i += (ssize_t)strlen(names + i) + 1) {
    if (strncmp(names + i, "user.", 5) != 0)
      continue;
    char v[1024];
    ssize_t len = lgetxattr(full, names + i, v, sizeof v - 1);
    v[len < 0 ? 0 : len] = '\0';
    printf(" %s=%s", names + i, v);
  }
}

static void snaptree(const char *path) {
  size_t n;
  char **names = list_dir(path, &n);
  if (!names)
    return;
  for (size_t i = 0; i < n; ++i) {
    char full[4096];
    snprintf(full, sizeof full, "%s/%s", strcmp(path, "/") == 0 ? "" : path, names[i]);
    if (!strcmp(full, "/proc") || !strcmp(full, "/dev") || !strcmp(full, "/sys") ||
        !strcmp(full, "/.dsec"))
      continue;
    struct stat st;
    if (lstat(full, &st) < 0) {
      printf("%s ? %s\n", full, err_name(errno));
      continue;
    }
    char t = S_ISDIR(st.st_mode) ? 'd' : S_ISLNK(st.st_mode) ? 'l' : S_ISREG(st.st_mode) ? 'f'
             : S_ISFIFO(st.st_mode) ? 'p' : S_ISSOCK(st.st_mode) ? 's' : 'o';
    printf("%s %c %o %u %u", full, t, st.st_mode & 07777, st.st_uid, st.st_gid);
    if (t == 'f')
      printf(" %lu %zu %lld %016llx", (unsigned long)st.st_nlink, link_group(st.st_ino),
             (long long)st.st_size, (unsigned long long)hash_file(full));
    if (t == 'l') {
      char target[4096];
      ssize_t len = readlink(full, target, sizeof target - 1);
      target[len < 0 ? 0 : len] = '\0';
      printf(" %s", target);
    }
    print_xattrs(full);
    printf("\n");
    if (t == 'd')
      snaptree(full);
  }
}

/* Binds a unix socket at `path` and exits: the socket file stays. */
static int cmd_bind_unix(const char *path) {
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  strncpy(a.sun_path, path, sizeof a.sun_path - 1);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  return outcome(s < 0 ? -1 : bind(s, (struct sockaddr *)&a, sizeof a));
}

/* ---- identity and /proc ------------------------------------------------- */

static int cmd_hostname(void) {
  struct utsname u;
  if (uname(&u) < 0)
    return failed();
  printf("%s\n", u.nodename);
  return 0;
}

/* Every process visible in /proc: "PID COMM". */
static int cmd_pids(void) {
  size_t n;
  char **names = list_dir("/proc", &n);
  if (!names)
    return failed();
  for (size_t i = 0; i < n; ++i) {
    if (names[i][0] < '0' || names[i][0] > '9')
      continue;
    char path[64], comm[64] = "?";
    snprintf(path, sizeof path, "/proc/%s/comm", names[i]);
    FILE *f = fopen(path, "re");
    if (f) {
      if (fgets(comm, sizeof comm, f))
        comm[strcspn(comm, "\n")] = '\0';
      fclose(f);
    }
    printf("%s %s\n", names[i], comm);
  }
  return 0;
}

/* The value of one "Key:" line of /proc/self/status, e.g. NoNewPrivs. */
static int print_status(const char *key) {
  FILE *f = fopen("/proc/self/status", "re");
  if (!f)
    return failed();
  char line[512];
  size_t klen = strlen(key);
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
      char *v = line + klen + 1;
      v += strspn(v, " \t");
      fputs(v, stdout);
      fclose(f);
      return 0;
    }
  }
  fclose(f);
  errno = ENOENT;
  return failed();
}

static int cmd_caps(void) {
  static const char *keys[] = {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"};
  for (size_t i = 0; i < 5; ++i) {
    printf("%s=", keys[i]);
    fflush(stdout);
    if (print_status(keys[i]) != 0)
      return 1;
  }
  return 0;
}

static int cmd_uid(void) {
  uid_t ru, eu, su;
  gid_t rg, eg, sg;
  getresuid(&ru, &eu, &su);
  getresgid(&rg, &eg, &sg);
  printf("uid=%u euid=%u gid=%u egid=%u\n", ru, eu, rg, eg);
  return 0;
}

static int cmd_cwd(void) {
  char buf[4096];
  if (!getcwd(buf, sizeof buf))
    return failed();
  printf("%s\n", buf);
  return 0;
}

static int cmd_env(const char *name) {
  const char *v = getenv(name);
  printf("%s\n", v ? v : "(unset)");
  return 0;
}

/* ---- forbidden things ----------------------------------------------------- */

static int ns_flag(const char *kind) {
  static const struct { const char *name; int flag; } kinds[] = {
    {"mnt", CLONE_NEWNS}, {"user", CLONE_NEWUSER}, {"net", CLONE_NEWNET},
    {"pid", CLONE_NEWPID}, {"uts", CLONE_NEWUTS}, {"ipc", CLONE_NEWIPC},
    {"cgroup", CLONE_NEWCGROUP},
  };
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; ++i)
    if (strcmp(kind, kinds[i].name) == 0)
      return kinds[i].flag;
  return 0;
}

/* clone(2) with a namespace flag; a child that gets made exits at once. */
static int cmd_clone_ns(const char *kind) {
  int flag = ns_flag(kind);
  if (!flag)
    return usage();
  long pid = syscall(SYS_clone, (unsigned long)(flag | SIGCHLD), 0, 0, 0, 0);
  if (pid == 0)
    _exit(0);
  if (pid > 0)
    waitpid((pid_t)pid, NULL, 0);
  return outcome(pid);
}

static int cmd_clone3(void) {
  struct clone_args_min { uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack,
                          stack_size, tls; } args;
  memset(&args, 0, sizeof args);
  args.exit_signal = SIGCHLD;
  long pid = syscall(SYS_clone3, &args, sizeof args);
  if (pid == 0)
    _exit(0);
  if (pid > 0)
    waitpid((pid_t)pid, NULL, 0);
  return outcome(pid);
}

static int cmd_setns(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    printf("open %s: %s\n", path, err_name(errno));
    return 0;
  }
  return outcome(setns(fd, 0));
}

static int cmd_ptrace(const char *pid) {
  long rc = ptrace(PTRACE_SEIZE, (pid_t)atoi(pid), 0, 0);
  if (rc == 0)
    ptrace(PTRACE_DETACH, (pid_t)atoi(pid), 0, 0);
  return outcome(rc);
}

/* pidfd_getfd(2) of another process's descriptor: "ok", or the errno name
 * ("pidfd_open ENAME" if the process cannot even be named). */
static int cmd_getfd(const char *pid, const char *fd) {
  long pidfd = syscall(SYS_pidfd_open, (pid_t)atoi(pid), 0);
  if (pidfd < 0) {
    printf("pidfd_open %s\n", err_name(errno));
    return 0;
  }
  long got = syscall(SYS_pidfd_getfd, (int)pidfd, atoi(fd), 0);
  int err = errno;
  if (got >= 0)
    close((int)got);
  close((int)pidfd);
  errno = err;
  return outcome(got);
}

static int cmd_keyctl(void) {
  return outcome(syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 1));
}

static int cmd_bpf(void) {
  union bpf_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.map_type = BPF_MAP_TYPE_ARRAY;
  attr.key_size = 4;
  attr.value_size = 4;
  attr.max_entries = 1;
  return outcome(syscall(SYS_bpf, BPF_MAP_CREATE, &attr, sizeof attr));
}

static int cmd_perf(void) {
  struct perf_event_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.type = PERF_TYPE_SOFTWARE;
  attr.size = sizeof attr;
  attr.config = PERF_COUNT_SW_CPU_CLOCK;
  attr.exclude_kernel = 1;
  return outcome(syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0));
}

static int cmd_io_uring(void) {
  struct io_uring_params p;
  memset(&p, 0, sizeof p);
  return outcome(syscall(SYS_io_uring_setup, 4, &p));
}

static int cmd_tiocsti(void) {
  char c = 'x';
  return outcome(ioctl(0, TIOCSTI, &c));
}

/* ---- kernel interfaces that are not namespaced ---------------------------
 * Arguments are chosen so that where the kernel checks them before the
 * capability, an unfiltered call fails with EINVAL (or succeeds harmlessly),
 * so that only the seccomp filter answers EPERM, and so that the probe can do
 * no harm even when run as the host's root. */

/* A syscall of the i386 ABI (int 0x80, getpid = 20) from this 64-bit process:
 * "survived RET" if it came back. */
static int cmd_abi_i386(void) {
#if defined(__x86_64__)
  long ret;
  __asm__ volatile("int $0x80" : "=a"(ret) : "a"(20L) : "memory");
  printf("survived %ld\n", ret);
  return 0;
#else
  printf("not x86_64\n");
  return 2;
#endif
}

/* A syscall of the x32 ABI (getpid with __X32_SYSCALL_BIT). */
static int cmd_abi_x32(void) {
#if defined(__x86_64__)
  long ret = syscall(0x40000000L | SYS_getpid);
  printf("survived %ld %s\n", ret, ret < 0 ? err_name(errno) : "");
  return 0;
#else
  printf("not x86_64\n");
  return 2;
#endif
}

/* kexec_load with flags no kernel accepts (EINVAL after the capability). */
static int cmd_kexec(void) {
  return outcome(syscall(SYS_kexec_load, 0UL, 0UL, NULL, 0xfff0000UL));
}

static int cmd_kexec_file(void) {
  return outcome(syscall(SYS_kexec_file_load, -1, -1, 0UL, NULL, 0xfff0UL));
}

/* A user-mode-only userfaultfd needs no privilege at all. */
static int cmd_userfaultfd(void) {
  long fd = syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
  if (fd >= 0)
    close((int)fd);
  return outcome(fd);
}

/* name_to_handle_at of "/" needs no privilege. */
static int cmd_name_to_handle(void) {
  struct { struct file_handle fh; unsigned char data[128]; } h;
  memset(&h, 0, sizeof h);
  h.fh.handle_bytes = 128;
  int mount_id;
  return outcome(name_to_handle_at(AT_FDCWD, "/", &h.fh, &mount_id, 0));
}

/* open_by_handle_at with a made-up handle of the root's file system. */
static int cmd_open_by_handle(void) {
  struct { struct file_handle fh; unsigned char data[8]; } h;
  memset(&h, 0, sizeof h);
  h.fh.handle_bytes = 8;
  h.fh.handle_type = 1;
  int root = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  long fd = open_by_handle_at(root, &h.fh, O_RDONLY | O_CLOEXEC);
  int err = errno;
  if (fd >= 0)
    close((int)fd);
  close(root);
  errno = err;
  return outcome(fd);
}

/* reboot with wrong magic numbers: EINVAL once past the capability check. */
static int cmd_reboot(void) {
  return outcome(syscall(SYS_reboot, 0, 0, LINUX_REBOOT_CMD_CAD_OFF, NULL));
}

/* An invalid time (EINVAL before the capability check). */
static int cmd_clock_settime(void) {
  struct timespec ts = {0, -1};
  return outcome(syscall(SYS_clock_settime, CLOCK_REALTIME, &ts));
}

static int cmd_settimeofday(void) {
  struct timeval tv = {0, -1};
  return outcome(syscall(SYS_settimeofday, &tv, NULL));
}

/* A read-only adjtimex (modes 0) needs no privilege. */
static int cmd_adjtimex(void) {
  struct timex tx;
  memset(&tx, 0, sizeof tx);
  return outcome(syscall(SYS_adjtimex, &tx));
}

static int cmd_clock_adjtime(void) {
  struct timex tx;
  memset(&tx, 0, sizeof tx);
  return outcome(syscall(SYS_clock_adjtime, CLOCK_REALTIME, &tx));
}

/* swapon with flags no kernel accepts (EINVAL before the capability). */
static int cmd_swapon(void) {
  return outcome(syscall(SYS_swapon, "/nonexistent-swap", 0x7fffffff));
}

static int cmd_swapoff(void) {
  return outcome(syscall(SYS_swapoff, "/nonexistent-swap"));
}

/* socket(FAMILY, a type that family supports): "ok" or the errno name. */
static int cmd_socket(const char *name) {
  static const struct { const char *name; int family, type, proto; } fams[] = {
    {"unix", AF_UNIX, SOCK_STREAM, 0},       {"inet", AF_INET, SOCK_DGRAM, 0},
    {"inet6", AF_INET6, SOCK_DGRAM, 0},      {"netlink", AF_NETLINK, SOCK_RAW, 0},
    {"vsock", AF_VSOCK, SOCK_STREAM, 0},     {"vsock-dgram", AF_VSOCK, SOCK_DGRAM, 0},
    {"alg", AF_ALG, SOCK_SEQPACKET, 0},      {"packet", AF_PACKET, SOCK_DGRAM, 0},
    {"bluetooth", AF_BLUETOOTH, SOCK_RAW, 0}, {"tipc", AF_TIPC, SOCK_RDM, 0},
    {"rds", AF_RDS, SOCK_SEQPACKET, 0},      {"xdp", AF_XDP, SOCK_RAW, 0},
    {"key", AF_KEY, SOCK_RAW, 2},            {"can", AF_CAN, SOCK_RAW, 1},
  };
  for (size_t i = 0; i < sizeof fams / sizeof fams[0]; ++i)
    if (strcmp(name, fams[i].name) == 0) {
      int s = socket(fams[i].family, fams[i].type | SOCK_CLOEXEC, fams[i].proto);
      int err = errno;
      if (s >= 0)
        close(s);
      errno = err;
      return outcome(s);
    }
  /* A raw family number, with the high bits as given (e.g. 0x100000028). */
  unsigned long long fam = strtoull(name, NULL, 0);
  long s = syscall(SYS_socket, fam, (unsigned long)(SOCK_STREAM | SOCK_CLOEXEC), 0UL);
  int err = errno;
  if (s >= 0)
    close((int)s);
  errno = err;
  return outcome(s);
}

/* ---- resources ----------------------------------------------------------- */

static int cmd_forkbomb(void) {
  for (;;)
    if (fork() < 0)
      usleep(1000);
  return 0;
}

/* Forks up to `max` children that wait; prints how many it got and why it
 * stopped, then ends them. */
static int cmd_fork_max(const char *max_s) {
  long max = atol(max_s);
  pid_t *kids = calloc((size_t)max + 1, sizeof *kids);
  long n = 0;
  int err = 0;
  while (n < max) {
    pid_t p = fork();
    if (p == 0) {
      pause();
      _exit(0);
    }
    if (p < 0) {
      err = errno;
      break;
    }
    kids[n++] = p;
  }
  printf("forked=%ld stopped=%s\n", n, err ? err_name(err) : "none");
  for (long i = 0; i < n; ++i)
    kill(kids[i], SIGKILL);
  for (long i = 0; i < n; ++i)
    waitpid(kids[i], NULL, 0);
  return 0;
}

static int cmd_hog(const char *mb_s) {
  long mb = atol(mb_s);
  for (long i = 0; i < mb; ++i) {
    char *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return failed();
    memset(p, (int)(i & 0xff) | 1, 1 << 20);
  }
  printf("survived %ld MiB\n", mb);
  return 0;
}

static int cmd_spin(void) {
  for (volatile unsigned long i = 0;; ++i) {
  }
  return 0;
}

static double seconds_of(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Spins until `ms` milliseconds of wall-clock time passed; prints the CPU time
 * it got: "cpu_ms=C wall_ms=W". */
static int cmd_spin_for(const char *ms_s) {
  double want = atof(ms_s) / 1000.0;
  double w0 = seconds_of(CLOCK_MONOTONIC), c0 = seconds_of(CLOCK_PROCESS_CPUTIME_ID);
  double w = w0;
  while (w - w0 < want)
    w = seconds_of(CLOCK_MONOTONIC);
  double c = seconds_of(CLOCK_PROCESS_CPUTIME_ID);
  printf("cpu_ms=%.0f wall_ms=%.0f\n", (c - c0) * 1000.0, (w - w0) * 1000.0);
  return 0;
}

/* ---- sockets ---------------------------------------------------------------- */

static socklen_t abstract_addr(struct sockaddr_un *a, const char *name) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  size_t len = strnlen(name, sizeof a->sun_path - 2);
  memcpy(a->sun_path + 1, name, len);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
}

static void tcp_addr(struct sockaddr_in *a, const char *port) {
  memset(a, 0, sizeof *a);
  a->sin_family = AF_INET;
  a->sin_port = htons((uint16_t)atoi(port));
  a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
}

/* Listens; then a daemon child answers every connection with "hello" while
 * the parent prints "listening" and exits 0, so `probe X-listen && probe
 * X-connect` needs no waiting. */
static int serve(int s) {
  if (listen(s, 16) < 0)
    return failed();
  fflush(stdout);
  pid_t p = fork();
  if (p < 0)
    return failed();
  if (p == 0) {
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
    for (;;) {
      int c = accept(s, NULL, NULL);
      if (c < 0)
        continue;
      (void)!write(c, "hello\n", 6);
      close(c);
    }
  }
  printf("listening\n");
  return 0;
}

/* Like tcp-listen, but the daemon child keeps every connection it accepts
 * open and never reads from it (a server that stalls its clients). */
static int cmd_tcp_hold(const char *port) {
  struct sockaddr_in a;
  tcp_addr(&a, port);
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0
      || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 16) < 0)
    return failed();
  fflush(stdout);
  pid_t p = fork();
  if (p < 0)
    return failed();
  if (p == 0) {
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
    for (;;)
      (void)accept(s, NULL, NULL); /* kept open, never read */
  }
  printf("listening\n");
  return 0;
}

/* Connects; prints "ok" and the server's greeting, or the errno name. */
static int connect_to(int domain, const struct sockaddr *a, socklen_t len) {
  int s = socket(domain, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return outcome(-1);
  if (connect(s, a, len) < 0)
    return outcome(-1);
  char buf[64] = "";
  ssize_t n = read(s, buf, sizeof buf - 1);
  buf[n < 0 ? 0 : n] = '\0';
  buf[strcspn(buf, "\n")] = '\0';
  printf("ok %s\n", buf);
  return 0;
}

static int cmd_abstract_listen(const char *name) {
  struct sockaddr_un a;
  socklen_t len = abstract_addr(&a, name);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0 || bind(s, (struct sockaddr *)&a, len) < 0)
    return failed();
  return serve(s);
}

static int cmd_abstract_connect(const char *name) {
  struct sockaddr_un a;
  socklen_t len = abstract_addr(&a, name);
  return connect_to(AF_UNIX, (struct sockaddr *)&a, len);
}

/* Connects a SOCK_SEQPACKET socket to the unix socket at `path` and sends
 * `text` as one packet: "ok" or the errno name. */
static int cmd_seqpacket_send(const char *path, const char *text) {
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  strncpy(a.sun_path, path, sizeof a.sun_path - 1);
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0)
    return outcome(-1);
  long rc = send(s, text, strlen(text), MSG_NOSIGNAL);
  int err = errno;
  close(s);
  errno = err;
  return outcome(rc);
}

/* Replaces the unix socket at `path` with a SOCK_SEQPACKET listener of our own
 * (an agent hijacking /run/chronus.sock), prints "listening", then accepts one
 * connection and prints "got N bytes" for its first packet, or "closed". */
static int cmd_seqpacket_listen(const char *path) {
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  strncpy(a.sun_path, path, sizeof a.sun_path - 1);
  unlink(path);
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 4) < 0 ||
      chmod(path, 0666) < 0)
    return outcome(-1);
  printf("listening\n");
  int c = accept(s, NULL, NULL);
  if (c < 0)
    return outcome(-1);
  char buf[70000];
  long n = recv(c, buf, sizeof buf, 0);
  if (n <= 0)
    printf("closed\n");
  else
    printf("got %ld bytes\n", n);
  return 0;
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Decodes hex into buf (at most cap bytes); the length, or -1. */
static long unhex(const char *hex, unsigned char *buf, long cap) {
  long n = (long)strlen(hex);
  if (n % 2 || n / 2 > cap)
    return -1;
  for (long i = 0; i < n / 2; ++i) {
    int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return -1;
    buf[i] = (unsigned char)(hi * 16 + lo);
  }
  return n / 2;
}

/* One SOCK_SEQPACKET connection to `path`; for each SPEC, in order:
 *   hex:HEX       send those bytes as one packet, wait for one reply
 *   zeros:N       send N zero bytes as one packet, wait for one reply
 *   repeat:N:HEX  send the packet N times without reading, then read replies
 *                 until none come for 2 s; prints "sent N"
 * A reply is printed as "reply HEX", or "closed", or "none" (none in 10 s). */
static int cmd_seqpacket_frames(const char *path, int nspec, char **specs) {
  static unsigned char buf[140000];
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  strncpy(a.sun_path, path, sizeof a.sun_path - 1);
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0)
    return outcome(-1);
  for (int i = 0; i < nspec; ++i) {
    const char *sp = specs[i];
    long len = -1, times = 1;
    int wait_reply = 1;
    if (strncmp(sp, "hex:", 4) == 0) {
      len = unhex(sp + 4, buf, (long)sizeof buf);
    } else if (strncmp(sp, "zeros:", 6) == 0) {
      len = atol(sp + 6);
      if (len < 0 || len > (long)sizeof buf)
        len = -1;
      else
        memset(buf, 0, (size_t)len);
    } else if (strncmp(sp, "repeat:", 7) == 0) {
      char *colon = strchr(sp + 7, ':');
      times = atol(sp + 7);
      wait_reply = 0;
      len = colon ? unhex(colon + 1, buf, (long)sizeof buf) : -1;
    }
    if (len < 0) {
      fprintf(stderr, "probe: bad spec '%s'\n", sp);
      return 2;
    }
    for (long t = 0; t < times; ++t)
      if (send(s, buf, (size_t)len, MSG_NOSIGNAL) != len)
        return outcome(-1);
    if (!wait_reply) {
      /* Read what comes back until 2 s pass without a reply: a connection
       * closed with unread replies would make the node's reads fail
       * (ECONNRESET) before it read the rest of what was sent. */
      struct pollfd q = {s, POLLIN, 0};
      while (poll(&q, 1, 2000) == 1 && recv(s, buf, sizeof buf, MSG_DONTWAIT) > 0)
        ;
      printf("sent %ld\n", times);
      continue;
    }
    struct pollfd p = {s, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) {
      printf("none\n");
      continue;
    }
    long n = recv(s, buf, sizeof buf, 0);
    if (n <= 0) {
      printf("closed\n");
      continue;
    }
    printf("reply ");
    for (long k = 0; k < n; ++k)
      printf("%02x", buf[k]);
    printf("\n");
  }
  close(s);
  return 0;
}

/* Opens N SOCK_SEQPACKET connections to `path` and keeps them all open; a
 * connection the other side refuses gets a reply at once and is closed. After
 * 2 s: "held H refused R" (R: connections that got a reply or were closed).
 * With `forever`, it then keeps holding them until it is killed. */
static int cmd_seqpacket_hold(const char *path, const char *count, int forever) {
  int n = atoi(count), refused = 0, held = 0;
  int *fds = calloc((size_t)(n > 0 ? n : 1), sizeof(int));
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  strncpy(a.sun_path, path, sizeof a.sun_path - 1);
  for (int i = 0; i < n; ++i) {
    fds[i] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&a, sizeof a) < 0)
      return outcome(-1);
  }
  sleep(2);
  for (int i = 0; i < n; ++i) {
    struct pollfd p = {fds[i], POLLIN, 0};
    if (poll(&p, 1, 0) == 1)
      ++refused;
    else
      ++held;
  }
  printf("held %d refused %d\n", held, refused);
  while (forever)
    pause();
  return 0;
}

static int cmd_tcp_listen(const char *port) {
  struct sockaddr_in a;
  tcp_addr(&a, port);
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0
      || bind(s, (struct sockaddr *)&a, sizeof a) < 0)
    return failed();
  return serve(s);
}

static int cmd_tcp_connect(const char *port) {
  struct sockaddr_in a;
  tcp_addr(&a, port);
  return connect_to(AF_INET, (struct sockaddr *)&a, sizeof a);
}

/* TCP to ADDR:PORT (an IPv4 address), giving up after MS milliseconds: sends
 * an HTTP/1.0 GET and prints "ok" and the first line of the answer, or the
 * errno name (ETIMEDOUT when nothing answered: a dropped SYN). */
static int cmd_http_get(const char *addr, const char *port, const char *ms) {
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)atoi(port));
  if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
    printf("EINVAL\n");
    return 0;
  }
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0)
    return outcome(-1);
  if (connect(s, (struct sockaddr *)&a, sizeof a) < 0 && errno != EINPROGRESS)
    return outcome(-1);
  struct pollfd p = {s, POLLOUT, 0};
  int n = poll(&p, 1, atoi(ms));
  if (n == 0) {
    printf("ETIMEDOUT\n");
    return 0;
  }
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    printf("%s\n", err_name(err));
    return 0;
  }
  const char req[] = "GET / HTTP/1.0\r\n\r\n";
  (void)!write(s, req, sizeof req - 1);
  char buf[256] = "";
  size_t got = 0;
  while (got < sizeof buf - 1) {
    p.events = POLLIN;
    if (poll(&p, 1, atoi(ms)) <= 0)
      break;
    ssize_t r = read(s, buf + got, sizeof buf - 1 - got);
    if (r <= 0)
      break;
    got += (size_t)r;
    if (memchr(buf, '\n', got))
      break;
  }
  buf[got] = '\0';
  buf[strcspn(buf, "\r\n")] = '\0';
  printf("ok %s\n", buf);
  return 0;
}

/* Skips a DNS name at p[*i] (labels or a compression pointer); 0 if it runs out. */
static int dns_skip_name(const unsigned char *p, size_t n, size_t *i) {
  while (*i < n) {
    unsigned char l = p[*i];
    if (l == 0) { *i += 1; return 1; }
    if ((l & 0xc0) == 0xc0) { *i += 2; return *i <= n; }
    *i += 1 + l;
  }
  return 0;
}

/* DNS over TCP to ADDR:53: one A query per NAME, all in one write (pipelined,
 * ids 1..N), then a half-close; prints, for each answer as it comes, "NAME
 * rcode=R" and its A records, or the errno name / "timeout" (3 s). */
static int cmd_dns_tcp(const char *addr, int count, char **names) {
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons(53);
  if (inet_pton(AF_INET, addr, &a.sin_addr) != 1 || count < 1 || count > 16) {
    printf("EINVAL\n");
    return 0;
  }
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return outcome(-1);
  if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
    printf("%s\n", err_name(errno));
    return 0;
  }
  unsigned char q[16 * 300];
  size_t len = 0;
  for (int k = 0; k < count; ++k) {
    unsigned char *m = q + len + 2;
    size_t j = 0;
    memset(m, 0, 12);
    m[1] = (unsigned char)(k + 1); /* id */
    m[2] = 0x01;                   /* RD */
    m[5] = 1;                      /* one question */
    j = 12;
    const char *n = names[k];
    while (*n) {
      const char *dot = strchr(n, '.');
      size_t l = dot ? (size_t)(dot - n) : strlen(n);
      if (l == 0 || l > 63 || j + l + 6 > 290) {
        printf("EINVAL\n");
        return 0;
      }
      m[j++] = (unsigned char)l;
      memcpy(m + j, n, l);
      j += l;
      n += l + (dot ? 1 : 0);
    }
    m[j++] = 0;
    m[j++] = 0; m[j++] = 1; /* A */
    m[j++] = 0; m[j++] = 1; /* IN */
    q[len] = (unsigned char)(j >> 8);
    q[len + 1] = (unsigned char)(j & 255);
    len += 2 + j;
  }
  if (write(s, q, len) != (ssize_t)len)
    return outcome(-1);
  shutdown(s, SHUT_WR);
  unsigned char buf[65536 + 2];
  size_t got = 0;
  int answered = 0;
  struct pollfd p = {s, POLLIN, 0};
  while (answered < count) {
    if (poll(&p, 1, 3000) <= 0) {
      printf("timeout\n");
      return 0;
    }
    ssize_t r = read(s, buf + got, sizeof buf - got);
    if (r <= 0) {
      printf("closed\n");
      return 0;
    }
    got += (size_t)r;
    for (;;) {
      if (got < 2)
        break;
      size_t ml = ((size_t)buf[0] << 8) | buf[1];
      if (got < 2 + ml)
        break;
      const unsigned char *m = buf + 2;
      if (ml >= 12) {
        int id = (m[0] << 8) | m[1];
        int rcode = m[3] & 15;
        int qd = (m[4] << 8) | m[5], an = (m[6] << 8) | m[7];
        printf("%s rcode=%d", id >= 1 && id <= count ? names[id - 1] : "?", rcode);
        size_t i = 12;
        for (int k = 0; k < qd && dns_skip_name(m, ml, &i); ++k)
          i += 4;
        for (int k = 0; k < an && dns_skip_name(m, ml, &i) && i + 10 <= ml; ++k) {
          int type = (m[i] << 8) | m[i + 1];
          size_t rdlen = ((size_t)m[i + 8] << 8) | m[i + 9];
          i += 10;
          if (i + rdlen > ml)
            break;
          if (type == 1 && rdlen == 4)
            printf(" %u.%u.%u.%u", m[i], m[i + 1], m[i + 2], m[i + 3]);
          i += rdlen;
        }
        printf("\n");
      }
      ++answered;
      memmove(buf, buf + 2 + ml, got - 2 - ml);
      got -= 2 + ml;
    }
  }
  return 0;
}

/* The IPv4 address of interface NAME, or the errno name. */
static int cmd_if_addr(const char *name) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
  if (s < 0 || ioctl(s, SIOCGIFADDR, &ifr) < 0)
    return failed();
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &((struct sockaddr_in *)&ifr.ifr_addr)->sin_addr, buf, sizeof buf);
  printf("%s\n", buf);
  return 0;
}

/* Like tcp-listen, on every address (0.0.0.0). */
static int cmd_tcp_listen_all(const char *port) {
  struct sockaddr_in a;
  tcp_addr(&a, port);
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0
      || bind(s, (struct sockaddr *)&a, sizeof a) < 0)
    return failed();
  return serve(s);
}

/* ---- dispatch -------------------------------------------------------------- */

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2)
    return usage();
  const char *c = argv[1];
  const char *a1 = argc > 2 ? argv[2] : NULL;
  const char *a2 = argc > 3 ? argv[3] : NULL;
#define IS(name, nargs) (strcmp(c, name) == 0 && argc == 2 + (nargs))
  /* files */
  if (IS("cat", 1)) return cmd_cat(a1);
  if (IS("write", 2)) return cmd_write(a1, a2);
  if (IS("fill", 2)) return cmd_fill(a1, a2);
  if (IS("touch-many", 2)) return cmd_touch_many(a1, a2);
  if (IS("ls", 1)) return cmd_ls(a1);
  if (IS("tree", 1)) return tree(a1), 0;
  if (IS("snaptree", 1)) return snaptree(a1), 0;
  if (IS("setxattr", 3)) return outcome(lsetxattr(a1, a2, argv[4], strlen(argv[4]), 0));
  if (IS("bind-unix", 1)) return cmd_bind_unix(a1);
  if (IS("mknod", 1)) return outcome(mknod(a1, S_IFCHR | 0666, makedev(1, 3)));
  if (IS("swap-fifo", 1)) return cmd_swap_fifo(a1);
  /* identity and /proc */
  if (IS("hostname", 0)) return cmd_hostname();
  if (IS("pid", 0)) return printf("%d\n", getpid()), 0;
  if (IS("pids", 0)) return cmd_pids();
  if (IS("alive", 1)) return outcome(kill(atoi(a1), 0));
  if (IS("kill", 2)) return outcome(kill(atoi(a1), parse_signal(a2)));
  if (IS("status", 1)) return print_status(a1);
  if (IS("caps", 0)) return cmd_caps();
  if (IS("uid", 0)) return cmd_uid();
  if (IS("cwd", 0)) return cmd_cwd();
  if (IS("env", 1)) return cmd_env(a1);
  /* forbidden things */
  if (IS("mount", 0)) return outcome(mount("none", "/tmp", "tmpfs", 0, NULL));
  if (IS("remount", 1)) return outcome(mount(NULL, a1, NULL, MS_REMOUNT, NULL));
  if (IS("umount", 1)) return outcome(umount2(a1, MNT_DETACH));
  if (IS("unshare", 1)) return ns_flag(a1) ? outcome(unshare(ns_flag(a1))) : usage();
  if (IS("clone-ns", 1)) return cmd_clone_ns(a1);
  if (IS("clone3", 0)) return cmd_clone3();
  if (IS("setns", 1)) return cmd_setns(a1);
  if (IS("chroot", 0)) return outcome(chroot("/tmp"));
  if (IS("ptrace", 1)) return cmd_ptrace(a1);
  if (IS("getfd", 2)) return cmd_getfd(a1, a2);
  if (IS("keyctl", 0)) return cmd_keyctl();
  if (IS("bpf", 0)) return cmd_bpf();
  if (IS("perf", 0)) return cmd_perf();
  if (IS("io-uring", 0)) return cmd_io_uring();
  if (IS("tiocsti", 0)) return cmd_tiocsti();
  if (IS("abi-i386", 0)) return cmd_abi_i386();
  if (IS("abi-x32", 0)) return cmd_abi_x32();
  if (IS("kexec", 0)) return cmd_kexec();
  if (IS("kexec-file", 0)) return cmd_kexec_file();
  if (IS("userfaultfd", 0)) return cmd_userfaultfd();
  if (IS("name-to-handle", 0)) return cmd_name_to_handle();
  if (IS("open-by-handle", 0)) return cmd_open_by_handle();
  if (IS("reboot", 0)) return cmd_reboot();
  if (IS("clock-settime", 0)) return cmd_clock_settime();
  if (IS("settimeofday", 0)) return cmd_settimeofday();
  if (IS("adjtimex", 0)) return cmd_adjtimex();
  if (IS("clock-adjtime", 0)) return cmd_clock_adjtime();
  if (IS("swapon", 0)) return cmd_swapon();
  if (IS("swapoff", 0)) return cmd_swapoff();
  if (IS("socket", 1)) return cmd_socket(a1);
  /* resources */
  if (IS("forkbomb", 0)) return cmd_forkbomb();
  if (IS("fork-max", 1)) return cmd_fork_max(a1);
  if (IS("hog", 1)) return cmd_hog(a1);
  if (IS("spin", 0)) return cmd_spin();
  if (IS("spin-for", 1)) return cmd_spin_for(a1);
  if (IS("sleep", 0)) for (;;) pause();
  /* sockets */
  if (IS("abstract-listen", 1)) return cmd_abstract_listen(a1);
  if (IS("abstract-connect", 1)) return cmd_abstract_connect(a1);
  if (IS("tcp-listen", 1)) return cmd_tcp_listen(a1);
  if (IS("tcp-connect", 1)) return cmd_tcp_connect(a1);
  if (IS("tcp-listen-all", 1)) return cmd_tcp_listen_all(a1);
  if (IS("tcp-hold", 1)) return cmd_tcp_hold(a1);
  if (IS("if-addr", 1)) return cmd_if_addr(a1);
  if (IS("http-get", 3)) return cmd_http_get(a1, a2, argv[4]);
  if (strcmp(c, "dns-tcp") == 0 && argc >= 4) return cmd_dns_tcp(a1, argc - 3, argv + 3);
  if (IS("seqpacket-send", 2)) return cmd_seqpacket_send(a1, a2);
  if (IS("seqpacket-listen", 1)) return cmd_seqpacket_listen(a1);
  if (IS("seqpacket-hold", 2)) return cmd_seqpacket_hold(a1, a2, 0);
  if (IS("seqpacket-hold", 3) && strcmp(argv[4], "forever") == 0)
    return cmd_seqpacket_hold(a1, a2, 1);
  if (strcmp(c, "seqpacket-frames") == 0 && argc >= 4)
    return cmd_seqpacket_frames(a1, argc - 3, argv + 3);
  /* endings */
  if (IS("exit", 1)) return atoi(a1);
  if (IS("kill-self", 1)) {
    fflush(stdout);
    signal(parse_signal(a1), SIG_DFL);
    kill(getpid(), parse_signal(a1));
    pause();
  }
#undef IS
  return usage();
}

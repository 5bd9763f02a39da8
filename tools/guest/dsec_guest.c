/* dsec_guest: the guest agent of a microVM (runtime/microvm.hpp, docs/microvm.md).
 *
 * It is the initramfs's /init (PID 1 of the guest), statically linked. It
 *   1. mounts /dev, /proc, /sys and loads the kernel modules listed in
 *      /modules.order (Debian's kernel has virtio-mmio, virtio-blk,
 *      virtio-console, EROFS and overlayfs only as modules);
 *   2. waits for the virtio-serial port VM_PORT_NAME and the layer disks, which
 *      the host names by serial (VM_LAYER_SERIAL_PREFIX + index, topmost first;
 *      the count is `dsec.layers=N` on the kernel command line);
 *   3. mounts each disk as EROFS, read-only, and an overlay of them over a tmpfs
 *      (`dsec.disk=BYTES`, default half the memory) at /newroot, with /proc,
 *      /sys and /dev inside;
 *   4. reports VM_READY with its step timings and serves the exec protocol of
 *      runtime/vm_proto.h: commands run chrooted into /newroot, each in its own
 *      session, stdin/stdout/stderr over pipes, output streamed as it comes.
 *
 * Errors before the port is open go to /dev/kmsg (the host keeps the console
 * log); after, as VM_BOOT_FAILED. Either way the guest powers off.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <grp.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime/vm_proto.h"

#define MAX_CMDS 256
#define MAX_LAYERS 8

static int port = -1;

static uint32_t boot_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return (uint32_t)(ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

static void write_all(int fd, const void* p, size_t n) {
  const char* c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN) {
        struct pollfd pf = {fd, POLLOUT, 0};
        poll(&pf, 1, -1);
        continue;
      }
      return; /* the host is gone: nothing to tell */
    }
    c += w;
    n -= (size_t)w;
  }
}

static void send_frame(uint16_t type, uint16_t flags, uint32_t id, const void* a, size_t alen,
                       const void* b, size_t blen) {
  struct vm_frame f = {VM_MAGIC, (uint32_t)(alen + blen), type, flags, id};
  write_all(port, &f, sizeof f);
  if (alen)
    write_all(port, a, alen);
  if (blen)
    write_all(port, b, blen);
}

static void send_done(uint32_t id, int err, const char* what) {
  int32_t e = err;
  send_frame(VM_DONE, 0, id, &e, sizeof e, what, what ? strlen(what) : 0);
}

static void power_off(void) {
  sync();
  reboot(RB_POWER_OFF);
  for (;;)
    pause();
}

static void fail(const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (port >= 0) {
    send_frame(VM_BOOT_FAILED, 0, 0, msg, strlen(msg), NULL, 0);
  }
  int k = open("/dev/kmsg", O_WRONLY);
  if (k >= 0) {
    dprintf(k, "dsec_guest: %s\n", msg);
    close(k);
  }
  power_off();
}

static void read_text(const char* path, char* buf, size_t n) {
  buf[0] = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return;
  ssize_t r = read(fd, buf, n - 1);
  close(fd);
  if (r < 0)
    r = 0;
  buf[r] = 0;
  while (r > 0 && (buf[r - 1] == '\n' || buf[r - 1] == ' '))
    buf[--r] = 0;
}

static const char* cmdline_value(const char* cmdline, const char* key) {
  static char val[256];
  size_t kl = strlen(key);
  for (const char* p = cmdline; (p = strstr(p, key)) != NULL; p += kl) {
    if ((p == cmdline || p[-1] == ' ') && p[kl] == '=') {
      const char* v = p + kl + 1;
      size_t n = strcspn(v, " \n");
      if (n >= sizeof val)
        n = sizeof val - 1;
      memcpy(val, v, n);
      val[n] = 0;
      return val;
    }
  }
  return NULL;
}

static void load_modules(void) {
  FILE* f = fopen("/modules.order", "re");
  if (!f)
    fail("no /modules.order in the initramfs");
  char name[256];
  while (fgets(name, sizeof name, f)) {
    name[strcspn(name, "\n")] = 0;
    if (!name[0])
      continue;
    char path[300];
    snprintf(path, sizeof path, "/lib/modules/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      fail("open %s: %s", path, strerror(errno));
    if (syscall(SYS_finit_module, fd, "", 0) != 0 && errno != EEXIST)
      fail("finit_module %s: %s", path, strerror(errno));
    close(fd);
  }
  fclose(f);
}

/* Waits (up to ~60 s: under TCG probing is slow) for `find` to succeed. */
static int wait_for(int (*find)(void* ctx), void* ctx) {
  for (int i = 0; i < 6000; ++i) {
    if (find(ctx))
      return 1;
    usleep(10000);
  }
  return 0;
}

static char port_dev[300];
static int find_port(void* ctx) {
  (void)ctx;
  DIR* d = opendir("/sys/class/virtio-ports");
  if (!d)
    return 0;
  struct dirent* e;
  int found = 0;
  while (!found && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    char path[300], name[128];
    snprintf(path, sizeof path, "/sys/class/virtio-ports/%s/name", e->d_name);
    read_text(path, name, sizeof name);
    if (strcmp(name, VM_PORT_NAME) == 0) {
      snprintf(port_dev, sizeof port_dev, "/dev/%s", e->d_name);
      found = access(port_dev, F_OK) == 0;
    }
  }
  closedir(d);
  return found;
}

struct disks {
  int want;
  char dev[MAX_LAYERS][300];
};
static int find_disks(void* ctx) {
  struct disks* ds = ctx;
  DIR* d = opendir("/sys/block");
  if (!d)
    return 0;
  struct dirent* e;
  int have = 0;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, "vd", 2) != 0)
      continue;
    char path[300], serial[64];
    snprintf(path, sizeof path, "/sys/block/%s/serial", e->d_name);
    read_text(path, serial, sizeof serial);
    size_t pl = strlen(VM_LAYER_SERIAL_PREFIX);
    if (strncmp(serial, VM_LAYER_SERIAL_PREFIX, pl) != 0)
      continue;
    int i = atoi(serial + pl);
    if (i < 0 || i >= ds->want)
      continue;
    snprintf(ds->dev[i], sizeof ds->dev[i], "/dev/%s", e->d_name);
    if (access(ds->dev[i], F_OK) == 0)
      ++have;
  }
  closedir(d);
  return have == ds->want;
}

static void must_mount(const char* src, const char* dst, const char* fs, unsigned long flags,
                       const char* data) {
  mkdir(dst, 0755);
  if (mount(src, dst, fs, flags, data) != 0)
    fail("mount %s (%s) on %s: %s", src, fs, dst, strerror(errno));
}

static struct vm_ready timings;

static void boot(void) {
  timings.agent_start_ms = boot_ms();
  mkdir("/dev", 0755);
  mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
  mkdir("/proc", 0755);
  mount("proc", "/proc", "proc", 0, NULL);
  mkdir("/sys", 0755);
  mount("sysfs", "/sys", "sysfs", 0, NULL);

  load_modules();
  timings.modules_ms = boot_ms();

  char cmdline[4096];
  read_text("/proc/cmdline", cmdline, sizeof cmdline);

  if (!wait_for(find_port, NULL))
    fail("no virtio-serial port named %s", VM_PORT_NAME);
  port = open(port_dev, O_RDWR | O_CLOEXEC);
  if (port < 0)
    fail("open %s: %s", port_dev, strerror(errno));

  const char* v = cmdline_value(cmdline, "dsec.layers");
  struct disks ds = {0};
  ds.want = v ? atoi(v) : 0;
  if (ds.want < 1 || ds.want > MAX_LAYERS)
    fail("dsec.layers=%s: want 1 to %d layers", v ? v : "(missing)", MAX_LAYERS);
  if (!wait_for(find_disks, &ds))
    fail("not every one of the %d layer disks appeared", ds.want);
  timings.disks_ms = boot_ms();

  char lower[MAX_LAYERS * 16 + 16] = "";
  for (int i = 0; i < ds.want; ++i) {
    char dir[32];
    snprintf(dir, sizeof dir, "/layers/%d", i);
    mkdir("/layers", 0755);
    must_mount(ds.dev[i], dir, "erofs", MS_RDONLY, NULL);
    if (i)
      strcat(lower, ":");
    strcat(lower, dir);
  }
  v = cmdline_value(cmdline, "dsec.disk");
  char opts[64] = "mode=0755";
  if (v)
    snprintf(opts, sizeof opts, "mode=0755,size=%s", v);
  must_mount("rw", "/rw", "tmpfs", 0, opts);
  mkdir("/rw/upper", 0755);
  mkdir("/rw/work", 0755);
  char ov[MAX_LAYERS * 16 + 128];
  snprintf(ov, sizeof ov, "lowerdir=%s,upperdir=/rw/upper,workdir=/rw/work", lower);
  must_mount("overlay", "/newroot", "overlay", 0, ov);
  must_mount("proc", "/newroot/proc", "proc", 0, NULL);
  must_mount("sysfs", "/newroot/sys", "sysfs", 0, NULL);
  must_mount("/dev", "/newroot/dev", NULL, MS_BIND, NULL);
  mkdir("/newroot/tmp", 01777);
  /* The initramfs' static busybox at /.dsec/libexec, read-only (as a
   * container's system layer has it): put and get use its tar when the image
   * has none. */
  if (access("/libexec/busybox", X_OK) == 0) {
    mkdir("/newroot/.dsec", 0755);
    mkdir("/newroot/.dsec/libexec", 0755);
    must_mount("/libexec", "/newroot/.dsec/libexec", NULL, MS_BIND, NULL);
    must_mount("/libexec", "/newroot/.dsec/libexec", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL);
  }
  v = cmdline_value(cmdline, "dsec.hostname");
  if (v)
    sethostname(v, strlen(v));
  timings.root_ms = boot_ms();
}

/* ---- the exec protocol ---- */

struct cmd {
  int used;
  uint32_t id;
  pid_t pid;
  int out, err, in; /* pipes, or -1 */
  char* inbuf;      /* stdin bytes not yet written */
  size_t inlen;
  int in_eof;       /* close stdin once inbuf is written */
};
static struct cmd cmds[MAX_CMDS];

static struct cmd* find_cmd(uint32_t id) {
  for (int i = 0; i < MAX_CMDS; ++i)
    if (cmds[i].used && cmds[i].id == id)
      return &cmds[i];
  return NULL;
}

static void close_stdin(struct cmd* c) {
  if (c->in >= 0)
    close(c->in);
  c->in = -1;
  free(c->inbuf);
  c->inbuf = NULL;
  c->inlen = 0;
}

static void flush_stdin(struct cmd* c) {
  while (c->in >= 0 && c->inlen > 0) {
    ssize_t w = write(c->in, c->inbuf, c->inlen);
    if (w < 0) {
      if (errno == EAGAIN)
        return;
      close_stdin(c); /* EPIPE: the command closed its stdin */
      return;
    }
    memmove(c->inbuf, c->inbuf + w, c->inlen - (size_t)w);
    c->inlen -= (size_t)w;
  }
  if (c->in >= 0 && c->inlen == 0 && c->in_eof)
    close_stdin(c);
}

/* Reads what a pipe has now; returns 0 at EOF (and closes it). */
static int pump(struct cmd* c, int* fd, uint16_t stream) {
  static char buf[65536];
  for (;;) {
    ssize_t r = read(*fd, buf, sizeof buf);
    if (r > 0) {
      send_frame(VM_OUTPUT, stream, c->id, buf, (size_t)r, NULL, 0);
      continue;
    }
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && errno == EAGAIN)
      return 1;
    close(*fd);
    *fd = -1;
    return 0;
  }
}

static void do_exec(uint32_t id, const char* p, uint32_t len) {
  if (find_cmd(id) || len < 20) {
    send_done(id, EINVAL, "bad exec frame");
    return;
  }
  uint32_t argc, envc, uid, gid, ngroups;
  memcpy(&argc, p, 4);
  memcpy(&envc, p + 4, 4);
  memcpy(&uid, p + 8, 4);
  memcpy(&gid, p + 12, 4);
  memcpy(&ngroups, p + 16, 4);
  if (argc < 1 || argc > 4096 || envc > 4096 || ngroups > VM_MAX_GROUPS
      || len < 20 + 4 * ngroups) {
    send_done(id, EINVAL, "bad argc, envc or ngroups");
    return;
  }
  gid_t groups[VM_MAX_GROUPS];
  for (uint32_t i = 0; i < ngroups; ++i) {
    uint32_t g;
    memcpy(&g, p + 20 + 4 * i, 4);
    groups[i] = g;
  }
  char** argv = calloc(argc + 1, sizeof(char*));
  char** envp = calloc(envc + 1, sizeof(char*));
  const char* q = p + 20 + 4 * ngroups;
  const char* end = p + len;
  const char* cwd = NULL;
  uint32_t n = 0;
  while (q < end && n < 1 + argc + envc) {
    const char* z = memchr(q, 0, (size_t)(end - q));
    if (!z)
      break;
    if (n == 0)
      cwd = q;
    else if (n <= argc)
      argv[n - 1] = (char*)q;
    else
      envp[n - 1 - argc] = (char*)q;
    ++n;
    q = z + 1;
  }
  int slot = -1;
  for (int i = 0; i < MAX_CMDS; ++i)
    if (!cmds[i].used) {
      slot = i;
      break;
    }
  if (n != 1 + argc + envc || slot < 0) {
    send_done(id, slot < 0 ? EAGAIN : EINVAL, slot < 0 ? "too many commands" : "bad strings");
    free(argv);
    free(envp);
    return;
  }
  int in[2], out[2], err[2], st[2];
  if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) ||
      pipe2(st, O_CLOEXEC)) {
    send_done(id, errno, "pipe");
    free(argv);
    free(envp);
    return;
  }
  pid_t pid = fork();
  if (pid == 0) {
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    setsid();
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    int e = 0;
    /* Its user, then its directory (as that user, like a login). */
    if (chroot("/newroot") != 0 || setgroups(ngroups, groups) != 0 || setgid(gid) != 0
        || setuid(uid) != 0 || chdir(cwd && cwd[0] ? cwd : "/") != 0) {
      e = errno;
    } else {
      extern char** environ;
      environ = envp;
      if (!getenv("PATH"))
        putenv("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
      execvp(argv[0], argv);
      e = errno;
    }
    (void)!write(st[1], &e, sizeof e);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  close(err[1]);
  close(st[1]);
  free(argv);
  free(envp);
  int e = 0;
  ssize_t r = pid < 0 ? -1 : read(st[0], &e, sizeof e);
  close(st[0]);
  if (pid < 0 || r == sizeof e) {
    int why = pid < 0 ? errno : e;
    if (pid > 0)
      waitpid(pid, NULL, 0);
    close(in[1]);
    close(out[0]);
    close(err[0]);
    send_done(id, why, strerror(why));
    return;
  }
  struct cmd* c = &cmds[slot];
  memset(c, 0, sizeof *c);
  c->used = 1;
  c->id = id;
  c->pid = pid;
  c->in = in[1];
  c->out = out[0];
  c->err = err[0];
  fcntl(c->in, F_SETFL, O_NONBLOCK);
  fcntl(c->out, F_SETFL, O_NONBLOCK);
  fcntl(c->err, F_SETFL, O_NONBLOCK);
  int32_t p32 = pid;
  send_frame(VM_STARTED, 0, id, &p32, sizeof p32, NULL, 0);
}

static void do_put(uint32_t id, const char* p, uint32_t len) {
  uint32_t mode;
  const char* z = len > 4 ? memchr(p + 4, 0, len - 4) : NULL;
  if (!z) {
    send_done(id, EINVAL, "bad put frame");
    return;
  }
  memcpy(&mode, p, 4);
  char path[4200];
  snprintf(path, sizeof path, "/newroot/%s", p + 4);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode & 07777);
  if (fd < 0) {
    send_done(id, errno, strerror(errno));
    return;
  }
  const char* data = z + 1;
  size_t n = (size_t)(p + len - data);
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    if (w < 0) {
      int e = errno;
      close(fd);
      send_done(id, e, strerror(e));
      return;
    }
    data += w;
    n -= (size_t)w;
  }
  fchmod(fd, mode & 07777);
  close(fd);
  send_done(id, 0, NULL);
}

static void do_get(uint32_t id, const char* p, uint32_t len) {
  if (!memchr(p, 0, len)) {
    send_done(id, EINVAL, "bad get frame");
    return;
  }
  char path[4200];
  snprintf(path, sizeof path, "/newroot/%s", p);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    send_done(id, errno, strerror(errno));
    return;
  }
  static char buf[65536];
  for (;;) {
    ssize_t r = read(fd, buf, sizeof buf);
    if (r < 0) {
      int e = errno;
      close(fd);
      send_done(id, e, strerror(e));
      return;
    }
    if (r == 0)
      break;
    send_frame(VM_DATA, 0, id, buf, (size_t)r, NULL, 0);
  }
  close(fd);
  send_done(id, 0, NULL);
}

static char* inframe;
static size_t inhave;

static void handle(const struct vm_frame* f, const char* p) {
  struct cmd* c;
  switch (f->type) {
  case VM_EXEC:
    do_exec(f->id, p, f->len);
    break;
  case VM_STDIN:
    if ((c = find_cmd(f->id)) == NULL || c->in < 0)
      break;
    if (f->len == 0) {
      c->in_eof = 1;
    } else {
      c->inbuf = realloc(c->inbuf, c->inlen + f->len);
      memcpy(c->inbuf + c->inlen, p, f->len);
      c->inlen += f->len;
    }
    flush_stdin(c);
    break;
  case VM_SIGNAL:
    if ((c = find_cmd(f->id)) != NULL && f->len >= 4) {
      int32_t sig;
      memcpy(&sig, p, 4);
      kill(-c->pid, sig);
    }
    break;
  case VM_PUT:
    do_put(f->id, p, f->len);
    break;
  case VM_GET:
    do_get(f->id, p, f->len);
    break;
  case VM_POWEROFF:
    power_off();
    break;
  default:
    break;
  }
}

/* Reads what the port has; handles each whole frame. */
static void read_port(void) {
  size_t cap = sizeof(struct vm_frame) + VM_MAX_PAYLOAD;
  ssize_t r = read(port, inframe + inhave, cap - inhave);
  if (r <= 0) {
    if (r == 0)
      usleep(10000); /* no host connected: the port reads EOF until one is */
    return;
  }
  inhave += (size_t)r;
  for (;;) {
    if (inhave < sizeof(struct vm_frame))
      return;
    struct vm_frame f;
    memcpy(&f, inframe, sizeof f);
    if (f.magic != VM_MAGIC || f.len > VM_MAX_PAYLOAD)
      fail("a malformed frame from the host");
    size_t whole = sizeof f + f.len;
    if (inhave < whole)
      return;
    handle(&f, inframe + sizeof f);
    memmove(inframe, inframe + whole, inhave - whole);
    inhave -= whole;
  }
}

static void reap(void) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (int i = 0; i < MAX_CMDS; ++i) {
      struct cmd* c = &cmds[i];
      if (!c->used || c->pid != pid)
        continue;
      /* What it wrote before it ended, then its status (a background child
       * still holding the pipes does not hold the status back). */
      if (c->out >= 0 && pump(c, &c->out, 1))
        close(c->out);
      if (c->err >= 0 && pump(c, &c->err, 2))
        close(c->err);
      close_stdin(c);
      int32_t s = status;
      send_frame(VM_EXITED, 0, c->id, &s, sizeof s, NULL, 0);
      c->used = 0;
    }
  }
}

int main(void) {
  if (getpid() != 1) {
    fprintf(stderr, "dsec_guest: this is a microVM's /init (PID 1), not a command\n");
    return 2;
  }
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  signal(SIGPIPE, SIG_IGN);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);

  boot();
  inframe = malloc(sizeof(struct vm_frame) + VM_MAX_PAYLOAD);
  if (!inframe)
    fail("out of memory");
  send_frame(VM_READY, 0, 0, &timings, sizeof timings, NULL, 0);

  struct pollfd pf[2 + 3 * MAX_CMDS];
  struct cmd* owner[2 + 3 * MAX_CMDS];
  for (;;) {
    int n = 0;
    pf[n++] = (struct pollfd){port, POLLIN, 0};
    pf[n++] = (struct pollfd){sfd, POLLIN, 0};
    for (int i = 0; i < MAX_CMDS; ++i) {
      struct cmd* c = &cmds[i];
      if (!c->used)
        continue;
      if (c->out >= 0) {
        owner[n] = c;
        pf[n++] = (struct pollfd){c->out, POLLIN, 0};
      }
      if (c->err >= 0) {
        owner[n] = c;
        pf[n++] = (struct pollfd){c->err, POLLIN, 0};
      }
      if (c->in >= 0 && c->inlen > 0) {
        owner[n] = c;
        pf[n++] = (struct pollfd){c->in, POLLOUT, 0};
      }
    }
    if (poll(pf, (nfds_t)n, -1) < 0)
      continue;
    for (int i = 2; i < n; ++i) {
      if (!pf[i].revents)
        continue;
      struct cmd* c = owner[i];
      if (!c->used)
        continue;
      if (pf[i].fd == c->out)
        pump(c, &c->out, 1);
      else if (pf[i].fd == c->err)
        pump(c, &c->err, 2);
      else if (pf[i].fd == c->in)
        flush_stdin(c);
    }
    if (pf[1].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) > 0) {
      }
      reap();
    }
    if (pf[0].revents)
      read_port();
  }
}

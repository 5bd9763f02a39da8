/* dsec-watch: reports the changes under a directory of a dsec sandbox, run
 * inside it (the system layer carries it at /.dsec/libexec/watch). Static, as
 * the sandbox's base may have no libc. It is what Sandbox.files.watch (Python)
 * and WatchDir (dsec-e2b) run: its output is read by dsec as untrusted bytes
 * of the sandbox, never parsed by a shell. See usage() for the records. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

enum { EXIT_FAIL = 1, EXIT_USAGE = 2, EXIT_NOT_FOUND = 3, EXIT_NOT_DIR = 5 };

static void usage(FILE *out) {
  fputs("usage: watch [-r] DIR\n"
        "Reports the changes in DIR (with -r, in DIR and every directory under it, new\n"
        "ones included) until DIR goes away or the reader does. Symbolic links below\n"
        "DIR are not followed. Its output is a sequence of records, each ended by a\n"
        "NUL byte:\n"
        "  ready             once, when DIR is watched (no change before it is reported)\n"
        "  TYPE NAME         a change: TYPE is create, write, remove, rename (moved away)\n"
        "                    or chmod (metadata); NAME is the path relative to DIR\n"
        "                    (empty for DIR itself)\n"
        "  overflow          the kernel's queue overflowed: changes were lost\n"
        "A directory created under DIR with -r is watched at once, and what it already\n"
        "holds then is reported as created (a file created just then may be reported\n"
        "twice).\n"
        "\n"
        "exit status:\n"
        "  0  DIR was removed or moved away, or the reader went away\n"
        "  1  any other failure (message on stderr)\n"
        "  2  usage error\n"
        "  3  DIR does not exist\n"
        "  5  DIR is not a directory\n",
        out);
}

/* ---- output: records collected, written whole ------------------------------ */

static char *out_buf;
static size_t out_len, out_cap;

static void put(const char *s, size_t n) {
  if (out_len + n > out_cap) {
    size_t cap = out_cap ? out_cap : 65536;
    while (cap < out_len + n)
      cap *= 2;
    char *b = realloc(out_buf, cap);
    if (!b) {
      fputs("watch: out of memory\n", stderr);
      exit(EXIT_FAIL);
    }
    out_buf = b;
    out_cap = cap;
  }
  memcpy(out_buf + out_len, s, n);
  out_len += n;
}

static void record(const char *type, const char *name) {
  put(type, strlen(type));
  if (name) {
    put(" ", 1);
    put(name, strlen(name));
  }
  put("", 1);
}

/* Writes what is collected; the reader gone ends the program. */
static void flush(void) {
  size_t at = 0;
  while (at < out_len) {
    ssize_t n = write(STDOUT_FILENO, out_buf + at, out_len - at);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      exit(0);
    at += (size_t)n;
  }
  out_len = 0;
}

/* ---- watches: wd -> path relative to the root ------------------------------- */

struct watch {
  int wd;
  char *rel; /* "" for the root */
};

static struct watch *watches;
static size_t n_watches, cap_watches;
static int ifd;
static int recursive;
static const char *root;

static struct watch *find(int wd) {
  for (size_t i = 0; i < n_watches; ++i)
    if (watches[i].wd == wd)
      return &watches[i];
  return NULL;
}

static int watched(const char *rel) {
  for (size_t i = 0; i < n_watches; ++i)
    if (!strcmp(watches[i].rel, rel))
      return 1;
  return 0;
}

static char *join(const char *a, const char *b) {
  size_t na = strlen(a), nb = strlen(b);
  char *s = malloc(na + nb + 2);
  if (!s) {
    fputs("watch: out of memory\n", stderr);
    exit(EXIT_FAIL);
  }
  memcpy(s, a, na);
  size_t at = na;
  if (na && nb)
    s[at++] = '/';
  memcpy(s + at, b, nb);
  s[at + nb] = '\0';
  return s;
}

static const uint32_t mask = IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |
                             IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF;

/* Watches the directory `rel` (relative to the root), not following a
 * symbolic link; with `report`, reports what it holds as created, and with -r
 * watches its subdirectories too. A directory that vanished meanwhile is
 * skipped. */
static void add_tree(const char *rel, int report) {
  char *full = join(root, rel);
  int wd = inotify_add_watch(ifd, full, mask | IN_ONLYDIR | IN_DONT_FOLLOW);
  if (wd < 0) {
    if (errno == ENOSPC) {
      fprintf(stderr, "watch: cannot watch %s: too many watches (fs.inotify.max_user_watches)\n",
              full);
      exit(EXIT_FAIL);
    }
    free(full);
    return; /* gone, or not a directory any more */
  }
  struct watch *w = find(wd);
  if (w) { /* the same directory again (moved back in): its new name */
    free(w->rel);
    w->rel = join(rel, "");
  } else {
    if (n_watches == cap_watches) {
      cap_watches = cap_watches ? cap_watches * 2 : 64;
      watches = realloc(watches, cap_watches * sizeof *watches);
      if (!watches) {
        fputs("watch: out of memory\n", stderr);
        exit(EXIT_FAIL);
      }
    }
    watches[n_watches].wd = wd;
    watches[n_watches].rel = join(rel, "");
    ++n_watches;
  }
  int dfd = open(full, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  free(full);
  if (dfd < 0)
    return;
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    char *child = join(rel, e->d_name);
    if (report)
      record("create", child);
    int is_dir = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN) {
      struct stat st;
      is_dir = fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    if (recursive && is_dir)
      add_tree(child, report);
    free(child);
  }
  closedir(d);
}

/* Forgets the watches of `rel` and everything under it (moved away). */
static void drop_tree(const char *rel) {
  size_t n = strlen(rel);
  for (size_t i = 0; i < n_watches;) {
    const char *r = watches[i].rel;
    if (!strcmp(r, rel) || (!strncmp(r, rel, n) && r[n] == '/')) {
      inotify_rm_watch(ifd, watches[i].wd);
      free(watches[i].rel);
      watches[i] = watches[--n_watches];
      continue;
    }
    ++i;
  }
}

static void forget(int wd) {
  for (size_t i = 0; i < n_watches; ++i)
    if (watches[i].wd == wd) {
      free(watches[i].rel);
      watches[i] = watches[--n_watches];
      return;
    }
}

/* ---- main ------------------------------------------------------------------- */

int main(int argc, char **argv) {
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; ++i) {
    if (!strcmp(argv[i], "-r"))
      recursive = 1;
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--")) {
      ++i;
      break;
    } else {
      fprintf(stderr, "watch: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return EXIT_USAGE;
    }
  }
  if (argc - i != 1 || argv[i][0] == '\0') {
    usage(stderr);
    return EXIT_USAGE;
  }
  root = argv[i];
  signal(SIGPIPE, SIG_DFL);

  struct stat st;
  if (stat(root, &st) != 0) {
    if (errno == ENOENT) {
      fprintf(stderr, "%s\n", root);
      return EXIT_NOT_FOUND;
    }
    fprintf(stderr, "watch: cannot stat %s: %s\n", root, strerror(errno));
    return EXIT_FAIL;
  }
  if (!S_ISDIR(st.st_mode)) {
    fprintf(stderr, "%s\n", root);
    return EXIT_NOT_DIR;
  }
  ifd = inotify_init1(IN_CLOEXEC);
  if (ifd < 0) {
    fprintf(stderr, "watch: cannot start watching: %s%s\n", strerror(errno),
            errno == EMFILE ? " (fs.inotify.max_user_instances)" : "");
    return EXIT_FAIL;
  }
  /* The root itself may be a symbolic link to a directory: followed. */
  int wd = inotify_add_watch(ifd, root, mask | IN_ONLYDIR);
  if (wd < 0) {
    fprintf(stderr, "watch: cannot watch %s: %s\n", root, strerror(errno));
    return errno == ENOENT ? EXIT_NOT_FOUND : errno == ENOTDIR ? EXIT_NOT_DIR : EXIT_FAIL;
  }
  watches = calloc(64, sizeof *watches);
  cap_watches = 64;
  watches[0].wd = wd;
  watches[0].rel = join("", "");
  n_watches = 1;
  if (recursive) {
    /* The subdirectories that exist now; not reported. */
    DIR *d = opendir(root);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
        continue;
      int is_dir = e->d_type == DT_DIR;
      if (e->d_type == DT_UNKNOWN)
        is_dir = fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
      if (is_dir)
        add_tree(e->d_name, 0);
    }
    if (d)
      closedir(d);
  }
  record("ready", NULL);
  flush();

  char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));
  for (;;) {
    ssize_t n = read(ifd, buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      fprintf(stderr, "watch: cannot read events: %s\n", strerror(errno));
      return EXIT_FAIL;
    }
    for (char *p = buf; p < buf + n;) {
      const struct inotify_event *ev = (const struct inotify_event *)p;
      p += sizeof *ev + ev->len;
      if (ev->mask & IN_Q_OVERFLOW) {
        record("overflow", NULL);
        continue;
      }
      struct watch *w = find(ev->wd);
      if (!w)
        continue;
      int is_root = w->rel[0] == '\0';
      if (ev->mask & IN_IGNORED) {
        forget(ev->wd);
        if (is_root) {
          flush();
          return 0;
        }
        continue;
      }
      if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
        /* A subdirectory's own end is its parent's remove or rename. */
        if (is_root) {
          record(ev->mask & IN_DELETE_SELF ? "remove" : "rename", "");
          flush();
          return 0;
        }
        continue;
      }
      char *name = join(w->rel, ev->len ? ev->name : "");
      if (recursive && (ev->mask & IN_ISDIR) && (ev->mask & (IN_CREATE | IN_MOVED_TO)) &&
          watched(name)) {
        /* Found and reported by the scan of a new parent (mkdir -p). */
        free(name);
        continue;
      }
      const char *type = NULL;
      if (ev->mask & (IN_CREATE | IN_MOVED_TO))
        type = "create";
      else if (ev->mask & IN_MODIFY)
        type = "write";
      else if (ev->mask & IN_DELETE)
        type = "remove";
      else if (ev->mask & IN_MOVED_FROM)
        type = "rename";
      else if (ev->mask & IN_ATTRIB)
        type = "chmod";
      if (type)
        record(type, name);
      if (recursive && (ev->mask & IN_ISDIR)) {
        if (ev->mask & (IN_CREATE | IN_MOVED_TO))
          add_tree(name, 1);
        else if (ev->mask & IN_MOVED_FROM)
          drop_tree(name);
      }
      free(name);
    }
    flush();
  }
}

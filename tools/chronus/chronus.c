/* chronus: the agent's side of Chronus, run inside a dsec sandbox. A static binary
 * (the sandbox's base may have no libc) over chronus.h; see usage() for the verbs
 * and the exit statuses. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chronus.h"

enum { EXIT_USAGE = 2 };

static void usage(FILE *out) {
  fputs(
      "usage: chronus VERB [ARGS...]\n"
      "Talks to the training session from inside a dsec sandbox. Each verb sends one\n"
      "message to the node and waits for its answer.\n"
      "\n"
      "verbs:\n"
      "  stage NAME             the agent entered stage NAME (1-128 printable ASCII bytes)\n"
      "  report KEY=VALUE...    records metrics: 1-64 of them, each KEY 1-128 printable\n"
      "                         ASCII bytes (unique), each VALUE a finite number\n"
      "  log TEXT...            sends one log line: the TEXT arguments joined by spaces\n"
      "                         (UTF-8, at most 16 KiB)\n"
      "  feedback [--timeout DUR] [PAYLOAD | -]\n"
      "                         asks the trainer for feedback with PAYLOAD (or stdin with\n"
      "                         '-'; nothing without it; at most 32 KiB) and waits for the\n"
      "                         answer. It prints one line of JSON:\n"
      "                           {\"request_id\":N,\"reward\":R,\"done\":true|false,\n"
      "                            \"text\":\"...\",\"data\":\"...\"}\n"
      "                         (bytes of text and data that are not UTF-8 appear as\n"
      "                         \\u00XX escapes)\n"
      "    --timeout DUR        give up after DUR: a number with a unit ms, s, m or h\n"
      "                         (a bare number is seconds); 0, the default, waits for as\n"
      "                         long as the session lives\n"
      "\n"
      "options:\n"
      "  -h, --help             this text (also after a verb)\n"
      "\n"
      "Only trusted commands (dsec exec --trusted) can: they hold the sandbox's\n"
      "trusted channel, which dsec gives no other process.\n"
      "\n"
      "environment:\n"
      "  CHRONUS_FD             the trusted channel's descriptor (dsec sets it to 3 in\n"
      "                         trusted commands; keep fd 3 open for chronus)\n"
      "  CHRONUS_SOCKET         without CHRONUS_FD: the socket to use (default\n"
      "                         " CHRONUS_DEFAULT_SOCKET "), with the token in\n"
      "  DSEC_CHRONUS_TOKEN     (64 hex characters; dsec gives it to no process, so the\n"
      "                         node refuses what comes this way)\n"
      "\n"
      "exit status:\n"
      "  0  the node accepted the message; for feedback, the trainer answered\n"
      "  1  any other failure, e.g. no channel (message on stderr)\n"
      "  2  usage error\n"
      "  3  feedback: the timeout passed without an answer\n"
      "  4  the session is gone: nobody will answer\n"
      "  5  the node rejected the message (why on stderr)\n",
      out);
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
  va_list ap;
  fputs("chronus: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs(" (try 'chronus --help')\n", stderr);
  return EXIT_USAGE;
}

static int is_help(const char *a) { return !strcmp(a, "-h") || !strcmp(a, "--help"); }

/* Milliseconds in DUR ("30", "1.5s", "500ms", "2m", "1h"); -1 if it is not one or
 * is over UINT32_MAX ms. */
static int64_t parse_duration_ms(const char *s) {
  char *end;
  double v, scale;
  if (!*s || *s == '-' || *s == '+' || *s == ' ')
    return -1;
  errno = 0;
  v = strtod(s, &end);
  if (errno || end == s || !isfinite(v) || v < 0)
    return -1;
  if (!*end || !strcmp(end, "s"))
    scale = 1000;
  else if (!strcmp(end, "ms"))
    scale = 1;
  else if (!strcmp(end, "m"))
    scale = 60000;
  else if (!strcmp(end, "h"))
    scale = 3600000;
  else
    return -1;
  v *= scale;
  if (v > (double)UINT32_MAX)
    return -1;
  return (int64_t)(v + 0.5);
}

/* Prints len bytes as a JSON string: UTF-8 passes, other bytes become \u00XX. */
static void print_json_string(const unsigned char *p, size_t len) {
  size_t i = 0;
  putchar('"');
  while (i < len) {
    unsigned char c = p[i];
    size_t n = 0, k;
    if (c == '"' || c == '\\') {
      printf("\\%c", c);
      ++i;
      continue;
    }
    if (c == '\n') { fputs("\\n", stdout); ++i; continue; }
    if (c == '\t') { fputs("\\t", stdout); ++i; continue; }
    if (c == '\r') { fputs("\\r", stdout); ++i; continue; }
    if (c < 0x20 || c == 0x7f) {
      printf("\\u%04x", c);
      ++i;
      continue;
    }
    if (c < 0x80) {
      putchar(c);
      ++i;
      continue;
    }
    /* a well-formed UTF-8 sequence of n bytes, or a stray byte */
    if (c >= 0xc2 && c <= 0xdf)
      n = 2;
    else if (c >= 0xe0 && c <= 0xef)
      n = 3;
    else if (c >= 0xf0 && c <= 0xf4)
      n = 4;
    if (n && i + n <= len) {
      unsigned char b = p[i + 1];
      int ok = (c == 0xe0 ? b >= 0xa0 : c == 0xed ? b <= 0x9f
              : c == 0xf0 ? b >= 0x90 : c == 0xf4 ? b <= 0x8f : 1) && b >= 0x80 && b <= 0xbf;
      for (k = 2; ok && k < n; ++k)
        ok = p[i + k] >= 0x80 && p[i + k] <= 0xbf;
      if (ok) {
        fwrite(p + i, 1, n, stdout);
        i += n;
        continue;
      }
    }
    printf("\\u%04x", c);
    ++i;
  }
  putchar('"');
}

/* The shortest %g form that reads back as the same double; null if not finite. */
static void print_json_number(double v) {
  char buf[40];
  int prec;
  if (!isfinite(v)) {
    fputs("null", stdout);
    return;
  }
  for (prec = 1; prec <= 17; ++prec) {
    snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (strtod(buf, NULL) == v)
      break;
  }
  fputs(buf, stdout);
}

static int failed(const struct chronus *c, int rc) {
  fprintf(stderr, "chronus: %s\n", c->error);
  return rc;
}

static int connect_env(struct chronus *c) {
  if (chronus_open(c) != CHRONUS_OK) {
    fprintf(stderr, "chronus: %s\n", c->error);
    return CHRONUS_ERROR;
  }
  return CHRONUS_OK;
}

static int cmd_stage(int argc, char **argv) {
  struct chronus c;
  int rc;
  if (argc != 1)
    return usage_error("stage takes one NAME");
  if (connect_env(&c) != CHRONUS_OK)
    return 1;
  rc = chronus_stage(&c, argv[0]);
  chronus_close(&c);
  return rc == CHRONUS_OK ? 0 : failed(&c, rc);
}

static int cmd_report(int argc, char **argv) {
  struct chronus c;
  struct chronus_metric *m;
  int i, rc;
  if (argc < 1)
    return usage_error("report takes KEY=VALUE arguments");
  m = (struct chronus_metric *)calloc((size_t)argc, sizeof *m);
  if (!m) {
    fputs("chronus: out of memory\n", stderr);
    return 1;
  }
  for (i = 0; i < argc; ++i) {
    char *eq = strchr(argv[i], '='), *end;
    if (!eq || eq == argv[i] || !eq[1]) {
      free(m);
      return usage_error("'%s' is not KEY=VALUE", argv[i]);
    }
    *eq = 0;
    errno = 0;
    m[i].key = argv[i];
    m[i].value = strtod(eq + 1, &end);
    if (errno || *end || !isfinite(m[i].value)) {
      *eq = '=';
      free(m);
      return usage_error("the value in '%s' is not a finite number", argv[i]);
    }
  }
  if (connect_env(&c) != CHRONUS_OK) {
    free(m);
    return 1;
  }
  rc = chronus_report(&c, m, (size_t)argc);
  chronus_close(&c);
  free(m);
  return rc == CHRONUS_OK ? 0 : failed(&c, rc);
}

static int cmd_log(int argc, char **argv) {
  struct chronus c;
  size_t len = 0, at = 0;
  char *text;
  int i, rc;
  if (argc < 1)
    return usage_error("log takes TEXT");
  for (i = 0; i < argc; ++i)
    len += strlen(argv[i]) + 1;
  text = (char *)malloc(len);
  if (!text) {
    fputs("chronus: out of memory\n", stderr);
    return 1;
  }
  for (i = 0; i < argc; ++i) {
    size_t n = strlen(argv[i]);
    if (i)
      text[at++] = ' ';
    memcpy(text + at, argv[i], n);
    at += n;
  }
  if (connect_env(&c) != CHRONUS_OK) {
    free(text);
    return 1;
  }
  rc = chronus_log(&c, text, at);
  chronus_close(&c);
  free(text);
  return rc == CHRONUS_OK ? 0 : failed(&c, rc);
}

/* Reads all of stdin (at most CHRONUS_MAX_FRAME bytes) into a new buffer. */
static unsigned char *read_stdin(size_t *len) {
  unsigned char *buf = (unsigned char *)malloc(CHRONUS_MAX_FRAME + 1);
  size_t n = 0;
  if (!buf)
    return NULL;
  while (n <= CHRONUS_MAX_FRAME) {
    size_t got = fread(buf + n, 1, CHRONUS_MAX_FRAME + 1 - n, stdin);
    if (got == 0)
      break;
    n += got;
  }
  if (ferror(stdin) || n > CHRONUS_MAX_FRAME) {
    fprintf(stderr, "chronus: %s\n", ferror(stdin) ? "cannot read the payload from stdin"
                                                    : "the payload is over 64 KiB");
    free(buf);
    return NULL;
  }
  *len = n;
  return buf;
}

static int cmd_feedback(int argc, char **argv) {
  struct chronus c;
  struct chronus_reply r;
  const char *payload_arg = NULL;
  unsigned char *payload = NULL;
  size_t len = 0;
  uint32_t timeout_ms = 0;
  int i, rc;
  for (i = 0; i < argc; ++i) {
    if (!strcmp(argv[i], "--timeout") || !strncmp(argv[i], "--timeout=", 10)) {
      const char *v = argv[i][9] == '=' ? argv[i] + 10 : (i + 1 < argc ? argv[++i] : NULL);
      int64_t ms;
      if (!v)
        return usage_error("--timeout needs a duration");
      ms = parse_duration_ms(v);
      if (ms < 0)
        return usage_error("--timeout '%s' is not a duration such as 30s, 500ms or 2m", v);
      timeout_ms = (uint32_t)ms;
    } else if (!strcmp(argv[i], "--")) {
      if (i + 2 < argc || payload_arg)
        return usage_error("feedback takes one PAYLOAD");
      if (i + 1 < argc)
        payload_arg = argv[i + 1];
      break;
    } else if (argv[i][0] == '-' && argv[i][1] != 0) {
      return usage_error("unknown option '%s' for feedback", argv[i]);
    } else if (payload_arg) {
      return usage_error("feedback takes one PAYLOAD, not also '%s'", argv[i]);
    } else {
      payload_arg = argv[i];
    }
  }
  if (payload_arg && !strcmp(payload_arg, "-")) {
    payload = read_stdin(&len);
    if (!payload)
      return 1;
  } else if (payload_arg) {
    len = strlen(payload_arg);
  }
  if (connect_env(&c) != CHRONUS_OK) {
    free(payload);
    return 1;
  }
  rc = chronus_feedback(&c, payload ? (const void *)payload : (const void *)payload_arg, len,
                        timeout_ms, &r);
  chronus_close(&c);
  free(payload);
  if (rc != CHRONUS_OK) {
    chronus_reply_free(&r);
    return failed(&c, rc);
  }
  printf("{\"request_id\":%llu,\"reward\":", (unsigned long long)r.request_id);
  print_json_number(r.reward);
  printf(",\"done\":%s,\"text\":", r.done ? "true" : "false");
  print_json_string((const unsigned char *)r.text, r.text_len);
  fputs(",\"data\":", stdout);
  print_json_string(r.data, r.data_len);
  fputs("}\n", stdout);
  chronus_reply_free(&r);
  if (fflush(stdout) != 0) {
    fprintf(stderr, "chronus: cannot write the answer: %s\n", strerror(errno));
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *verb;
  int i;
  if (argc < 2) {
    usage(stderr);
    return EXIT_USAGE;
  }
  verb = argv[1];
  if (is_help(verb)) {
    usage(stdout);
    return 0;
  }
  for (i = 2; i < argc && strcmp(argv[i], "--"); ++i)
    if (is_help(argv[i])) {
      usage(stdout);
      return 0;
    }
  if (!strcmp(verb, "stage"))
    return cmd_stage(argc - 2, argv + 2);
  if (!strcmp(verb, "report"))
    return cmd_report(argc - 2, argv + 2);
  if (!strcmp(verb, "log"))
    return cmd_log(argc - 2, argv + 2);
  if (!strcmp(verb, "feedback"))
    return cmd_feedback(argc - 2, argv + 2);
  return usage_error("unknown verb '%s'", verb);
}

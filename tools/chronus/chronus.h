/* chronus.h: talk to the training session from inside a dsec sandbox.
 *
 * Header-only C99 (also compiles as C++), no library but libc: it writes the
 * Request frames of capnp/chronus.capnp by hand in Cap'n Proto's wire format (one
 * segment, unpacked) and reads Reply frames, so programs inside a sandbox need no
 * Cap'n Proto. The `chronus` command (chronus.c) is a thin main over it.
 *
 *   struct chronus c;
 *   if (chronus_open(&c) != CHRONUS_OK) { fprintf(stderr, "%s\n", c.error); ... }
 *   chronus_stage(&c, "test");
 *   struct chronus_metric m[] = {{"loss", 0.25}, {"acc", 0.9}};
 *   chronus_report(&c, m, 2);
 *   struct chronus_reply r;
 *   if (chronus_feedback(&c, "answer", 6, 30000, &r) == CHRONUS_OK)
 *     printf("reward %g\n", r.reward);
 *   chronus_reply_free(&r);
 *   chronus_close(&c);
 *
 * A trusted command (dsec exec --trusted) has its trusted channel at fd
 * $CHRONUS_FD (3): chronus_open() makes a fresh connection over it (a
 * socketpair, one end sent to the node with the bytes CHRONUS_CHANNEL_HELLO), so
 * that each call has its own and concurrent `chronus` processes never read each
 * other's replies. Nothing secret is involved: the channel is the credential,
 * and only trusted commands hold it. Without $CHRONUS_FD, chronus_open() uses
 * $CHRONUS_SOCKET (default /run/chronus.sock) with the token in
 * $DSEC_CHRONUS_TOKEN (64 hex characters); dsec gives no process that token, so
 * the node refuses every such frame (the way the agent's own attempts end).
 * Either way, SOCK_SEQPACKET: one Request per packet, answered by one Reply. The
 * node checks every field (see runtime/chronus.hpp for the limits) and answers a
 * bad one with `rejected` and a reason, which these functions return as
 * CHRONUS_REJECTED with the reason in c.error. One call at a time per connection
 * (each waits for its reply).
 *
 * The frame layouts below follow the schema's field numbers, which are frozen; the
 * test suite checks them against the real Cap'n Proto decoder and encoder
 * (test/chronus/client.test.cpp).
 */
#ifndef DSEC_CHRONUS_H
#define DSEC_CHRONUS_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CHRONUS_MAX_FRAME 65536 /* bytes, either direction */
#define CHRONUS_TOKEN_SIZE 32   /* bytes; 64 hex characters */
#define CHRONUS_DEFAULT_SOCKET "/run/chronus.sock"
/* What opens a connection over the trusted channel (runtime/chronus.hpp's
 * chronus_channel_hello): these bytes, without the NUL, one end of a socketpair
 * attached. */
#define CHRONUS_CHANNEL_HELLO "dsec-chronus-connect"

/* What the calls return. The positive values are also the exit statuses of the
 * `chronus` command. */
enum chronus_status {
  CHRONUS_OK = 0,           /* acknowledged; or feedback arrived */
  CHRONUS_ERROR = 1,        /* anything else: c->error says what (errno is kept) */
  CHRONUS_TIMED_OUT = 3,    /* the feedback request's timeout passed unanswered */
  CHRONUS_SESSION_GONE = 4, /* the session ended: nobody will answer */
  CHRONUS_REJECTED = 5      /* the node refused the request: c->error says why */
};

/* Reply kinds: the union tags of Reply in capnp/chronus.capnp. */
enum chronus_reply_kind {
  CHRONUS_REPLY_ACK = 0,
  CHRONUS_REPLY_FEEDBACK = 1,
  CHRONUS_REPLY_REJECTED = 2,
  CHRONUS_REPLY_TIMED_OUT = 3,
  CHRONUS_REPLY_SESSION_GONE = 4
};

struct chronus_metric {
  const char *key; /* NUL-terminated: 1..128 bytes of printable ASCII */
  double value;    /* finite */
};

/* A decoded Reply. The pointers point into the frame it was decoded from (for a
 * reply of chronus_feedback, a buffer that chronus_reply_free releases). */
struct chronus_reply {
  int kind;                  /* enum chronus_reply_kind */
  uint64_t request_id;       /* feedback: the request it answers */
  double reward;             /* feedback */
  int done;                  /* feedback: 1 when the episode is over */
  const char *text;          /* feedback: NUL-terminated; text_len excludes the NUL */
  size_t text_len;
  const unsigned char *data; /* feedback: opaque bytes */
  size_t data_len;
  const char *reason;        /* rejected: NUL-terminated; reason_len excludes the NUL */
  size_t reason_len;
  unsigned char *owned_;     /* the frame, when the reply owns it */
};

/* A connection to the node. */
struct chronus {
  int fd;                                  /* -1 when closed */
  unsigned char token[CHRONUS_TOKEN_SIZE]; /* the sandbox's token */
  char error[256];                         /* why the last call failed (or the reason
                                              of a rejection) */
};

/* ---- little-endian words --------------------------------------------------- */

static inline void chronus_put64_(unsigned char *p, uint64_t v) {
  int i;
  for (i = 0; i < 8; ++i)
    p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint64_t chronus_get64_(const unsigned char *p) {
  uint64_t v = 0;
  int i;
  for (i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

static inline uint64_t chronus_f64_bits_(double d) {
  uint64_t v;
  memcpy(&v, &d, sizeof v);
  return v;
}

/* Words needed for n bytes. */
static inline size_t chronus_words_(size_t n) { return (n + 7) / 8; }

/* A struct pointer at word `at` to a struct at word `target` (target > at). */
static inline uint64_t chronus_struct_ptr_(size_t at, size_t target, unsigned data_words,
                                           unsigned ptr_words) {
  uint64_t offset = (uint64_t)(target - at - 1);
  return (offset << 2) | ((uint64_t)data_words << 32) | ((uint64_t)ptr_words << 48);
}

/* A list pointer at word `at` to a list at word `target`: element size code
 * (2: bytes, 7: inline composite) and count (elements; words for composite). */
static inline uint64_t chronus_list_ptr_(size_t at, size_t target, unsigned size_code,
                                         uint64_t count) {
  uint64_t offset = (uint64_t)(target - at - 1);
  return 1u | (offset << 2) | ((uint64_t)size_code << 32) | (count << 35);
}

/* ---- encoding Requests ----------------------------------------------------- */
/* Each encoder writes one Request frame to out when it fits in cap bytes and
 * returns its size either way (call it with out NULL and cap 0 to learn the
 * size); (size_t)-1 means no frame could hold it. Nothing else is checked here:
 * the node checks the fields.
 *
 * Segment layout (word numbers within the segment, after the 8-byte table):
 *   0      root pointer -> Request at 1 (1 data word, 2 pointers)
 *   1      Request data: union tag (stage 0, report 1, log 2, feedback 3)
 *   2      token pointer -> 32 bytes at 4
 *   3      union pointer -> body at 8
 *   4..7   token
 *   8..    body: Text bytes and NUL; or FeedbackAsk (timeoutMs, payload pointer,
 *          payload); or the Metric list (tag word, n x {value, key pointer}, keys) */

enum { CHRONUS_TAG_STAGE_ = 0, CHRONUS_TAG_REPORT_ = 1, CHRONUS_TAG_LOG_ = 2,
       CHRONUS_TAG_FEEDBACK_ = 3 };

/* Writes the table, the root and the token for a segment of `words` words. */
static inline void chronus_head_(unsigned char *out, size_t words, unsigned tag,
                                 const unsigned char token[CHRONUS_TOKEN_SIZE]) {
  unsigned char *s = out + 8;
  memset(out, 0, 8 + words * 8);
  /* segment table: (segments - 1) = 0, then the segment's size in words */
  out[4] = (unsigned char)words;
  out[5] = (unsigned char)(words >> 8);
  out[6] = (unsigned char)(words >> 16);
  out[7] = (unsigned char)(words >> 24);
  chronus_put64_(s + 0 * 8, chronus_struct_ptr_(0, 1, 1, 2));
  chronus_put64_(s + 1 * 8, (uint64_t)tag);
  chronus_put64_(s + 2 * 8, chronus_list_ptr_(2, 4, 2, CHRONUS_TOKEN_SIZE));
  memcpy(s + 4 * 8, token, CHRONUS_TOKEN_SIZE);
}

static inline size_t chronus_encode_text_(unsigned char *out, size_t cap, unsigned tag,
                                          const unsigned char token[CHRONUS_TOKEN_SIZE],
                                          const char *text, size_t len) {
  size_t words, size;
  if (len > CHRONUS_MAX_FRAME)
    return (size_t)-1;
  words = 8 + chronus_words_(len + 1);
  size = 8 + 8 * words;
  if (!out || size > cap)
    return size;
  chronus_head_(out, words, tag, token);
  chronus_put64_(out + 8 + 3 * 8, chronus_list_ptr_(3, 8, 2, (uint64_t)len + 1));
  if (len)
    memcpy(out + 8 + 8 * 8, text, len); /* the NUL is already there */
  return size;
}

/* Request.stage: the agent entered stage `name` (len bytes). */
static inline size_t chronus_encode_stage(unsigned char *out, size_t cap,
                                          const unsigned char token[CHRONUS_TOKEN_SIZE],
                                          const char *name, size_t len) {
  return chronus_encode_text_(out, cap, CHRONUS_TAG_STAGE_, token, name, len);
}

/* Request.log: one log line of len bytes. */
static inline size_t chronus_encode_log(unsigned char *out, size_t cap,
                                        const unsigned char token[CHRONUS_TOKEN_SIZE],
                                        const char *text, size_t len) {
  return chronus_encode_text_(out, cap, CHRONUS_TAG_LOG_, token, text, len);
}

/* Request.report: n metrics. */
static inline size_t chronus_encode_report(unsigned char *out, size_t cap,
                                           const unsigned char token[CHRONUS_TOKEN_SIZE],
                                           const struct chronus_metric *metrics, size_t n) {
  size_t words = 8 + 1 + 2 * n, i, key_at, size;
  unsigned char *s;
  if (n > CHRONUS_MAX_FRAME)
    return (size_t)-1;
  for (i = 0; i < n; ++i) {
    words += chronus_words_(strlen(metrics[i].key) + 1);
    if (words > CHRONUS_MAX_FRAME) /* keep the sums small; the frame is too large */
      return (size_t)-1;
  }
  size = 8 + 8 * words;
  if (!out || size > cap)
    return size;
  s = out + 8;
  chronus_head_(out, words, CHRONUS_TAG_REPORT_, token);
  /* an inline-composite list: its pointer counts words, its tag word counts
   * elements (in the offset field) and gives each element's size */
  chronus_put64_(s + 3 * 8, chronus_list_ptr_(3, 8, 7, 2 * (uint64_t)n));
  chronus_put64_(s + 8 * 8, ((uint64_t)n << 2) | ((uint64_t)1 << 32) | ((uint64_t)1 << 48));
  key_at = 9 + 2 * n;
  for (i = 0; i < n; ++i) {
    size_t elem = 9 + 2 * i, len = strlen(metrics[i].key);
    chronus_put64_(s + elem * 8, chronus_f64_bits_(metrics[i].value));
    chronus_put64_(s + (elem + 1) * 8, chronus_list_ptr_(elem + 1, key_at, 2, (uint64_t)len + 1));
    memcpy(s + key_at * 8, metrics[i].key, len);
    key_at += chronus_words_(len + 1);
  }
  return size;
}

/* Request.feedback: ask the trainer, with `len` bytes of payload; timeout_ms 0
 * waits as long as the session lives. */
static inline size_t chronus_encode_feedback(unsigned char *out, size_t cap,
                                             const unsigned char token[CHRONUS_TOKEN_SIZE],
                                             const void *payload, size_t len,
                                             uint32_t timeout_ms) {
  size_t words, size;
  unsigned char *s;
  if (len > CHRONUS_MAX_FRAME)
    return (size_t)-1;
  words = 8 + 2 + chronus_words_(len);
  size = 8 + 8 * words;
  if (!out || size > cap)
    return size;
  s = out + 8;
  chronus_head_(out, words, CHRONUS_TAG_FEEDBACK_, token);
  chronus_put64_(s + 3 * 8, chronus_struct_ptr_(3, 8, 1, 1));
  chronus_put64_(s + 8 * 8, (uint64_t)timeout_ms);
  if (len) {
    chronus_put64_(s + 9 * 8, chronus_list_ptr_(9, 10, 2, (uint64_t)len));
    memcpy(s + 10 * 8, payload, len);
  }
  return size;
}

/* ---- decoding Replies ------------------------------------------------------ */

/* Resolves the pointer at word `at` of segment s (`words` long). Returns 0 and
 * the target, or -1 when the pointer is not of `type` (0 struct, 1 list) or
 * points outside the segment. A null pointer gives *target = (size_t)-1. */
static inline int chronus_resolve_(const unsigned char *s, size_t words, size_t at,
                                   unsigned type, size_t *target, uint64_t *word) {
  uint64_t w = chronus_get64_(s + at * 8);
  int64_t offset, t;
  *word = w;
  if (w == 0) {
    *target = (size_t)-1;
    return 0;
  }
  if ((w & 3) != type) /* far pointers (multi-segment) and capabilities too */
    return -1;
  offset = (int64_t)((w >> 2) & 0x3fffffff); /* a signed 30-bit word offset */
  if (offset & 0x20000000)
    offset -= 0x40000000;
  t = (int64_t)at + 1 + offset;
  if (t < 0 || t > (int64_t)words)
    return -1;
  *target = (size_t)t;
  return 0;
}

/* A byte list (Text when `text`: its last byte must be NUL) at pointer `at`. */
static inline int chronus_bytes_(const unsigned char *s, size_t words, size_t at, int text,
                                 const unsigned char **p, size_t *len) {
  static const unsigned char empty[1] = {0};
  size_t t;
  uint64_t w, count;
  if (chronus_resolve_(s, words, at, 1, &t, &w) != 0)
    return -1;
  if (t == (size_t)-1) { /* null: an empty text or data */
    *p = empty;
    *len = 0;
    return 0;
  }
  if (((w >> 32) & 7) != 2) /* element size: byte */
    return -1;
  count = w >> 35;
  if (chronus_words_(count) > words - t)
    return -1;
  if (text) {
    if (count == 0 || s[t * 8 + count - 1] != 0)
      return -1;
    --count;
  }
  *p = s + t * 8;
  *len = (size_t)count;
  return 0;
}

/* A struct at pointer `at`: *t and its section sizes (a null pointer: all zero). */
static inline int chronus_struct_(const unsigned char *s, size_t words, size_t at,
                                  size_t *t, size_t *data_words, size_t *ptr_words) {
  uint64_t w;
  if (chronus_resolve_(s, words, at, 0, t, &w) != 0)
    return -1;
  if (*t == (size_t)-1) {
    *data_words = *ptr_words = 0;
    return 0;
  }
  *data_words = (size_t)((w >> 32) & 0xffff);
  *ptr_words = (size_t)(w >> 48);
  if (*data_words + *ptr_words > words - *t)
    return -1;
  return 0;
}

/* Decodes one Reply frame of len bytes into *out (its pointers point into frame).
 * Returns 0, or -1 when the bytes are not a Reply this header understands: wrong
 * framing, more than one segment, pointers out of bounds or of the wrong kind, an
 * unknown union tag. */
static inline int chronus_decode_reply(const unsigned char *frame, size_t len,
                                       struct chronus_reply *out) {
  const unsigned char *s = frame + 8, *p;
  size_t words, root, dw, pw, fb, fdw, fpw, n;
  unsigned tag = 0;
  memset(out, 0, sizeof *out);
  if (len < 16 || len % 8 != 0 || len > CHRONUS_MAX_FRAME)
    return -1;
  if (chronus_get64_(frame) & 0xffffffffu) /* segment count - 1: one segment only */
    return -1;
  words = (size_t)(chronus_get64_(frame) >> 32);
  if (words != len / 8 - 1)
    return -1;
  if (chronus_struct_(s, words, 0, &root, &dw, &pw) != 0)
    return -1;
  if (dw >= 1)
    tag = (unsigned)(chronus_get64_(s + root * 8) & 0xffff);
  out->kind = (int)tag;
  switch (tag) {
    case CHRONUS_REPLY_ACK:
    case CHRONUS_REPLY_TIMED_OUT:
    case CHRONUS_REPLY_SESSION_GONE:
      return 0;
    case CHRONUS_REPLY_REJECTED:
      if (pw < 1) {
        out->reason = "";
        return 0;
      }
      if (chronus_bytes_(s, words, root + dw, 1, &p, &n) != 0)
        return -1;
      out->reason = (const char *)p;
      out->reason_len = n;
      return 0;
    case CHRONUS_REPLY_FEEDBACK:
      out->text = "";
      out->data = (const unsigned char *)"";
      if (pw < 1)
        return 0;
      if (chronus_struct_(s, words, root + dw, &fb, &fdw, &fpw) != 0)
        return -1;
      /* Feedback: requestId, reward, done (bit 128); text, data */
      if (fdw >= 1)
        out->request_id = chronus_get64_(s + fb * 8);
      if (fdw >= 2) {
        uint64_t bits = chronus_get64_(s + (fb + 1) * 8);
        memcpy(&out->reward, &bits, sizeof bits);
      }
      if (fdw >= 3)
        out->done = (int)(s[(fb + 2) * 8] & 1);
      if (fpw >= 1) {
        if (chronus_bytes_(s, words, fb + fdw, 1, &p, &n) != 0)
          return -1;
        out->text = (const char *)p;
        out->text_len = n;
      }
      if (fpw >= 2) {
        if (chronus_bytes_(s, words, fb + fdw + 1, 0, &p, &n) != 0)
          return -1;
        out->data = p;
        out->data_len = n;
      }
      return 0;
    default:
      return -1;
  }
}

/* Releases what chronus_feedback left in *r (safe on a zeroed reply, and twice). */
static inline void chronus_reply_free(struct chronus_reply *r) {
  free(r->owned_);
  r->owned_ = NULL;
}

/* ---- the connection --------------------------------------------------------- */

/* Parses 64 hex characters into a token; 0, or -1 if they are not. */
static inline int chronus_parse_token(const char *hex, unsigned char out[CHRONUS_TOKEN_SIZE]) {
  size_t i;
  if (!hex || strlen(hex) != 2 * CHRONUS_TOKEN_SIZE)
    return -1;
  for (i = 0; i < 2 * CHRONUS_TOKEN_SIZE; ++i) {
    char c = hex[i];
    int v = c >= '0' && c <= '9' ? c - '0'
          : c >= 'a' && c <= 'f' ? c - 'a' + 10
          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (v < 0)
      return -1;
    if (i % 2 == 0)
      out[i / 2] = (unsigned char)(v << 4);
    else
      out[i / 2] = (unsigned char)(out[i / 2] | v);
  }
  return 0;
}

/* Connects to `socket_path` with the token `token_hex`. On failure c->fd is -1,
 * c->error says why and CHRONUS_ERROR is returned. */
static inline int chronus_connect(struct chronus *c, const char *socket_path,
                                  const char *token_hex) {
  struct sockaddr_un addr;
  int err;
  c->fd = -1;
  c->error[0] = 0;
  if (chronus_parse_token(token_hex, c->token) != 0) {
    snprintf(c->error, sizeof c->error,
             "the Chronus token is not 64 hex characters (is DSEC_CHRONUS_TOKEN set?)");
    errno = EINVAL;
    return CHRONUS_ERROR;
  }
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (strlen(socket_path) >= sizeof addr.sun_path) {
    snprintf(c->error, sizeof c->error, "socket path %.200s is too long", socket_path);
    errno = ENAMETOOLONG;
    return CHRONUS_ERROR;
  }
  memcpy(addr.sun_path, socket_path, strlen(socket_path));
  c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (c->fd < 0) {
    err = errno;
    snprintf(c->error, sizeof c->error, "socket: %s", strerror(err));
    errno = err;
    return CHRONUS_ERROR;
  }
  while (connect(c->fd, (const struct sockaddr *)&addr, sizeof addr) != 0) {
    if (errno == EINTR)
      continue;
    err = errno;
    snprintf(c->error, sizeof c->error, "cannot connect to the Chronus socket %.200s: %s",
             socket_path, strerror(err));
    close(c->fd);
    c->fd = -1;
    errno = err;
    return CHRONUS_ERROR;
  }
  return CHRONUS_OK;
}

#ifndef SO_PEERCRED
#define SO_PEERCRED 17
#endif

/* The real endpoint is dsecd, outside the sandbox's pid namespace: seen from
 * inside, the peer's pid is 0. Anything listening at /run/chronus.sock from
 * inside the sandbox (the agent may replace the socket: it owns /run) has a
 * pid there, and would collect the token of every frame: refuse to talk to it. */
static inline int chronus_check_peer_(struct chronus *c, const char *socket_path) {
  struct {
    int pid;
    unsigned uid, gid;
  } cred;
  socklen_t len = sizeof cred;
  memset(&cred, 0, sizeof cred);
  if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid != 0) {
    snprintf(c->error, sizeof c->error,
             "%.200s is not dsec's Chronus socket: it is served from inside the sandbox "
             "(pid %d); refusing to send the token there", socket_path, cred.pid);
    close(c->fd);
    c->fd = -1;
    errno = EACCES;
    return CHRONUS_ERROR;
  }
  return CHRONUS_OK;
}

/* Opens a connection over the trusted channel `channel` (a trusted command's
 * fd 3): a fresh socketpair, whose one end goes to the node with
 * CHRONUS_CHANNEL_HELLO. The node serves it as a trusted connection: no token. */
static inline int chronus_open_channel(struct chronus *c, int channel) {
  int sv[2], type = 0, err;
  socklen_t len = sizeof type;
  struct msghdr msg;
  struct iovec iov;
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } control;
  struct cmsghdr *cm;
  ssize_t n;
  c->fd = -1;
  c->error[0] = 0;
  memset(c->token, 0, sizeof c->token);
  if (getsockopt(channel, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET) {
    err = errno;
    snprintf(c->error, sizeof c->error,
             "CHRONUS_FD=%d is not a Chronus channel (%s): is this a trusted command of a dsec "
             "sandbox with Chronus, and was its fd %d left open?", channel,
             type ? "not a SOCK_SEQPACKET socket" : strerror(err), channel);
    errno = EBADF;
    return CHRONUS_ERROR;
  }
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    err = errno;
    snprintf(c->error, sizeof c->error, "socketpair: %s", strerror(err));
    errno = err;
    return CHRONUS_ERROR;
  }
  memset(&msg, 0, sizeof msg);
  memset(&control, 0, sizeof control);
  iov.iov_base = (void *)CHRONUS_CHANNEL_HELLO;
  iov.iov_len = sizeof CHRONUS_CHANNEL_HELLO - 1;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.buf;
  msg.msg_controllen = sizeof control.buf;
  cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &sv[1], sizeof(int));
  while ((n = sendmsg(channel, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
  }
  err = errno;
  close(sv[1]);
  if (n < 0) {
    close(sv[0]);
    snprintf(c->error, sizeof c->error, "cannot open a connection over the Chronus channel: %s",
             err == EPIPE || err == ECONNRESET ? "the node closed it" : strerror(err));
    errno = err;
    return CHRONUS_ERROR;
  }
  c->fd = sv[0];
  return CHRONUS_OK;
}

/* Connects as the environment says: over the trusted channel at fd $CHRONUS_FD
 * when it is set (a trusted command), else to $CHRONUS_SOCKET (default
 * /run/chronus.sock) with $DSEC_CHRONUS_TOKEN. On the default socket it checks
 * that the listener is dsec's, outside the sandbox (see chronus_check_peer_). */
static inline int chronus_open(struct chronus *c) {
  const char *channel = getenv("CHRONUS_FD");
  const char *path = getenv("CHRONUS_SOCKET");
  const char *token = getenv("DSEC_CHRONUS_TOKEN");
  if (channel && *channel) {
    char *end;
    long fd;
    errno = 0;
    fd = strtol(channel, &end, 10);
    if (errno || *end || fd < 0 || fd > 1 << 20) {
      c->fd = -1;
      snprintf(c->error, sizeof c->error, "CHRONUS_FD '%.32s' is not a descriptor number",
               channel);
      errno = EINVAL;
      return CHRONUS_ERROR;
    }
    return chronus_open_channel(c, (int)fd);
  }
  if (!path || !*path)
    path = CHRONUS_DEFAULT_SOCKET;
  if (!token || !*token) {
    c->fd = -1;
    if (access(path, F_OK) != 0)
      snprintf(c->error, sizeof c->error,
               "no Chronus channel: CHRONUS_FD is not set, and there is no Chronus socket at "
               "%.100s: this sandbox was created without Chronus (chronus=True, --chronus)",
               path);
    else
      snprintf(c->error, sizeof c->error,
               "no Chronus channel: CHRONUS_FD is not set: this command is not trusted; only a "
               "command run as trusted (trusted=True, `dsec exec --trusted`) may talk to Chronus");
    errno = EINVAL;
    return CHRONUS_ERROR;
  }
  if (chronus_connect(c, path, token) != CHRONUS_OK)
    return CHRONUS_ERROR;
  if (strcmp(path, CHRONUS_DEFAULT_SOCKET) == 0)
    return chronus_check_peer_(c, path);
  return CHRONUS_OK;
}

static inline void chronus_close(struct chronus *c) {
  if (c->fd >= 0)
    close(c->fd);
  c->fd = -1;
}

/* Sends the frame, then receives the reply into a new buffer (kept by *r). */
static inline int chronus_exchange_(struct chronus *c, const unsigned char *frame, size_t len,
                                    struct chronus_reply *r) {
  unsigned char *buf;
  struct iovec iov;
  struct msghdr msg;
  ssize_t n;
  int err;
  memset(r, 0, sizeof *r);
  if (c->fd < 0) {
    snprintf(c->error, sizeof c->error, "not connected");
    errno = EBADF;
    return CHRONUS_ERROR;
  }
  while ((n = send(c->fd, frame, len, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
  }
  if (n < 0) {
    err = errno;
    snprintf(c->error, sizeof c->error, "send to the Chronus socket: %s", strerror(err));
    errno = err;
    return CHRONUS_ERROR;
  }
  buf = (unsigned char *)malloc(CHRONUS_MAX_FRAME);
  if (!buf) {
    snprintf(c->error, sizeof c->error, "out of memory");
    errno = ENOMEM;
    return CHRONUS_ERROR;
  }
  memset(&msg, 0, sizeof msg);
  iov.iov_base = buf;
  iov.iov_len = CHRONUS_MAX_FRAME;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  while ((n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
  }
  if (n <= 0) {
    err = n == 0 ? ECONNRESET : errno;
    if (n == 0)
      snprintf(c->error, sizeof c->error, "the node closed the Chronus connection");
    else
      snprintf(c->error, sizeof c->error, "receive from the Chronus socket: %s",
               strerror(err));
    free(buf);
    errno = err;
    return CHRONUS_ERROR;
  }
  if ((msg.msg_flags & MSG_TRUNC) || chronus_decode_reply(buf, (size_t)n, r) != 0) {
    snprintf(c->error, sizeof c->error, "the node's reply is malformed (%zd bytes%s)", n,
             (msg.msg_flags & MSG_TRUNC) ? ", truncated" : "");
    free(buf);
    memset(r, 0, sizeof *r);
    errno = EPROTO;
    return CHRONUS_ERROR;
  }
  r->owned_ = buf;
  return CHRONUS_OK;
}

/* Maps a reply to a status; `want` is the kind that means success. */
static inline int chronus_status_of_(struct chronus *c, const struct chronus_reply *r,
                                     int want) {
  if (r->kind == want)
    return CHRONUS_OK;
  switch (r->kind) {
    case CHRONUS_REPLY_REJECTED:
      snprintf(c->error, sizeof c->error, "rejected: %.*s",
               (int)(r->reason_len > 240 ? 240 : r->reason_len), r->reason);
      return CHRONUS_REJECTED;
    case CHRONUS_REPLY_SESSION_GONE:
      snprintf(c->error, sizeof c->error, "the session is gone");
      return CHRONUS_SESSION_GONE;
    case CHRONUS_REPLY_TIMED_OUT:
      if (want == CHRONUS_REPLY_FEEDBACK) {
        snprintf(c->error, sizeof c->error, "timed out waiting for feedback");
        return CHRONUS_TIMED_OUT;
      }
      break;
    default:
      break;
  }
  snprintf(c->error, sizeof c->error, "the node answered with an unexpected reply (kind %d)",
           r->kind);
  errno = EPROTO;
  return CHRONUS_ERROR;
}

/* Sends `frame` (and frees it), waits for the reply, maps it to a status; the
 * reply goes to *out when out is not NULL. */
static inline int chronus_call_(struct chronus *c, unsigned char *frame, size_t size,
                                int want, struct chronus_reply *out) {
  struct chronus_reply r;
  int rc = chronus_exchange_(c, frame, size, &r);
  free(frame);
  if (rc != CHRONUS_OK)
    return rc;
  rc = chronus_status_of_(c, &r, want);
  if (out)
    *out = r; /* the caller frees it */
  else
    chronus_reply_free(&r);
  return rc;
}

static inline unsigned char *chronus_frame_buf_(struct chronus *c, size_t size) {
  unsigned char *buf;
  if (size > CHRONUS_MAX_FRAME) {
    snprintf(c->error, sizeof c->error, "the request does not fit in a %d-byte frame",
             CHRONUS_MAX_FRAME);
    errno = EMSGSIZE;
    return NULL;
  }
  buf = (unsigned char *)malloc(size);
  if (!buf) {
    snprintf(c->error, sizeof c->error, "out of memory");
    errno = ENOMEM;
  }
  return buf;
}

/* Tells the session the agent entered stage `name` (NUL-terminated). */
static inline int chronus_stage(struct chronus *c, const char *name) {
  size_t size = chronus_encode_stage(NULL, 0, c->token, name, strlen(name));
  unsigned char *buf = chronus_frame_buf_(c, size);
  if (!buf)
    return CHRONUS_ERROR;
  chronus_encode_stage(buf, size, c->token, name, strlen(name));
  return chronus_call_(c, buf, size, CHRONUS_REPLY_ACK, NULL);
}

/* Sends one log line of len bytes. */
static inline int chronus_log(struct chronus *c, const char *text, size_t len) {
  size_t size = chronus_encode_log(NULL, 0, c->token, text, len);
  unsigned char *buf = chronus_frame_buf_(c, size);
  if (!buf)
    return CHRONUS_ERROR;
  chronus_encode_log(buf, size, c->token, text, len);
  return chronus_call_(c, buf, size, CHRONUS_REPLY_ACK, NULL);
}

/* Reports n metrics. */
static inline int chronus_report(struct chronus *c, const struct chronus_metric *metrics,
                                 size_t n) {
  size_t size = chronus_encode_report(NULL, 0, c->token, metrics, n);
  unsigned char *buf = chronus_frame_buf_(c, size);
  if (!buf)
    return CHRONUS_ERROR;
  chronus_encode_report(buf, size, c->token, metrics, n);
  return chronus_call_(c, buf, size, CHRONUS_REPLY_ACK, NULL);
}

/* Asks the trainer for feedback and waits for the answer: CHRONUS_OK with *out
 * filled (free it with chronus_reply_free), CHRONUS_TIMED_OUT after timeout_ms (0:
 * no timeout), CHRONUS_SESSION_GONE, CHRONUS_REJECTED or CHRONUS_ERROR. *out is
 * always safe to free. */
static inline int chronus_feedback(struct chronus *c, const void *payload, size_t len,
                                   uint32_t timeout_ms, struct chronus_reply *out) {
  size_t size = chronus_encode_feedback(NULL, 0, c->token, payload, len, timeout_ms);
  unsigned char *buf;
  memset(out, 0, sizeof *out);
  buf = chronus_frame_buf_(c, size);
  if (!buf)
    return CHRONUS_ERROR;
  chronus_encode_feedback(buf, size, c->token, payload, len, timeout_ms);
  return chronus_call_(c, buf, size, CHRONUS_REPLY_FEEDBACK, out);
}

#ifdef __cplusplus
}
#endif

#endif /* DSEC_CHRONUS_H */

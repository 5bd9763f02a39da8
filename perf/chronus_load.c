/* chronus_load: runs inside a sandbox (static, C99) as a trusted command and
 * sends Chronus reports over one connection, each waiting for its ack:
 *
 *   chronus_load COUNT [PAUSE_US]
 *
 * Each report carries one metric, t0 = CLOCK_MONOTONIC (ns) just before the
 * send, so the trainer can compute the latency from the call in the sandbox to
 * its watch (the sandbox shares the host's monotonic clock). With PAUSE_US it
 * sleeps between reports (latency at low load); without, it sends as fast as
 * the acks come back (throughput). Prints nothing; exits 0, or the failing
 * call's status with its message on stderr. perf/chronus_bench.cpp drives it. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tools/chronus/chronus.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  struct chronus c;
  long count, pause_us = 0, i;
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: chronus_load COUNT [PAUSE_US]\n");
    return 2;
  }
  count = atol(argv[1]);
  if (argc == 3)
    pause_us = atol(argv[2]);
  if (chronus_open(&c) != CHRONUS_OK) {
    fprintf(stderr, "chronus_load: %s\n", c.error);
    return 1;
  }
  for (i = 0; i < count; ++i) {
    struct chronus_metric m;
    int rc;
    if (pause_us > 0) {
      struct timespec p;
      p.tv_sec = pause_us / 1000000;
      p.tv_nsec = (pause_us % 1000000) * 1000;
      nanosleep(&p, NULL);
    }
    m.key = "t0";
    m.value = now_ns();
    rc = chronus_report(&c, &m, 1);
    if (rc != CHRONUS_OK) {
      fprintf(stderr, "chronus_load: report %ld: %s\n", i, c.error);
      chronus_close(&c);
      return rc;
    }
  }
  chronus_close(&c);
  return 0;
}

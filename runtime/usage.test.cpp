#include <doctest/doctest.h>

#include <unistd.h>

#include "runtime/usage.hpp"

using dsec::parse_proc_stat;
using dsec::proc_stat;

TEST_CASE("parse_proc_stat: a command name with spaces and parentheses, the fields after it") {
  proc_stat p;
  // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt
  // cmajflt utime stime cutime cstime priority nice threads itrealvalue
  // starttime vsize rss ...
  REQUIRE(parse_proc_stat("42 (a) b (c)) S 7 42 42 0 -1 4194560 10 0 0 0 "
                          "150 25 300 40 20 0 3 0 12345 8192000 256 18446744073709551615\n",
                          p));
  CHECK(p.comm == "a) b (c)");
  CHECK(p.state == "S");
  CHECK(p.ppid == 7);
  CHECK(p.utime == 150);
  CHECK(p.stime == 25);
  CHECK(p.cutime == 300);
  CHECK(p.cstime == 40);
  CHECK(p.threads == 3);
  CHECK(p.start == 12345);
  CHECK(p.rss_pages == 256);
  CHECK_FALSE(parse_proc_stat("42 (short) S 1 2 3\n", p));
  CHECK_FALSE(parse_proc_stat("no parentheses at all", p));
}

TEST_CASE("read_sandbox_processes: a pid namespace's processes, found without a cgroup") {
  // Our own pid namespace stands in for a sandbox's, this process for its
  // init: the fallback walk of /proc finds it among those sharing it.
  dsec::resource_usage u;
  auto r = dsec::read_sandbox_processes(::getpid(), {}, &u);
  REQUIRE(r);
  bool me = false;
  for (const auto& p : *r)
    if (p.pid == ::getpid())
      me = p.state == "R" && !p.command.empty();
  CHECK(me);
  CHECK(u.processes == r->size());
  CHECK(u.tasks >= u.processes);
  CHECK(u.memory_bytes > 0);
  auto gone = dsec::read_sandbox_processes(0x3fffffff, {});
  CHECK_FALSE(gone);
}

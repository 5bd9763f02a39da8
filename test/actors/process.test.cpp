// Process handles (exec_request.handle; issues 20 and 23): a running command's
// id, its stdin streamed with back-pressure and closed, signals to it alone,
// its end, and cancelling it; through the session and by sandbox id, on an
// embedded daemon (test/actors/common.hpp). Waiting polls with a generous
// cap (eventually), never a timed assertion.
#include <doctest/doctest.h>

#include <signal.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/sha256.hpp"
#include "test/actors/common.hpp"
#include "test/support/host.hpp"

using namespace dsec;
using namespace dsec::test;

namespace {

std::unique_ptr<session> open_one(client& c) {
  auto s = c.open_session({}, true);
  REQUIRE_MESSAGE(s, "open_session: " << describe(s.error_value()));
  return std::move(*s);
}

std::string make_one(session& s) {
  auto ids = s.create(env_of(), 1);
  REQUIRE_MESSAGE(ids, "create: " << describe(ids.error_value()));
  REQUIRE(ids->size() == 1);
  return ids->front();
}

exec_request with_stdin(std::vector<std::string> argv) {
  auto r = cmd(std::move(argv));
  r.handle = true;
  r.open_stdin = true;
  r.timeout_ms = 300'000; // a safety net should a case hang, never a measure
  return r;
}

uint32_t running_in(client& c, const std::string& id) {
  for (const auto& i : node_list(c))
    if (i.id == id)
      return i.running;
  return 0;
}

} // namespace

TEST_CASE("a process handle: its id, stdin written in pieces and closed, then its end") {
  embedded n;
  auto s = open_one(*n.c);
  auto id = make_one(*s);
  auto check = [&](std::unique_ptr<process> p) {
    auto eid = p->id();
    REQUIRE_MESSAGE(eid, describe(eid.error_value()));
    CHECK(*eid > 0);
    CHECK(p->sandbox() == id);
    REQUIRE(p->write("hello\n"));
    // More than the daemon's buffer and the pipe together: written in pieces,
    // each taken as the command reads.
    std::string big(3 * stdin_buffer + 12345, 'x');
    REQUIRE(p->write(big));
    REQUIRE(p->close_stdin());
    auto r = p->wait();
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(r->exit_code == 0);
    CHECK(r->out == std::to_string(6 + big.size()) + "\n");
    // Its end is kept: wait() again gives it again.
    auto again = p->wait();
    REQUIRE(again);
    CHECK(again->out == r->out);
    // Nothing to feed or signal any more.
    auto w = p->write("late");
    REQUIRE_FALSE(w);
    CHECK(w.error_value().code == errc::closed);
  };
  SUBCASE("through the session") {
    check(s->start(id, with_stdin({"wc", "-c"})));
  }
  SUBCASE("by sandbox id") {
    check(n.c->start(id, with_stdin({"wc", "-c"})));
  }
  SUBCASE("input given up front comes first") {
    auto req = with_stdin({"cat"});
    req.input = "first ";
    auto p = s->start(id, req);
    REQUIRE(p->write("second"));
    REQUIRE(p->close_stdin());
    auto r = p->wait();
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(r->out == "first second");
  }
  SUBCASE("streamed output comes to on_output before the end") {
    std::mutex mu;
    std::string out;
    auto p = s->start(id, with_stdin({"cat"}), [&](uint8_t stream, std::string_view d) {
      std::lock_guard<std::mutex> g{mu};
      if (stream == 1)
        out += d;
    });
    REQUIRE(p->write("one\n"));
    // Output while the command still runs: it reads its stdin as it comes.
    CHECK(eventually([&] {
      std::lock_guard<std::mutex> g{mu};
      return out == "one\n";
    }));
    REQUIRE(p->write("two\n"));
    REQUIRE(p->close_stdin());
    auto r = p->wait();
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(r->out.empty()); // streamed, not collected
    std::lock_guard<std::mutex> g{mu};
    CHECK(out == "one\ntwo\n");
  }
}

TEST_CASE("stdin back-pressure: a command that does not read holds the writer, bounded") {
  embedded n;
  auto s = open_one(*n.c);
  auto id = make_one(*s);
  // It reads nothing until /tmp/go exists, then counts what it gets.
  auto p = s->start(id, with_stdin({"sh", "-c",
                                    "while [ ! -e /tmp/go ]; do sleep 0.05; done; wc -c"}));
  REQUIRE(p->id());
  constexpr size_t piece = 128u << 10;
  constexpr int sent = 20;
  std::atomic<int> taken{0}, failed{0};
  std::mutex mu;
  std::vector<int> order; // which write was answered when
  for (int i = 0; i < sent; ++i)
    p->write_async(std::string(piece, static_cast<char>('a' + i)), [&, i](expected<uint64_t> r) {
      if (r && *r == piece) {
        ++taken;
        std::lock_guard<std::mutex> g{mu};
        order.push_back(i);
      } else {
        ++failed;
      }
    });
  // The daemon takes pieces while it holds less than stdin_buffer (beyond the
  // pipe); the client's writer keeps a few on their way and the rest queued,
  // so the daemon refuses none (it would, past 8 senders waiting).
  REQUIRE(eventually([&] { return taken >= 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(failed == 0);
  CHECK(taken < sent);
  // At most its buffer, the pipe's 64 KiB and one piece beyond them.
  CHECK(static_cast<size_t>(taken) * piece <= stdin_buffer + (64u << 10) + piece);
  // Once it reads, every piece is taken, in the order written.
  auto go = s->exec(id, cmd({"touch", "/tmp/go"}));
  REQUIRE(go);
  REQUIRE(eventually([&] { return taken == sent; }));
  REQUIRE(p->close_stdin());
  auto r = p->wait();
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->out == std::to_string(sent * piece) + "\n");
  CHECK(failed == 0);
  std::lock_guard<std::mutex> g{mu};
  for (int i = 0; i < sent; ++i)
    CHECK(order.at(static_cast<size_t>(i)) == i);
}

TEST_CASE("stdin: writes in flight at once reach the command in order, through the session "
          "and by id through the daemon") {
  embedded n;
  auto s = open_one(*n.c);
  auto id = make_one(*s);
  // 64 pieces of 64 KiB, each its own letter, sent without waiting; the
  // command's digest of what it read must be that of the pieces in order.
  constexpr size_t piece = 64u << 10;
  constexpr int sent = 64;
  std::string all;
  for (int i = 0; i < sent; ++i)
    all += std::string(piece, static_cast<char>('A' + i % 50));
  sha256 h;
  h.update(all.data(), all.size());
  auto want = to_hex(h.finish()) + "  -\n";
  for (int via = 0; via < 2; ++via) {
    CAPTURE(via);
    auto req = with_stdin({"sha256sum"});
    auto p = via == 0 ? s->start(id, req) : n.c->start(id, req);
    std::atomic<int> answered{0}, failed{0};
    for (int i = 0; i < sent; ++i)
      p->write_async(all.substr(static_cast<size_t>(i) * piece, piece),
                     [&](expected<uint64_t> r) { ++(r ? answered : failed); });
    REQUIRE(p->close_stdin());
    auto r = p->wait();
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(answered == sent);
    CHECK(failed == 0);
    CHECK(r->out == want);
  }
}

TEST_CASE("a signal goes to the handle's command alone; signal and stdin after its end are "
          "refused") {
  embedded n;
  auto s = open_one(*n.c);
  auto id = make_one(*s);
  std::mutex mu;
  std::string out;
  auto on_out = [&](uint8_t, std::string_view d) {
    std::lock_guard<std::mutex> g{mu};
    out += d;
  };
  auto req = cmd({"sh", "-c", "trap 'echo got-TERM; exit 3' TERM; echo ready; "
                              "while :; do sleep 0.1; done"});
  req.handle = true;
  req.timeout_ms = 300'000;
  auto p = s->start(id, req, on_out);
  // A second command that must not hear the signal.
  auto other = s->start(id, with_stdin({"cat"}));
  REQUIRE(other->id());
  REQUIRE(eventually([&] {
    std::lock_guard<std::mutex> g{mu};
    return out == "ready\n";
  }));
  REQUIRE(p->signal(SIGTERM));
  auto r = p->wait();
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->exit_code == 3);
  {
    std::lock_guard<std::mutex> g{mu};
    // (Its sleep, in its process group, got the signal too: sh may say so.)
    CHECK(out.rfind("ready\n", 0) == 0);
    CHECK(out.find("got-TERM\n") != std::string::npos);
  }
  auto late = p->signal(SIGTERM);
  REQUIRE_FALSE(late);
  CHECK(late.error_value().code == errc::not_found);
  // The other one still runs and reads.
  REQUIRE(other->write("still\n"));
  REQUIRE(other->close_stdin());
  auto o = other->wait();
  REQUIRE(o);
  CHECK(o->out == "still\n");
  // Without open_stdin there is no stdin to feed.
  auto plain = cmd({"sleep", "1000"});
  plain.handle = true;
  auto q = s->start(id, plain);
  REQUIRE(q->id());
  auto w = q->write("x");
  REQUIRE_FALSE(w);
  CHECK(w.error_value().code == errc::closed);
  // Bad signal numbers are named.
  auto bad = q->signal(0);
  REQUIRE_FALSE(bad);
  CHECK(bad.error_value().code == errc::invalid_argument);
  REQUIRE(q->signal(SIGKILL));
  auto qr = q->wait();
  REQUIRE(qr);
  CHECK(qr->signal == SIGKILL);
  CHECK(qr->exit_code == 128 + SIGKILL);
}

TEST_CASE("cancelling a handle stops its command in the sandbox; the sandbox stays") {
  embedded n;
  auto s = open_one(*n.c);
  auto id = make_one(*s);
  auto req = cmd({"sleep", "1000"});
  req.handle = true;
  auto p = s->start(id, req);
  REQUIRE(p->id());
  CHECK(running_in(*n.c, id) == 1);
  p->cancel();
  auto r = p->wait();
  REQUIRE_FALSE(r);
  CHECK(r.error_value().code == errc::closed);
  CHECK(eventually([&] { return running_in(*n.c, id) == 0; }));
  auto still = s->exec(id, cmd({"echo", "here"}));
  REQUIRE(still);
  CHECK(still->out == "here\n");
}

TEST_CASE("bad handle requests are refused and named") {
  embedded n;
  auto s = open_one(*n.c);
  auto id = make_one(*s);
  SUBCASE("open_stdin without a handle") {
    auto req = cmd({"cat"});
    req.open_stdin = true;
    auto r = s->exec(id, req);
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == errc::invalid_argument);
    CHECK(r.error_value().message.find("process handle") != std::string::npos);
  }
  SUBCASE("a command that cannot start: id() and wait() say why") {
    auto p = s->start(id, with_stdin({"/no/such/binary"}));
    auto eid = p->id();
    REQUIRE_FALSE(eid);
    CHECK(eid.error_value().code == errc::not_found);
    auto r = p->wait();
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == errc::not_found);
  }
  SUBCASE("an unknown sandbox") {
    auto p = n.c->start("nosuch", with_stdin({"cat"}));
    auto r = p->wait();
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == errc::not_found);
  }
}

TEST_CASE("a command that closes its stdin: its writers hear closed, and the daemon's process "
          "gets no SIGPIPE") {
  embedded n;
  auto s = open_one(*n.c);
  auto id = make_one(*s);
  // An embedded daemon lives in its trainer's process, which may keep
  // SIGPIPE's default (death): this one does, from here on in this case
  // (test/support's run_process ignores it).
  struct restore {
    void (*was)(int) = ::signal(SIGPIPE, SIG_DFL);
    ~restore() { ::signal(SIGPIPE, was); }
  } r0;
  // It closes its stdin and runs on: the pipe has no reader left (EPIPE).
  auto p = s->start(id, with_stdin({"sh", "-c", "exec 0<&-; echo closed; exec sleep 1000"}));
  REQUIRE(p->id());
  auto w = p->write(std::string(8u << 20, 'q'));
  REQUIRE_FALSE(w);
  CHECK(w.error_value().code == errc::closed);
  REQUIRE(p->signal(SIGKILL));
  auto r = p->wait();
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->signal == SIGKILL);
  CHECK((r->out.empty() || r->out == "closed\n")); // (killed maybe before its echo)
  // Still alive and serving.
  auto again = s->exec(id, cmd({"echo", "alive"}));
  REQUIRE(again);
  CHECK(again->out == "alive\n");
}

// ---- terminals (exec_request.tty; issue 23) ----------------------------------------

namespace {

exec_request on_tty(std::vector<std::string> argv, uint16_t rows = 0, uint16_t cols = 0) {
  auto r = cmd(std::move(argv));
  r.tty = true;
  r.rows = rows;
  r.cols = cols;
  r.timeout_ms = 300'000; // a safety net should a case hang, never a measure
  return r;
}

// A started terminal command's streamed output, for waiting on.
struct tty_out {
  std::mutex mu;
  std::string text;
  output_fn fn() {
    return [this](uint8_t stream, std::string_view d) {
      std::lock_guard<std::mutex> g{mu};
      CHECK(stream == 1); // a terminal is one stream
      text += d;
    };
  }
  bool has(const std::string& part) {
    std::lock_guard<std::mutex> g{mu};
    return text.find(part) != std::string::npos;
  }
  std::string get() {
    std::lock_guard<std::mutex> g{mu};
    return text;
  }
};

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("a terminal: the command's stdin, stdout and stderr are a pty of the sandbox, of the "
          "size asked, TERM set, one output stream") {
  embedded n;
  auto s = open_one(*n.c);
  auto id = make_one(*s);
  auto r = s->exec(id, on_tty({"sh", "-c",
                               "busybox tty; [ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo all-ttys; "
                               "busybox stty size; echo TERM=$TERM; echo to-stderr >&2; exit 42"},
                              33, 101));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->exit_code == 42);
  CHECK(r->err.empty()); // stderr is the terminal too
  INFO(r->out);
  CHECK(has(r->out, "/dev/pts/"));
  CHECK(has(r->out, "all-ttys\r\n")); // the terminal's output processing: \r\n
  CHECK(has(r->out, "33 101\r\n"));
  CHECK(has(r->out, "TERM=xterm-256color\r\n"));
  CHECK(has(r->out, "to-stderr\r\n"));
  // The default size, and a TERM the request sets.
  auto req = on_tty({"sh", "-c", "busybox stty size; echo TERM=$TERM"});
  req.env = {"TERM=vt100"};
  auto d = s->exec(id, req);
  REQUIRE_MESSAGE(d, describe(d.error_value()));
  CHECK(has(d->out, "24 80\r\n"));
  CHECK(has(d->out, "TERM=vt100\r\n"));
  // Without one, the same command has no terminal.
  auto plain = s->exec(id, cmd({"sh", "-c", "[ -t 0 ] || [ -t 1 ] || echo no-tty"}));
  REQUIRE(plain);
  CHECK(plain->out == "no-tty\n");
  // `input` is typed in, then ^D ends it: cat sees its end.
  auto in = on_tty({"cat"});
  in.input = "typed\n";
  auto c = s->exec(id, in);
  REQUIRE_MESSAGE(c, describe(c.error_value()));
  CHECK(c->exit_code == 0);
  CHECK(c->out == "typed\r\ntyped\r\n"); // its echo, then cat's copy
}

TEST_CASE("a terminal through a handle: stdin typed in, ^D on close, resize with SIGWINCH") {
  embedded n;
  auto s = open_one(*n.c);
  auto id = make_one(*s);
  SUBCASE("stdin, then its close types ^D") {
    auto req = on_tty({"sh", "-c", "read -r line; echo got=$line; cat; echo cat-ended"});
    req.handle = req.open_stdin = true;
    tty_out out;
    auto p = s->start(id, req, out.fn());
    REQUIRE(p->write("hello\n"));
    REQUIRE(eventually([&] { return out.has("got=hello\r\n"); }));
    REQUIRE(p->write("more\n"));
    REQUIRE(p->close_stdin());
    auto r = p->wait();
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(r->exit_code == 0);
    INFO(out.get());
    CHECK(out.has("more\r\nmore\r\n"));
    CHECK(out.has("cat-ended\r\n"));
  }
  SUBCASE("resize: stty size and a shell's WINCH trap see the new size") {
    auto req = on_tty({"sh", "-c",
                       "trap 'busybox stty size; echo winched; exit 3' WINCH; busybox stty size;"
                       " echo ready; while :; do sleep 0.05; done"},
                      20, 60);
    req.handle = true;
    tty_out out;
    auto p = s->start(id, req, out.fn());
    REQUIRE(eventually([&] { return out.has("ready\r\n"); }));
    CHECK(out.has("20 60\r\n"));
    REQUIRE(p->resize(41, 133));
    auto r = p->wait();
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    INFO(out.get());
    CHECK(r->exit_code == 3);
    CHECK(out.has("41 133\r\nwinched\r\n"));
    // It ended: resize has nothing to resize.
    auto late = p->resize(10, 10);
    REQUIRE_FALSE(late);
  }
  SUBCASE("^C interrupts the foreground sleep of sh, which goes on") {
    auto req = on_tty({"sh", "-c",
                       "trap 'echo trapped' INT; echo ready; sleep 100; echo after=$?; exit 5"});
    req.handle = req.open_stdin = true;
    tty_out out;
    auto p = s->start(id, req, out.fn());
    REQUIRE(eventually([&] { return out.has("ready\r\n"); }));
    // Once its sleep runs (a ^C before it would not reach the sleep).
    REQUIRE(eventually([&] {
      auto ps = s->exec(id, cmd({"sh", "-c", "ps | grep -v grep | grep -q 'sleep 100'"}));
      return ps && ps->exit_code == 0;
    }));
    REQUIRE(p->write("\x03"));
    auto r = p->wait();
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    INFO(out.get());
    CHECK(r->exit_code == 5);
    CHECK(out.has("trapped\r\n"));
    CHECK(out.has("after=130\r\n")); // the sleep died of SIGINT
  }
  SUBCASE("signals go to its process group; the exit status says which") {
    auto req = on_tty({"sleep", "100"});
    req.handle = true;
    auto p = s->start(id, req);
    REQUIRE(p->id());
    REQUIRE(p->signal(SIGTERM));
    auto r = p->wait();
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(r->signal == SIGTERM);
    CHECK(r->exit_code == 128 + SIGTERM);
  }
  SUBCASE("its timeout kills it") {
    auto req = on_tty({"sh", "-c", "echo started; sleep 100"});
    req.timeout_ms = 200;
    auto r = s->exec(id, req);
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(r->timed_out);
    CHECK(r->signal == SIGKILL);
  }
  // Nothing is left running in the sandbox.
  CHECK(eventually([&] { return running_in(*n.c, id) == 0; }));
}

TEST_CASE("a terminal works whatever the sandbox did to /dev (init never looks up a path)") {
  embedded n;
  auto s = open_one(*n.c);
  auto id = make_one(*s);
  // The agent replaces /dev/ptmx with a fifo and puts a link to nowhere at
  // /dev/console: dsec's terminals do not go through either.
  auto bad = s->exec(id, cmd({"sh", "-c",
                              "rm -f /dev/ptmx; busybox mkfifo /dev/ptmx && "
                              "busybox ln -sf /nowhere /dev/console && echo done"}));
  REQUIRE(bad);
  REQUIRE(bad->out == "done\n");
  auto r = s->exec(id, on_tty({"sh", "-c", "[ -t 0 ] && busybox stty size"}, 12, 34));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->exit_code == 0);
  CHECK(r->out == "12 34\r\n");
}

TEST_CASE("bad terminal requests are refused and named") {
  embedded n;
  auto s = open_one(*n.c);
  auto id = make_one(*s);
  SUBCASE("with detach") {
    auto req = on_tty({"sleep", "1"});
    req.detach = true;
    auto r = s->exec(id, req);
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == errc::unsupported);
    CHECK(has(r.error_value().message, "detached"));
  }
  SUBCASE("resize of a command without one") {
    auto req = cmd({"sleep", "100"});
    req.handle = true;
    auto p = s->start(id, req);
    REQUIRE(p->id());
    auto r = p->resize(10, 20);
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == errc::invalid_argument);
    CHECK(has(r.error_value().message, "no terminal"));
    REQUIRE(p->signal(SIGKILL));
    REQUIRE(p->wait());
  }
  SUBCASE("a resize to nothing") {
    auto req = on_tty({"sleep", "100"});
    req.handle = true;
    auto p = s->start(id, req);
    REQUIRE(p->id());
    auto r = p->resize(0, 20);
    REQUIRE_FALSE(r);
    CHECK(r.error_value().code == errc::invalid_argument);
    REQUIRE(p->signal(SIGKILL));
    REQUIRE(p->wait());
  }
}

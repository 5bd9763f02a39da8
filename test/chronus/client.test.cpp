// The in-sandbox side of Chronus (tools/chronus) against the node's side
// (runtime/chronus): the hand-written C frames decode with the real Cap'n Proto
// decoder, the real encoder's replies decode with the C header, the C header
// refuses malformed replies, and the static `chronus` command does what its help
// says against a node played by this test. Also checks the fuzz seed corpus.
//
// To regenerate the seed corpus: DSEC_FUZZ_CORPUS_OUT=test/fuzz/corpus/chronus
// meson test -C BUILD chronus (the test writes the files, then checks them).
#include "tools/chronus/chronus.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "runtime/chronus.hpp"
#include "runtime/chronus_endpoint.hpp"
#include "runtime/reactor.hpp"
#include "runtime/fd.hpp"
#include "test/support/process.hpp"

namespace {

using dsec::chronus_kind;
using dsec::chronus_request;
using dsec::chronus_token;
using dsec::unique_fd;

// Fixed, so that a failure can be replayed; each test case seeds its own engine.
constexpr uint32_t seed = 20240917;

const chronus_token& token() {
  static const chronus_token t = *chronus_token::generate();
  return t;
}

std::span<const std::byte> bytes_of(const std::vector<unsigned char>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size()};
}

// ---- random content within the limits ---------------------------------------

struct randomizer {
  std::mt19937_64 rng{seed};

  size_t size(size_t lo, size_t hi) {
    // Often small, sometimes the extremes.
    switch (rng() % 8) {
      case 0: return lo;
      case 1: return hi;
      default: return lo + rng() % (std::min<size_t>(hi, lo + 300) - lo + 1);
    }
  }
  std::string printable(size_t n) {
    std::string s(n, ' ');
    for (auto& c : s)
      c = static_cast<char>(0x20 + rng() % 95);
    return s;
  }
  // Valid UTF-8 without NUL, at most n bytes.
  std::string utf8(size_t n) {
    std::string s;
    while (s.size() < n) {
      uint32_t cp;
      switch (rng() % 4) {
        case 0: cp = 1 + rng() % 0x7f; break;
        case 1: cp = 0x80 + rng() % (0x800 - 0x80); break;
        case 2:
          cp = 0x800 + rng() % (0x10000 - 0x800);
          if (cp >= 0xd800 && cp <= 0xdfff)
            cp = 'x';
          break;
        default: cp = 0x10000 + rng() % (0x110000 - 0x10000);
      }
      std::string enc;
      if (cp < 0x80) {
        enc += static_cast<char>(cp);
      } else if (cp < 0x800) {
        enc += static_cast<char>(0xc0 | cp >> 6);
        enc += static_cast<char>(0x80 | (cp & 63));
      } else if (cp < 0x10000) {
        enc += static_cast<char>(0xe0 | cp >> 12);
        enc += static_cast<char>(0x80 | (cp >> 6 & 63));
        enc += static_cast<char>(0x80 | (cp & 63));
      } else {
        enc += static_cast<char>(0xf0 | cp >> 18);
        enc += static_cast<char>(0x80 | (cp >> 12 & 63));
        enc += static_cast<char>(0x80 | (cp >> 6 & 63));
        enc += static_cast<char>(0x80 | (cp & 63));
      }
      if (s.size() + enc.size() > n)
        break;
      s += enc;
    }
    return s;
  }
  std::string bytes(size_t n) {
    std::string s(n, '\0');
    for (auto& c : s)
      c = static_cast<char>(rng());
    return s;
  }
  double number() {
    for (;;) {
      uint64_t bits = rng();
      double d;
      std::memcpy(&d, &bits, sizeof d);
      if (std::isfinite(d))
        return d;
    }
  }
  std::vector<dsec::chronus_metric> metrics() {
    std::vector<dsec::chronus_metric> out(size(1, dsec::chronus_max_metrics));
    for (size_t i = 0; i < out.size(); ++i) {
      // Unique: the index, then random printable bytes.
      auto key = std::to_string(i) + "." + printable(size(0, dsec::chronus_max_key - 4));
      out[i] = {key.substr(0, dsec::chronus_max_key), number()};
    }
    return out;
  }
};

// Encodes with the C header into a vector (size first, then the frame).
template <class Encode>
std::vector<unsigned char> c_frame(Encode&& encode) {
  size_t size = encode(nullptr, 0);
  REQUIRE(size <= CHRONUS_MAX_FRAME);
  std::vector<unsigned char> out(size);
  REQUIRE(encode(out.data(), out.size()) == size);
  return out;
}

std::vector<unsigned char> c_request(const unsigned char* tok, const chronus_request& r) {
  switch (r.kind) {
    case chronus_kind::stage:
      return c_frame([&](unsigned char* o, size_t cap) {
        return chronus_encode_stage(o, cap, tok, r.text.data(), r.text.size());
      });
    case chronus_kind::log:
      return c_frame([&](unsigned char* o, size_t cap) {
        return chronus_encode_log(o, cap, tok, r.text.data(), r.text.size());
      });
    case chronus_kind::report: {
      std::vector<chronus_metric> m;
      for (const auto& x : r.metrics)
        m.push_back({x.key.c_str(), x.value});
      return c_frame([&](unsigned char* o, size_t cap) {
        return chronus_encode_report(o, cap, tok, m.data(), m.size());
      });
    }
    case chronus_kind::feedback:
      return c_frame([&](unsigned char* o, size_t cap) {
        return chronus_encode_feedback(o, cap, tok, r.payload.data(), r.payload.size(),
                                       r.timeout_ms);
      });
  }
  FAIL("unknown kind");
  return {};
}

const unsigned char* token_bytes(const chronus_token& t) {
  return reinterpret_cast<const unsigned char*>(t.bytes().data());
}

// C's reply as the C++ type, for comparisons.
dsec::chronus_reply from_c(const struct chronus_reply& c) {
  dsec::chronus_reply r;
  r.kind = static_cast<dsec::chronus_reply_kind>(c.kind);
  if (c.kind == CHRONUS_REPLY_FEEDBACK) {
    r.feedback.request_id = c.request_id;
    r.feedback.reward = c.reward;
    r.feedback.done = c.done != 0;
    r.feedback.text.assign(c.text, c.text_len);
    r.feedback.data.assign(reinterpret_cast<const char*>(c.data), c.data_len);
  }
  if (c.kind == CHRONUS_REPLY_REJECTED)
    r.reason.assign(c.reason, c.reason_len);
  return r;
}

int c_decode(const std::string& frame, struct chronus_reply* out) {
  return chronus_decode_reply(reinterpret_cast<const unsigned char*>(frame.data()),
                              frame.size(), out);
}

// ---- a node: a SOCK_SEQPACKET listener answering with the real encoder ---------

class fake_node {
public:
  // Given what decode_request made of a frame, the reply to send.
  using responder = std::function<std::string(const dsec::expected<chronus_request>&)>;

  explicit fake_node(responder respond) : respond_(std::move(respond)) {
    char tmpl[] = "/tmp/chronus-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/chronus.sock";
    listener_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    REQUIRE(listener_);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.c_str(), path_.size());
    REQUIRE(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listener_.get(), 16) == 0);
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    stop_read_.reset(p[0]);
    stop_write_.reset(p[1]);
    thread_ = std::thread([this] { serve(); });
  }

  ~fake_node() {
    char x = 0;
    (void)!::write(stop_write_.get(), &x, 1);
    thread_.join();
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }

  fake_node(const fake_node&) = delete;
  fake_node& operator=(const fake_node&) = delete;

  [[nodiscard]] const std::string& path() const { return path_; }

  std::vector<dsec::expected<chronus_request>> received() {
    std::lock_guard lock(mu_);
    return received_;
  }

private:
  // Waits for fd to be readable; false when asked to stop.
  bool wait(int fd) {
    pollfd fds[2] = {{fd, POLLIN, 0}, {stop_read_.get(), POLLIN, 0}};
    for (;;) {
      int n = ::poll(fds, 2, -1);
      if (n < 0 && errno == EINTR)
        continue;
      return n > 0 && !(fds[1].revents & POLLIN);
    }
  }

  void serve() {
    std::vector<std::byte> buf(dsec::chronus_max_frame + 1);
    while (wait(listener_.get())) {
      unique_fd conn{::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC)};
      if (!conn)
        continue;
      while (wait(conn.get())) {
        ssize_t n = ::recv(conn.get(), buf.data(), buf.size(), 0);
        if (n <= 0)
          break;
        auto r = dsec::decode_request(std::span{buf}.first(static_cast<size_t>(n)), token());
        {
          std::lock_guard lock(mu_);
          received_.push_back(r);
        }
        auto reply = respond_(r);
        if (::send(conn.get(), reply.data(), reply.size(), MSG_NOSIGNAL) < 0)
          break;
      }
    }
  }

  responder respond_;
  std::string dir_, path_;
  unique_fd listener_, stop_read_, stop_write_;
  std::mutex mu_;
  std::vector<dsec::expected<chronus_request>> received_;
  std::thread thread_;
};

// The node's usual answers: ack, the reason of a refusal, feedback for a request.
std::string usual(const dsec::expected<chronus_request>& r) {
  if (!r)
    return dsec::encode_reply_rejected(r.error_value().message);
  if (r->kind != chronus_kind::feedback)
    return dsec::encode_reply_ack();
  return dsec::encode_reply_feedback({7, 0.5, "good \"job\"\n", r->payload + "!", true});
}

// ---- running the static chronus ------------------------------------------------

std::string chronus_bin() {
  const char* p = std::getenv("DSEC_CHRONUS_BIN");
  REQUIRE_MESSAGE(p != nullptr, "DSEC_CHRONUS_BIN is not set (run through meson test)");
  return p;
}

// Runs chronus with args, the socket path and the token in its environment.
dsec::test::proc_result run_chronus(std::vector<std::string> args, const std::string& socket,
                                    const std::string& token_hex, std::string input = {}) {
  args.insert(args.begin(), chronus_bin());
  dsec::test::spawn_options opts;
  opts.input = std::move(input);
  opts.kill_after = std::chrono::seconds{60};
  // Set in this process before the fork: the child inherits them with execv.
  if (socket.empty())
    ::unsetenv("CHRONUS_SOCKET");
  else
    ::setenv("CHRONUS_SOCKET", socket.c_str(), 1);
  if (token_hex.empty())
    ::unsetenv("DSEC_CHRONUS_TOKEN");
  else
    ::setenv("DSEC_CHRONUS_TOKEN", token_hex.c_str(), 1);
  auto res = dsec::test::run_process(args, opts);
  ::unsetenv("CHRONUS_SOCKET");
  ::unsetenv("DSEC_CHRONUS_TOKEN");
  return res;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("the C header's frames decode with the real decoder, every kind") {
  randomizer rnd;
  for (int i = 0; i < 400; ++i) {
    chronus_request r;
    r.kind = static_cast<chronus_kind>(i % 4);
    switch (r.kind) {
      case chronus_kind::stage: r.text = rnd.printable(rnd.size(1, dsec::chronus_max_stage)); break;
      case chronus_kind::report: r.metrics = rnd.metrics(); break;
      case chronus_kind::log: r.text = rnd.utf8(rnd.size(0, dsec::chronus_max_log)); break;
      case chronus_kind::feedback:
        r.payload = rnd.bytes(rnd.size(0, dsec::chronus_max_payload));
        r.timeout_ms = static_cast<uint32_t>(rnd.rng());
        break;
    }
    CAPTURE(i);
    auto frame = c_request(token_bytes(token()), r);
    auto back = dsec::decode_request(bytes_of(frame), token());
    REQUIRE_MESSAGE(back, back.error_value().to_string());
    CHECK(*back == r);
    // The node's checks apply to the C frames as they do to its own.
    auto other = *chronus_token::generate();
    CHECK(dsec::decode_request(bytes_of(c_request(token_bytes(other), r)), token())
              .error_value()
              .code == dsec::errc::unauthenticated);
  }
}

TEST_CASE("the C header's frames carry invalid fields to the node's checks") {
  auto tok = token_bytes(token());
  auto long_stage = chronus_request{chronus_kind::stage, std::string(200, 's'), {}, {}, 0};
  auto r = dsec::decode_request(bytes_of(c_request(tok, long_stage)), token());
  REQUIRE_FALSE(r);
  CHECK(r.error_value().code == dsec::errc::invalid_argument);
  CHECK(contains(r.error_value().message, "stage name of 200 bytes"));
  auto nan_report = chronus_request{chronus_kind::report, {}, {{"x", NAN}}, {}, 0};
  r = dsec::decode_request(bytes_of(c_request(tok, nan_report)), token());
  REQUIRE_FALSE(r);
  CHECK(contains(r.error_value().message, "not a finite number"));
  // Too large for any frame: the encoders say so rather than write.
  std::string huge(CHRONUS_MAX_FRAME, 'x');
  CHECK(chronus_encode_log(nullptr, 0, tok, huge.data(), huge.size()) > CHRONUS_MAX_FRAME);
  CHECK(chronus_encode_feedback(nullptr, 0, tok, huge.data(), huge.size(), 0) >
        CHRONUS_MAX_FRAME);
  // A buffer that is too small is left alone.
  std::vector<unsigned char> small(16, 0xee);
  CHECK(chronus_encode_stage(small.data(), small.size(), tok, "x", 1) > small.size());
  CHECK(small == std::vector<unsigned char>(16, 0xee));
}

TEST_CASE("the real encoder's replies decode with the C header") {
  randomizer rnd;
  std::vector<std::string> frames = {dsec::encode_reply_ack(), dsec::encode_reply_timed_out(),
                                     dsec::encode_reply_session_gone(),
                                     dsec::encode_reply_rejected("")};
  for (int i = 0; i < 200; ++i) {
    dsec::chronus_feedback f{rnd.rng(), rnd.number(),
                             rnd.utf8(rnd.size(0, dsec::chronus_max_feedback_text)),
                             rnd.bytes(rnd.size(0, dsec::chronus_max_feedback_data)),
                             rnd.rng() % 2 == 0};
    REQUIRE(dsec::check_feedback(f));
    frames.push_back(dsec::encode_reply_feedback(f));
    frames.push_back(dsec::encode_reply_rejected(rnd.utf8(rnd.size(0, 4000))));
  }
  for (const auto& frame : frames) {
    auto want = dsec::decode_reply(dsec::as_bytes(frame));
    REQUIRE(want);
    struct chronus_reply c;
    REQUIRE(c_decode(frame, &c) == 0);
    CHECK(from_c(c) == *want);
    // Text comes NUL-terminated, as the header promises.
    if (c.kind == CHRONUS_REPLY_FEEDBACK)
      CHECK(c.text[c.text_len] == 0);
    if (c.kind == CHRONUS_REPLY_REJECTED)
      CHECK(c.reason[c.reason_len] == 0);
  }
}

TEST_CASE("the C header refuses malformed replies") {
  auto fb = dsec::encode_reply_feedback({1, 2.0, "text", "data", true});
  auto rej = dsec::encode_reply_rejected("why");
  struct chronus_reply c;
  REQUIRE(c_decode(fb, &c) == 0);
  REQUIRE(c_decode(rej, &c) == 0);

  auto word = [](std::string& f, size_t i) -> char* { return f.data() + 8 + 8 * i; };
  auto put = [&](std::string& f, size_t i, uint64_t v) { std::memcpy(word(f, i), &v, 8); };
  auto get = [&](std::string& f, size_t i) {
    uint64_t v;
    std::memcpy(&v, word(f, i), 8);
    return v;
  };

  SUBCASE("every truncation, and trailing bytes") {
    for (const auto* f : {&fb, &rej})
      for (size_t n = 0; n < f->size(); ++n) {
        CAPTURE(n);
        CHECK(c_decode(f->substr(0, n), &c) == -1);
      }
    CHECK(c_decode(fb + std::string(8, '\0'), &c) == -1);
  }
  SUBCASE("more than one segment") {
    auto f = fb;
    f[0] = 1; // two segments, the second of size... whatever follows
    CHECK(c_decode(f, &c) == -1);
  }
  SUBCASE("too large") {
    std::string big(CHRONUS_MAX_FRAME + 8, '\0');
    uint32_t words = CHRONUS_MAX_FRAME / 8;
    std::memcpy(big.data() + 4, &words, 4);
    CHECK(c_decode(big, &c) == -1);
  }
  SUBCASE("pointers out of bounds or of the wrong kind") {
    auto f = fb;
    put(f, 0, get(f, 0) + (1000 << 2)); // root beyond the end
    CHECK(c_decode(f, &c) == -1);
    f = fb;
    put(f, 0, get(f, 0) | 1); // root is a list pointer
    CHECK(c_decode(f, &c) == -1);
    f = fb;
    put(f, 0, 2); // a far pointer
    CHECK(c_decode(f, &c) == -1);
    f = fb;
    put(f, 0, get(f, 0) | (uint64_t{0xffff} << 48)); // 65,535 pointers
    CHECK(c_decode(f, &c) == -1);
    f = rej;
    put(f, 0, (get(f, 0) & 0xffffffff00000003) | (uint64_t{0x3ffffff0} << 2)); // negative
    CHECK(c_decode(f, &c) == -1);
  }
  SUBCASE("text that is not text") {
    // Reply: root at 0, Reply at 1 (tag word) with its pointer at 2 -> the text.
    auto f = rej;
    uint64_t p = get(f, 2);
    put(f, 2, (p & ~(uint64_t{7} << 32)) | (uint64_t{3} << 32)); // 4-byte elements
    CHECK(c_decode(f, &c) == -1);
    f = rej;
    f[f.size() - 5] = 'x'; // "why\0" -> "whyx": no NUL
    CHECK(c_decode(f, &c) == -1);
    f = rej;
    put(f, 2, (p & 0x7ffffffff) | (uint64_t{60000} << 35)); // longer than the frame
    CHECK(c_decode(f, &c) == -1);
  }
  SUBCASE("an unknown union tag") {
    auto f = dsec::encode_reply_ack();
    put(f, 1, 5);
    CHECK(c_decode(f, &c) == -1);
    put(f, 1, 0xffff);
    CHECK(c_decode(f, &c) == -1);
  }
  SUBCASE("random damage never reads outside the frame") {
    randomizer rnd;
    int accepted = 0;
    for (int i = 0; i < 20000; ++i) {
      auto f = (i % 2) ? fb : rej;
      for (int k = 1 + static_cast<int>(rnd.rng() % 4); k > 0; --k)
        f[rnd.rng() % f.size()] = static_cast<char>(rnd.rng());
      if (c_decode(f, &c) != 0)
        continue;
      ++accepted;
      auto inside = [&](const void* p, size_t n) {
        auto q = static_cast<const char*>(p);
        return n == 0 || (q >= f.data() && q + n <= f.data() + f.size());
      };
      // (an empty text may be a static "" when its pointer is null)
      if (c.kind == CHRONUS_REPLY_FEEDBACK) {
        REQUIRE((c.text_len == 0 || inside(c.text, c.text_len + 1)));
        REQUIRE(c.text[c.text_len] == 0);
        REQUIRE(inside(c.data, c.data_len));
      }
      if (c.kind == CHRONUS_REPLY_REJECTED) {
        REQUIRE((c.reason_len == 0 || inside(c.reason, c.reason_len + 1)));
        REQUIRE(c.reason[c.reason_len] == 0);
      }
    }
    CHECK(accepted > 0); // some damage is harmless (e.g. in text bytes)
  }
}

TEST_CASE("the C calls talk to a node over the socket") {
  fake_node node(usual);
  struct chronus c;
  REQUIRE_MESSAGE(chronus_connect(&c, node.path().c_str(), token().to_hex().c_str()) ==
                      CHRONUS_OK,
                  c.error);
  CHECK(chronus_stage(&c, "plan") == CHRONUS_OK);
  struct chronus_metric m[] = {{"loss", 0.25}, {"acc", 0.875}};
  CHECK(chronus_report(&c, m, 2) == CHRONUS_OK);
  CHECK(chronus_log(&c, "hello", 5) == CHRONUS_OK);
  struct chronus_reply r;
  REQUIRE(chronus_feedback(&c, "answer", 6, 250, &r) == CHRONUS_OK);
  CHECK(r.kind == CHRONUS_REPLY_FEEDBACK);
  CHECK(r.request_id == 7);
  CHECK(r.reward == 0.5);
  CHECK(r.done == 1);
  CHECK(std::string(r.text, r.text_len) == "good \"job\"\n");
  CHECK(std::string(reinterpret_cast<const char*>(r.data), r.data_len) == "answer!");
  chronus_reply_free(&r);
  chronus_reply_free(&r); // twice is fine
  // Refused by the node's checks: the reason comes back.
  CHECK(chronus_stage(&c, "") == CHRONUS_REJECTED);
  CHECK(contains(c.error, "stage name is empty"));
  chronus_close(&c);
  CHECK(c.fd == -1);

  auto got = node.received();
  REQUIRE(got.size() == 5);
  for (size_t i = 0; i < 4; ++i)
    REQUIRE(got[i]);
  CHECK(got[0]->text == "plan");
  CHECK(got[1]->metrics == std::vector<dsec::chronus_metric>{{"loss", 0.25}, {"acc", 0.875}});
  CHECK(got[2]->text == "hello");
  CHECK(got[3]->payload == "answer");
  CHECK(got[3]->timeout_ms == 250);
  CHECK_FALSE(got[4]);

  // A wrong token: every request is refused as unauthenticated.
  auto other = chronus_token::generate()->to_hex();
  REQUIRE(chronus_connect(&c, node.path().c_str(), other.c_str()) == CHRONUS_OK);
  CHECK(chronus_stage(&c, "plan") == CHRONUS_REJECTED);
  CHECK(contains(c.error, "wrong token"));
  chronus_close(&c);

  // No node, or no token.
  CHECK(chronus_connect(&c, "/nonexistent/chronus.sock", token().to_hex().c_str()) ==
        CHRONUS_ERROR);
  CHECK(contains(c.error, "/nonexistent/chronus.sock"));
  CHECK(chronus_connect(&c, node.path().c_str(), "xyz") == CHRONUS_ERROR);
  CHECK(c.fd == -1);
}

TEST_CASE("the C calls map each reply to a status") {
  std::string next;
  fake_node node([&](const auto&) { return next; });
  struct chronus c;
  REQUIRE(chronus_connect(&c, node.path().c_str(), token().to_hex().c_str()) == CHRONUS_OK);
  struct chronus_reply r;

  next = dsec::encode_reply_timed_out();
  CHECK(chronus_feedback(&c, "", 0, 1, &r) == CHRONUS_TIMED_OUT);
  chronus_reply_free(&r);
  next = dsec::encode_reply_session_gone();
  CHECK(chronus_feedback(&c, "", 0, 0, &r) == CHRONUS_SESSION_GONE);
  chronus_reply_free(&r);
  CHECK(chronus_stage(&c, "x") == CHRONUS_SESSION_GONE);
  next = dsec::encode_reply_rejected("rate limit");
  CHECK(chronus_feedback(&c, "", 0, 0, &r) == CHRONUS_REJECTED);
  CHECK(std::string(r.reason, r.reason_len) == "rate limit");
  chronus_reply_free(&r);
  // Answers that do not fit the question, and garbage.
  next = dsec::encode_reply_ack();
  CHECK(chronus_feedback(&c, "", 0, 0, &r) == CHRONUS_ERROR);
  chronus_reply_free(&r);
  next = dsec::encode_reply_timed_out();
  CHECK(chronus_log(&c, "x", 1) == CHRONUS_ERROR);
  next = std::string(24, '\x7f');
  CHECK(chronus_stage(&c, "x") == CHRONUS_ERROR);
  CHECK(contains(c.error, "malformed"));
  chronus_close(&c);
}

TEST_CASE("the chronus command") {
  auto bin = chronus_bin();
  auto tok = token().to_hex();

  SUBCASE("is static") {
    auto ldd = dsec::test::run_process({"/usr/bin/ldd", bin});
    CHECK_MESSAGE(contains(ldd.out + ldd.err, "not a dynamic executable"), ldd.describe());
  }
  SUBCASE("--help describes every verb, option and exit status") {
    auto res = run_chronus({"--help"}, "", "");
    CHECK(res.status == 0);
    for (const char* part : {"stage NAME", "report KEY=VALUE", "log TEXT", "feedback",
                             "--timeout DUR", "CHRONUS_FD", "CHRONUS_SOCKET", "DSEC_CHRONUS_TOKEN",
                             "/run/chronus.sock", "0  ", "1  ", "2  ", "3  ", "4  ", "5  "})
      CHECK_MESSAGE(contains(res.out, part), part);
    CHECK(run_chronus({"feedback", "--help"}, "", "").status == 0);
  }
  SUBCASE("usage errors exit 2") {
    for (auto args : std::vector<std::vector<std::string>>{
             {}, {"dance"}, {"stage"}, {"stage", "a", "b"}, {"report"}, {"report", "x"},
             {"report", "=1"}, {"report", "x="}, {"report", "x=abc"}, {"report", "x=nan"},
             {"log"}, {"feedback", "--timeout"}, {"feedback", "--timeout", "soon"},
             {"feedback", "--timeout", "-1s"}, {"feedback", "--bogus"}, {"feedback", "a", "b"}}) {
      auto res = run_chronus(args, "/nonexistent", tok);
      CAPTURE(res.describe());
      CHECK(res.status == 2);
    }
  }
  SUBCASE("no channel, no socket or no token exits 1") {
    auto res = run_chronus({"stage", "x"}, "/nonexistent/chronus.sock", tok);
    CHECK(res.status == 1);
    CHECK(contains(res.err, "/nonexistent/chronus.sock"));
    fake_node node(usual);
    res = run_chronus({"stage", "x"}, node.path(), "");
    CHECK(res.status == 1);
    CHECK(contains(res.err, "CHRONUS_FD is not set"));
  }
  SUBCASE("the verbs reach the node") {
    fake_node node(usual);
    CHECK(run_chronus({"stage", "run tests"}, node.path(), tok).status == 0);
    CHECK(run_chronus({"report", "loss=0.25", "steps=12", "e=-1e-3"}, node.path(), tok)
              .status == 0);
    CHECK(run_chronus({"log", "hello", "wörld"}, node.path(), tok).status == 0);
    auto res = run_chronus({"feedback", "--timeout", "1.5s", "my answer"}, node.path(), tok);
    CHECK(res.status == 0);
    CHECK(res.out ==
          "{\"request_id\":7,\"reward\":0.5,\"done\":true,\"text\":\"good \\\"job\\\"\\n\","
          "\"data\":\"my answer!\"}\n");
    res = run_chronus({"feedback", "-"}, node.path(), tok, std::string("from\0stdin", 10));
    CHECK(res.status == 0);
    CHECK(contains(res.out, "\"data\":\"from\\u0000stdin!\""));
    CHECK(run_chronus({"feedback"}, node.path(), tok).status == 0);

    auto got = node.received();
    REQUIRE(got.size() == 6);
    for (const auto& g : got)
      REQUIRE(g);
    CHECK(got[0]->kind == chronus_kind::stage);
    CHECK(got[0]->text == "run tests");
    CHECK(got[1]->metrics ==
          std::vector<dsec::chronus_metric>{{"loss", 0.25}, {"steps", 12}, {"e", -1e-3}});
    CHECK(got[2]->text == "hello wörld");
    CHECK(got[3]->payload == "my answer");
    CHECK(got[3]->timeout_ms == 1500);
    CHECK(got[4]->payload == std::string("from\0stdin", 10));
    CHECK(got[4]->timeout_ms == 0);
    CHECK(got[5]->payload.empty());
  }
  SUBCASE("timeouts parse with units") {
    fake_node node(usual);
    for (auto [arg, ms] : std::vector<std::pair<std::string, uint32_t>>{
             {"500ms", 500}, {"2", 2000}, {"2m", 120000}, {"1h", 3600000}, {"0", 0}}) {
      CHECK(run_chronus({"feedback", "--timeout=" + arg}, node.path(), tok).status == 0);
      auto got = node.received();
      REQUIRE(got.back());
      CHECK(got.back()->timeout_ms == ms);
    }
  }
  SUBCASE("the exit status says how the node answered") {
    std::string next;
    fake_node node([&](const auto&) { return next; });
    next = dsec::encode_reply_timed_out();
    CHECK(run_chronus({"feedback", "--timeout", "1s"}, node.path(), tok).status == 3);
    next = dsec::encode_reply_session_gone();
    CHECK(run_chronus({"feedback"}, node.path(), tok).status == 4);
    CHECK(run_chronus({"stage", "x"}, node.path(), tok).status == 4);
    next = dsec::encode_reply_rejected("rate limit exceeded");
    auto res = run_chronus({"log", "x"}, node.path(), tok);
    CHECK(res.status == 5);
    CHECK(contains(res.err, "rate limit exceeded"));
    next = "garbage!";
    CHECK(run_chronus({"stage", "x"}, node.path(), tok).status == 1);
  }
  SUBCASE("the node's checks come back as status 5") {
    fake_node node(usual);
    auto res = run_chronus({"stage", std::string(129, 's')}, node.path(), tok);
    CHECK(res.status == 5);
    CHECK(contains(res.err, "stage name of 129 bytes"));
    res = run_chronus({"report", "a=1", "a=2"}, node.path(), tok);
    CHECK(res.status == 5);
    CHECK(contains(res.err, "appears twice"));
    res = run_chronus({"stage", "x"}, node.path(), chronus_token::generate()->to_hex());
    CHECK(res.status == 5);
    CHECK(contains(res.err, "wrong token"));
  }
}

// ---- the fuzz seed corpus ----------------------------------------------------------

namespace {

// The token test/fuzz/chronus_frame_fuzz.cpp expects.
constexpr const char* fuzz_token_hex =
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

// What the seed corpus holds: the name says which decoder must accept ("ok-KIND")
// or refuse ("bad-KIND") it.
std::map<std::string, std::string> corpus_files() {
  auto tok = *chronus_token::from_hex(fuzz_token_hex);
  auto t = token_bytes(tok);
  auto str = [](const std::vector<unsigned char>& v) { return std::string(v.begin(), v.end()); };
  std::map<std::string, std::string> f;
  chronus_request st{chronus_kind::stage, "test", {}, {}, 0};
  chronus_request rp{chronus_kind::report, {}, {{"loss", 0.25}, {"acc", 1}, {"n", -3}}, {}, 0};
  chronus_request lg{chronus_kind::log, "line \xe2\x9c\x93", {}, {}, 0};
  chronus_request fb{chronus_kind::feedback, {}, {}, "answer", 30000};
  f["ok-request-stage"] = dsec::encode_request(tok, st);
  f["ok-request-report"] = dsec::encode_request(tok, rp);
  f["ok-request-log"] = dsec::encode_request(tok, lg);
  f["ok-request-feedback"] = dsec::encode_request(tok, fb);
  f["ok-request-c-stage"] = str(c_request(t, st));
  f["ok-request-c-report"] = str(c_request(t, rp));
  f["ok-request-c-log"] = str(c_request(t, lg));
  f["ok-request-c-feedback"] = str(c_request(t, fb));
  f["ok-event-stage"] = dsec::encode_event("ab12cd34ef56", 1, 1000, st);
  f["ok-event-report"] = dsec::encode_event("ab12cd34ef56", 2, 2000, rp);
  f["ok-event-feedback"] = dsec::encode_event("ab12cd34ef56", 3, 3000, fb);
  f["ok-event-log"] = dsec::encode_event("ab12cd34ef56", 4, 4000, lg);
  f["ok-feedback"] = dsec::encode_feedback({3, 0.5, "well done", "\x01\x02", true});
  f["ok-reply-ack"] = dsec::encode_reply_ack();
  f["ok-reply-feedback"] = dsec::encode_reply_feedback({3, 0.5, "well done", "\x01\x02", true});
  f["ok-reply-rejected"] = dsec::encode_reply_rejected("stage name is empty");
  f["ok-reply-timed-out"] = dsec::encode_reply_timed_out();
  f["ok-reply-session-gone"] = dsec::encode_reply_session_gone();
  f["bad-request-truncated"] = f["ok-request-report"].substr(0, 40);
  f["bad-request-wrong-token"] = dsec::encode_request(*chronus_token::from_hex(
      "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"), st);
  f["bad-request-empty-stage"] = dsec::encode_request(tok, {chronus_kind::stage, "", {}, {}, 0});
  f["bad-request-duplicate-key"] = dsec::encode_request(
      tok, {chronus_kind::report, {}, {{"a", 1}, {"a", 2}}, {}, 0});
  auto seg = f["ok-request-log"];
  seg[0] = 3; // four segments claimed
  f["bad-request-segment-table"] = seg;
  f["bad-event-seq-zero"] = dsec::encode_event("sb", 0, 1, st);
  return f;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

} // namespace

// ---- the trusted channel ---------------------------------------------------------

namespace {

// A node's end of a trusted channel: takes each packet's descriptor as a
// connection (as runtime/chronus_endpoint does) and answers its frames, which
// carry no token, with the real encoder. Every connection is served at once.
class fake_channel {
public:
  fake_channel() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    node_.reset(sv[0]);
    client_.reset(sv[1]);
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    stop_read_.reset(p[0]);
    stop_write_.reset(p[1]);
    thread_ = std::thread([this] { serve(); });
  }
  ~fake_channel() {
    char x = 0;
    (void)!::write(stop_write_.get(), &x, 1);
    thread_.join();
  }
  fake_channel(const fake_channel&) = delete;
  fake_channel& operator=(const fake_channel&) = delete;

  /// The end a trusted command holds (its fd 3).
  [[nodiscard]] int client() const { return client_.get(); }

  std::vector<dsec::expected<chronus_request>> received() {
    std::lock_guard lock(mu_);
    return received_;
  }
  size_t bad_packets() {
    std::lock_guard lock(mu_);
    return bad_;
  }

private:
  void serve() {
    std::vector<unique_fd> conns;
    std::vector<std::byte> buf(dsec::chronus_max_frame + 1);
    for (;;) {
      std::vector<pollfd> fds = {{stop_read_.get(), POLLIN, 0}, {node_.get(), POLLIN, 0}};
      for (auto& c : conns)
        fds.push_back({c.get(), POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0)
        continue;
      if (fds[0].revents)
        return;
      if (fds[1].revents & POLLIN) {
        char data[64];
        alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
        iovec iov{data, sizeof data};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        auto n = ::recvmsg(node_.get(), &msg, MSG_CMSG_CLOEXEC);
        std::vector<unique_fd> got;
        for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n >= 0 && c; c = CMSG_NXTHDR(&msg, c))
          for (size_t k = 0; k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++k) {
            int fd;
            std::memcpy(&fd, CMSG_DATA(c) + k * sizeof(int), sizeof fd);
            got.emplace_back(fd);
          }
        if (n >= 0 && std::string_view(data, static_cast<size_t>(n)) ==
                          dsec::chronus_channel_hello && got.size() == 1)
          conns.push_back(std::move(got[0]));
        else {
          std::lock_guard lock(mu_);
          ++bad_;
        }
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        if (!fds[i].revents)
          continue;
        auto& c = conns[i - 2];
        ssize_t n = ::recv(c.get(), buf.data(), buf.size(), MSG_DONTWAIT);
        if (n <= 0) {
          c.reset();
          continue;
        }
        auto r = dsec::decode_trusted_request(std::span{buf}.first(static_cast<size_t>(n)));
        {
          std::lock_guard lock(mu_);
          received_.push_back(r);
        }
        auto reply = usual(r);
        if (r && r->kind == chronus_kind::log)
          reply = dsec::encode_reply_rejected("for " + r->text); // whose reply is whose
        (void) ::send(c.get(), reply.data(), reply.size(), MSG_NOSIGNAL);
      }
      std::erase_if(conns, [](const unique_fd& c) { return !c; });
    }
  }

  unique_fd node_, client_, stop_read_, stop_write_;
  std::mutex mu_;
  std::vector<dsec::expected<chronus_request>> received_;
  size_t bad_ = 0;
  std::thread thread_;
};

} // namespace

TEST_CASE("the C calls open connections over a trusted channel") {
  CHECK(std::string_view{CHRONUS_CHANNEL_HELLO} == dsec::chronus_channel_hello);
  fake_channel ch;
  // Two connections at once over the one channel: each gets its own replies.
  struct chronus a, b;
  REQUIRE_MESSAGE(chronus_open_channel(&a, ch.client()) == CHRONUS_OK, a.error);
  REQUIRE_MESSAGE(chronus_open_channel(&b, ch.client()) == CHRONUS_OK, b.error);
  CHECK(a.fd != b.fd);
  CHECK(chronus_log(&b, "b", 1) == CHRONUS_REJECTED);
  CHECK(contains(b.error, "for b"));
  CHECK(chronus_log(&a, "a", 1) == CHRONUS_REJECTED);
  CHECK(contains(a.error, "for a"));
  CHECK(chronus_stage(&a, "plan") == CHRONUS_OK);
  struct chronus_reply r;
  REQUIRE(chronus_feedback(&b, "answer", 6, 0, &r) == CHRONUS_OK);
  CHECK(std::string(reinterpret_cast<const char*>(r.data), r.data_len) == "answer!");
  chronus_reply_free(&r);
  chronus_close(&a);
  chronus_close(&b);
  auto got = ch.received();
  REQUIRE(got.size() == 4);
  for (const auto& g : got)
    REQUIRE(g);
  CHECK(got[2]->text == "plan");
  CHECK(ch.bad_packets() == 0);
  // Not a channel: a pipe, a closed descriptor.
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  CHECK(chronus_open_channel(&a, p[0]) == CHRONUS_ERROR);
  CHECK(contains(a.error, "is not a Chronus channel"));
  ::close(p[0]);
  ::close(p[1]);
  CHECK(chronus_open_channel(&a, p[0]) == CHRONUS_ERROR);
  CHECK(a.fd == -1);
}

TEST_CASE("the chronus command uses $CHRONUS_FD before any socket or token") {
  fake_channel ch;
  fake_node node(usual); // not used: the channel is
  auto run_with_channel = [&](std::vector<std::string> args, const char* fd_var) {
    args.insert(args.begin(), chronus_bin());
    dsec::test::spawn_options opts;
    opts.kill_after = std::chrono::seconds{60};
    int channel = ch.client();
    opts.in_child = [channel] { ::dup2(channel, 3); }; // not close-on-exec at 3
    ::setenv("CHRONUS_SOCKET", node.path().c_str(), 1);
    ::setenv("DSEC_CHRONUS_TOKEN", token().to_hex().c_str(), 1);
    ::setenv("CHRONUS_FD", fd_var, 1);
    auto res = dsec::test::run_process(args, opts);
    ::unsetenv("CHRONUS_SOCKET");
    ::unsetenv("DSEC_CHRONUS_TOKEN");
    ::unsetenv("CHRONUS_FD");
    return res;
  };
  auto res = run_with_channel({"stage", "graded"}, "3");
  CHECK_MESSAGE(res.status == 0, res.describe());
  res = run_with_channel({"feedback", "done?"}, "3");
  CHECK_MESSAGE(res.status == 0, res.describe());
  CHECK(contains(res.out, "\"data\":\"done?!\""));
  auto got = ch.received();
  REQUIRE(got.size() == 2);
  REQUIRE(got[0]);
  CHECK(got[0]->text == "graded");
  CHECK(node.received().empty());
  // A CHRONUS_FD that is not one: exit 1, saying so.
  res = run_with_channel({"stage", "x"}, "9");
  CHECK(res.status == 1);
  CHECK_MESSAGE(contains(res.err, "CHRONUS_FD=9 is not a Chronus channel"), res.describe());
  res = run_with_channel({"stage", "x"}, "three");
  CHECK(res.status == 1);
  CHECK_MESSAGE(contains(res.err, "is not a descriptor number"), res.describe());
}

// ---- the node's end of a trusted channel (runtime/chronus_endpoint) ---------------

namespace {

// Sends `bytes` over `channel` with the descriptors `fds` attached.
bool send_with_fds(int channel, std::string_view bytes, std::vector<int> fds) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * (fds.empty() ? 1 : fds.size())));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  return ::sendmsg(channel, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// The one reply on `conn` (waits a generous while: a hang guard), or "".
std::string reply_on(int conn) {
  pollfd p{conn, POLLIN, 0};
  if (::poll(&p, 1, 30'000) != 1)
    return "";
  std::string buf(dsec::chronus_max_frame, '\0');
  auto n = ::recv(conn, buf.data(), buf.size(), MSG_DONTWAIT);
  buf.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return buf;
}

// A fresh socketpair: [0] ours, [1] the end we hand over.
std::pair<unique_fd, unique_fd> seqpacket_pair() {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  return {unique_fd{sv[0]}, unique_fd{sv[1]}};
}

} // namespace

TEST_CASE("the endpoint serves each connection a trusted channel carries, and refuses the rest") {
  auto io = dsec::reactor::start();
  REQUIRE_MESSAGE(io, io.error_value().to_string());
  // Declared before the endpoint, so they outlive the reactor thread that
  // calls back into them even when a REQUIRE below unwinds.
  std::mutex mu;
  std::vector<dsec::chronus_event> events;
  dsec::chronus_endpoint::config cfg;
  cfg.max_trusted_connections = 4;
  dsec::chronus_endpoint ep(**io, cfg);
  auto [node_end, channel] = seqpacket_pair();
  ep.add("box", unique_fd{}, std::move(node_end), token(), [&](std::string ev) {
    auto e = dsec::decode_event(dsec::as_bytes(ev));
    REQUIRE(e);
    std::lock_guard lock(mu);
    events.push_back(*e);
  });
  auto stage = [](const std::string& name) {
    chronus_request r;
    r.kind = chronus_kind::stage;
    r.text = name;
    return dsec::encode_request(chronus_token{}, r); // any token: not looked at
  };
  auto kind_of = [](const std::string& reply) {
    auto r = dsec::decode_reply(dsec::as_bytes(reply));
    REQUIRE_MESSAGE(r, "reply of " << reply.size() << " bytes");
    return r->kind;
  };

  // A connection opened the proper way: its frames need no token.
  auto [a, a_node] = seqpacket_pair();
  REQUIRE(send_with_fds(channel.get(), dsec::chronus_channel_hello, {a_node.get()}));
  a_node.reset();
  auto frame = stage("over the channel");
  REQUIRE(::send(a.get(), frame.data(), frame.size(), MSG_NOSIGNAL) > 0);
  CHECK(kind_of(reply_on(a.get())) == dsec::chronus_reply_kind::ack);

  // What else may come on the channel is refused and its descriptors closed:
  // other bytes, no descriptor, two, one that is not a SOCK_SEQPACKET socket.
  auto before = ep.stats();
  auto [b, b_node] = seqpacket_pair();
  REQUIRE(send_with_fds(channel.get(), "hello", {b_node.get()}));
  REQUIRE(send_with_fds(channel.get(), dsec::chronus_channel_hello, {}));
  auto [c1, c1_node] = seqpacket_pair();
  auto [c2, c2_node] = seqpacket_pair();
  REQUIRE(send_with_fds(channel.get(), dsec::chronus_channel_hello,
                        {c1_node.get(), c2_node.get()}));
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  unique_fd pipe_r{p[0]}, pipe_w{p[1]};
  REQUIRE(send_with_fds(channel.get(), dsec::chronus_channel_hello, {pipe_r.get()}));
  b_node.reset();
  c1_node.reset();
  c2_node.reset();
  pipe_r.reset();
  // Refused ones hang up: our ends read EOF (the node kept nothing of them).
  for (int fd : {b.get(), c1.get(), c2.get()}) {
    pollfd q{fd, POLLIN, 0};
    REQUIRE(::poll(&q, 1, 30'000) == 1);
    char x;
    CHECK(::recv(fd, &x, 1, MSG_DONTWAIT) == 0);
  }
  // No events asked for: poll waits for POLLERR alone (a pipe is writable
  // long before its last reader goes).
  pollfd q{pipe_w.get(), 0, 0};
  REQUIRE(::poll(&q, 1, 30'000) == 1);
  CHECK((q.revents & POLLERR) != 0); // no reader left
  auto after = ep.stats();
  CHECK(after.malformed == before.malformed + 4);

  // Its own cap: 4 open trusted connections here; the next one hears why.
  std::vector<unique_fd> held;
  for (int i = 0; i < 3; ++i) { // with a: 4
    auto [mine, theirs] = seqpacket_pair();
    REQUIRE(send_with_fds(channel.get(), dsec::chronus_channel_hello, {theirs.get()}));
    held.push_back(std::move(mine));
  }
  auto [x, x_node] = seqpacket_pair();
  REQUIRE(send_with_fds(channel.get(), dsec::chronus_channel_hello, {x_node.get()}));
  x_node.reset();
  auto refusal = reply_on(x.get());
  auto r = dsec::decode_reply(dsec::as_bytes(refusal));
  REQUIRE(r);
  CHECK(r->kind == dsec::chronus_reply_kind::rejected);
  CHECK(contains(r->reason, "too many trusted"));
  // The first connection still works, and nothing refused made an event.
  frame = stage("still here");
  REQUIRE(::send(a.get(), frame.data(), frame.size(), MSG_NOSIGNAL) > 0);
  CHECK(kind_of(reply_on(a.get())) == dsec::chronus_reply_kind::ack);
  std::lock_guard lock(mu);
  REQUIRE(events.size() == 2);
  CHECK(events[0].text == "over the channel");
  CHECK(events[1].text == "still here");
  CHECK(events[0].sandbox_id == "box");
}

TEST_CASE("the fuzz seed corpus holds what its names say") {
  if (const char* out = std::getenv("DSEC_FUZZ_CORPUS_OUT")) {
    for (const auto& [name, bytes] : corpus_files()) {
      std::ofstream f(std::string(out) + "/" + name, std::ios::binary | std::ios::trunc);
      f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      REQUIRE(f.good());
    }
  }
  const char* dir = std::getenv("DSEC_FUZZ_CORPUS");
  REQUIRE_MESSAGE(dir != nullptr, "DSEC_FUZZ_CORPUS is not set (run through meson test)");
  auto want = corpus_files();
  auto tok = *chronus_token::from_hex(fuzz_token_hex);
  std::vector<std::string> names;
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir), ::closedir);
  REQUIRE(d);
  while (auto* e = ::readdir(d.get()))
    if (e->d_name[0] != '.')
      names.emplace_back(e->d_name);
  CHECK(names.size() == want.size());
  for (const auto& name : names) {
    CAPTURE(name);
    auto bytes = read_file(std::string(dir) + "/" + name);
    REQUIRE(want.count(name) == 1);
    CHECK(bytes == want[name]); // the encoders still write what was committed
    auto b = dsec::as_bytes(bytes);
    bool ok = name.rfind("ok-", 0) == 0;
    auto kind = name.substr(name.find('-') + 1);
    if (kind.rfind("request", 0) == 0) {
      CHECK(static_cast<bool>(dsec::decode_request(b, tok)) == ok);
    } else if (kind.rfind("event", 0) == 0) {
      CHECK(static_cast<bool>(dsec::decode_event(b)) == ok);
    } else if (kind.rfind("feedback", 0) == 0) {
      CHECK(static_cast<bool>(dsec::decode_feedback(b)) == ok);
    } else if (kind.rfind("reply", 0) == 0) {
      CHECK(static_cast<bool>(dsec::decode_reply(b)) == ok);
      struct chronus_reply c;
      CHECK((c_decode(bytes, &c) == 0) == ok);
    } else {
      FAIL("a corpus file of no known kind: " << name);
    }
  }
}

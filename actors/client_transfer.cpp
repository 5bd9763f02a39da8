// Streamed transfers (issue 20; actors/transfer.hpp, docs/actors.md
// "Transfers"): put_from and get_into, over a process handle whose tar the
// sandbox runs (exec_request.transfer). A put writes its source in pieces,
// each once the daemon took the one before; a get's pieces wait in a queue
// that the sandbox's window bounds, and each is credited once the sink took
// it. Both run on the calling thread; the whole-buffer put and get are thin
// wrappers.
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "actors/client.hpp"
#include "actors/client_request.hpp"
#include "actors/transfer.hpp"

namespace dsec {

using namespace detail;

source_fn fd_source(int fd) {
  return [fd](char* buf, size_t size) -> expected<size_t> {
    for (;;) {
      auto n = ::read(fd, buf, size);
      if (n >= 0)
        return static_cast<size_t>(n);
      if (errno != EINTR)
        return sys_error("reading the transfer's source");
    }
  };
}

sink_fn fd_sink(int fd) {
  return [fd](std::string_view data) -> expected<void> {
    while (!data.empty()) {
      auto n = ::write(fd, data.data(), data.size());
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        return sys_error("writing the transfer's destination");
      data.remove_prefix(static_cast<size_t>(n));
    }
    return {};
  };
}

namespace {

// The end of a transfer whose stdin or sink failed: the daemon's error (a
// tar that refused, a missing directory) says more than the closed pipe.
error transfer_end_error(process& p, error mine) {
  if (!p.wait_for(std::chrono::seconds(5)))
    return mine;
  auto end = p.wait();
  if (!end)
    return end.error_value();
  return mine;
}

template <class Start>
expected<uint64_t> put_through(Start&& start, const std::string& dir, const source_fn& src) {
  exec_request req;
  req.transfer = transfer_put;
  req.transfer_path = dir;
  req.open_stdin = true;
  auto p = start(req, output_fn{});
  auto eid = p->id();
  if (!eid) {
    // It never ran: the daemon's error, or (a resumed session's log
    // answered it) its logged end, which succeeded.
    auto end = p->wait();
    if (!end)
      return end.error_value();
    return uint64_t{0};
  }
  std::string buf(transfer_piece, '\0');
  uint64_t total = 0;
  for (;;) {
    auto n = src(buf.data(), buf.size());
    if (!n) {
      p->cancel(); // the daemon kills its tar
      return std::move(n).error_value();
    }
    if (*n == 0)
      break;
    if (auto w = p->write(std::string_view{buf.data(), *n}); !w)
      return transfer_end_error(*p, std::move(w).error_value());
    total += *n;
  }
  if (auto c = p->close_stdin(); !c)
    return transfer_end_error(*p, std::move(c).error_value());
  auto end = p->wait();
  if (!end)
    return end.error_value();
  return total;
}

// The pieces of a get on their way from the helper actor to the consumer.
struct get_queue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> pieces;
  bool ended = false;
};

template <class Start>
expected<uint64_t> get_through(Start&& start, const std::string& path, const sink_fn& sink) {
  exec_request req;
  req.transfer = transfer_get;
  req.transfer_path = path;
  req.window = transfer_window;
  auto q = std::make_shared<get_queue>();
  auto p = start(req, [q](uint8_t stream, std::string_view data) {
    if (stream != 1)
      return;
    {
      std::lock_guard<std::mutex> g{q->mu};
      q->pieces.emplace_back(data);
    }
    q->cv.notify_one();
  }, [q](const expected<exec_result>&) {
    {
      std::lock_guard<std::mutex> g{q->mu};
      q->ended = true;
    }
    q->cv.notify_one();
  });
  uint64_t total = 0;
  for (;;) {
    std::string piece;
    {
      std::unique_lock<std::mutex> lk{q->mu};
      q->cv.wait(lk, [&] { return !q->pieces.empty() || q->ended; });
      if (q->pieces.empty())
        break; // ended, and every piece (sent before the end) taken
      piece = std::move(q->pieces.front());
      q->pieces.pop_front();
    }
    if (auto r = sink(piece); !r) {
      p->cancel(); // the daemon kills its tar
      return std::move(r).error_value();
    }
    total += piece.size();
    p->credit(piece.size());
  }
  auto end = p->wait();
  if (!end)
    return end.error_value();
  return total;
}

source_fn string_source(const std::string& s) {
  auto off = std::make_shared<size_t>(0);
  return [&s, off](char* buf, size_t size) -> expected<size_t> {
    size_t n = std::min(size, s.size() - *off);
    std::copy_n(s.data() + *off, n, buf);
    *off += n;
    return n;
  };
}

} // namespace

expected<uint64_t> client::put_from(const std::string& id, const std::string& dir,
                                    const source_fn& src) {
  return put_through(
    [&](const exec_request& req, output_fn out) { return start(id, req, std::move(out)); }, dir,
    src);
}

expected<uint64_t> client::get_into(const std::string& id, const std::string& path,
                                    const sink_fn& sink) {
  return get_through(
    [&](const exec_request& req, output_fn out, completion<exec_result> end = {}) {
      return start(id, req, std::move(out), std::move(end));
    },
    path, sink);
}

expected<uint64_t> session::put_from(const std::string& id, const std::string& dir,
                                     const source_fn& src) {
  return put_through(
    [&](const exec_request& req, output_fn out) { return start(id, req, std::move(out)); }, dir,
    src);
}

expected<uint64_t> session::get_into(const std::string& id, const std::string& path,
                                     const sink_fn& sink) {
  return get_through(
    [&](const exec_request& req, output_fn out, completion<exec_result> end = {}) {
      return start(id, req, std::move(out), std::move(end));
    },
    path, sink);
}

// The whole-buffer forms.

expected<uint64_t> client::put(const std::string& id, const std::string& dir, std::string tar) {
  if (tar.size() <= transfer_single)
    return blocking<uint64_t>([&](auto& w) { put_async(id, dir, std::move(tar), w.done()); });
  auto r = put_from(id, dir, string_source(tar));
  if (r && *r == 0) // answered from a resumed session's log
    return static_cast<uint64_t>(tar.size());
  return r;
}

expected<std::string> client::get(const std::string& id, const std::string& path) {
  std::string out;
  auto r = get_into(id, path, [&](std::string_view d) -> expected<void> {
    out += d;
    return {};
  });
  if (!r)
    return std::move(r).error_value();
  return out;
}

expected<uint64_t> session::put(const std::string& id, const std::string& dir, std::string tar) {
  if (tar.size() <= transfer_single)
    return blocking<uint64_t>([&](auto& w) { put_async(id, dir, std::move(tar), w.done()); });
  auto r = put_from(id, dir, string_source(tar));
  if (r && *r == 0)
    return static_cast<uint64_t>(tar.size());
  return r;
}

expected<std::string> session::get(const std::string& id, const std::string& path) {
  std::string out;
  auto r = get_into(id, path, [&](std::string_view d) -> expected<void> {
    out += d;
    return {};
  });
  if (!r)
    return std::move(r).error_value();
  return out;
}

} // namespace dsec

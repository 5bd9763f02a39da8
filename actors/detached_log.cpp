#include "actors/detached_log.hpp"

#include <algorithm>

namespace dsec {

namespace {

// Consecutive output of one command on one stream joins the last piece up to
// this size, so that a chatty command makes few pieces.
constexpr size_t join_up_to = 64 * 1024;
constexpr size_t command_text = 256;

} // namespace

void detached_log::begin(uint64_t exec, const std::vector<std::string>& argv, uint64_t now_ms) {
  record r;
  r.c.exec = exec;
  r.c.started_ms = now_ms;
  for (const auto& a : argv) {
    if (r.c.command.size() >= command_text)
      break;
    if (!r.c.command.empty())
      r.c.command += ' ';
    r.c.command.append(a, 0, command_text - std::min(command_text, r.c.command.size()));
  }
  if (first_ == 0)
    first_ = exec;
  records_.push_back(std::move(r));
  // Bounded: the oldest record that is neither the first nor live goes.
  while (records_.size() > max_records) {
    auto it = std::find_if(records_.begin(), records_.end(), [&](const record& x) {
      return x.c.exec != first_ && !live(x, true);
    });
    if (it == records_.end())
      break; // all live: they are bounded by the commands a sandbox may run
    records_.erase(it);
  }
}

void detached_log::forget(uint64_t exec) {
  std::erase_if(records_, [&](const record& r) { return r.c.exec == exec; });
  if (first_ == exec)
    first_ = 0;
}

detached_log::record* detached_log::find(uint64_t exec) {
  for (auto& r : records_)
    if (r.c.exec == exec)
      return &r;
  return nullptr;
}

const detached_log::record* detached_log::find(uint64_t exec) const {
  for (const auto& r : records_)
    if (r.c.exec == exec)
      return &r;
  return nullptr;
}

bool detached_log::owns(uint64_t exec) const {
  return find(exec) != nullptr;
}

void detached_log::append(uint64_t exec, uint8_t stream, std::string_view data) {
  if (data.empty())
    return;
  if (!pieces_.empty()) {
    auto& last = pieces_.back().p;
    if (last.exec == exec && last.stream == stream && last.data.size() + data.size() <= join_up_to) {
      last.data.append(data);
      end_ += data.size();
      held_ += data.size();
      charged_ += data.size();
      data = {};
    }
  }
  if (!data.empty()) {
    pieces_.push_back({end_, log_piece{exec, stream, std::string{data}}});
    end_ += data.size();
    held_ += data.size();
    charged_ += data.size() + piece_overhead;
  }
  // The oldest bytes go: whole pieces, then the front of the oldest one left,
  // so that the log holds exactly the latest bytes its bound allows.
  while (charged_ > cap_ && !pieces_.empty()) {
    auto& front = pieces_.front();
    uint64_t excess = charged_ - cap_;
    uint64_t n = front.p.data.size();
    if (excess >= n) {
      held_ -= n;
      charged_ -= n + piece_overhead;
      pieces_.pop_front();
    } else {
      front.p.data.erase(0, excess);
      front.pos += excess;
      held_ -= excess;
      charged_ -= excess;
    }
  }
}

void detached_log::closed(uint64_t exec, uint8_t stream) {
  if (auto* r = find(exec))
    (stream == 1 ? r->out_open : r->err_open) = false;
}

void detached_log::exited(uint64_t exec, int32_t exit_code, int32_t signal, bool timed_out,
                          uint64_t now_ms) {
  auto* r = find(exec);
  if (!r)
    return;
  r->c.running = false;
  r->c.ended_ms = now_ms;
  r->c.exit_code = exit_code;
  r->c.signal = signal;
  r->c.timed_out = timed_out;
}

bool detached_log::live(const record& r, bool output) const {
  return r.c.running || (output && (r.out_open || r.err_open));
}

bool detached_log::live(const logs_request& q) const {
  for (const auto& r : records_)
    if ((q.exec == 0 || r.c.exec == q.exec) && live(r, q.output))
      return true;
  return false;
}

logs_reply detached_log::read(const logs_request& q) const {
  logs_reply out;
  for (const auto& r : records_)
    if (q.exec == 0 || r.c.exec == q.exec) {
      out.commands.push_back(r.c);
      out.commands.back().open = r.out_open || r.err_open;
    }
  out.live = live(q);
  if (!q.output) {
    out.next = end_;
    return out;
  }
  uint64_t begin = pieces_.empty() ? end_ : pieces_.front().pos;
  uint64_t from = std::min(std::max(q.since, begin), end_); // a position past the end: the end
  if (q.since < begin)
    out.dropped = begin - q.since;
  out.next = from;
  if (from == end_)
    return out;
  // The first piece that holds a byte at `from` or later.
  auto it = std::upper_bound(pieces_.begin(), pieces_.end(), from,
                             [](uint64_t pos, const piece_at& p) { return pos < p.pos; });
  if (it != pieces_.begin())
    --it;
  uint64_t budget = q.max_bytes == 0 ? UINT64_MAX : q.max_bytes;
  for (; it != pieces_.end(); ++it) {
    const auto& [pos, p] = *it;
    uint64_t piece_end = pos + p.data.size();
    if (piece_end <= from)
      continue;
    uint64_t skip = from > pos ? from - pos : 0;
    if (q.exec != 0 && p.exec != q.exec) {
      out.next = piece_end; // not asked for: passed over
      continue;
    }
    if (budget == 0)
      break;
    uint64_t take = std::min<uint64_t>(p.data.size() - skip, budget);
    out.pieces.push_back(log_piece{p.exec, p.stream, p.data.substr(skip, take)});
    budget -= take;
    out.next = pos + skip + take;
    if (take < p.data.size() - skip)
      break;
  }
  return out;
}

bool detached_log::has_news(const logs_request& q) const {
  if (!live(q))
    return true;
  if (!q.output)
    return false;
  // A piece of the command asked about that ends after `since`: from the
  // newest back, without building a reply.
  for (auto it = pieces_.rbegin(); it != pieces_.rend() && it->pos + it->p.data.size() > q.since;
       ++it)
    if (q.exec == 0 || it->p.exec == q.exec)
      return true;
  return false;
}

} // namespace dsec

// The session actor's trajectory log (see actors/session_state.hpp; the session
// is one actor, assembled from session.cpp, this file and session_replay.cpp):
// appending records and syncing them in batches, commands and puts whose results
// are logged with a pack of the sandbox after them, and Chronus events logged
// before they go to the watchers.
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "actors/session_state.hpp"
#include "runtime/log.hpp"

namespace dsec::session_detail {

// Appends a record; `then` runs once it is durable (after the batch's fsync).
void commit(self_ptr self, const trajectory_record& rec, std::function<void()> then) {
  auto& s = self->state;
  if (!s.log) {
    if (then)
      then();
    return;
  }
  if (auto r = s.log->append(encode_record(rec)); !r)
    log::write(log::level::error, "trajectory", r.error_value().message, {{"session", s.cfg.id}});
  if (then)
    s.after_sync.push_back(std::move(then));
  if (!s.flush_scheduled) {
    // Behind every message already in the mailbox: they join this batch.
    s.flush_scheduled = true;
    self->send(self, flush_atom::value, process_key());
  }
}

// Appends a record that nobody waits for (a Chronus event, an answer): the
// next commit's fsync makes it durable, and the steps it belongs before come
// after it in the log.
void append_only(self_ptr self, const trajectory_record& rec) {
  auto& s = self->state;
  if (!s.log)
    return;
  if (auto r = s.log->append(encode_record(rec)); !r)
    log::write(log::level::error, "trajectory", r.error_value().message, {{"session", s.cfg.id}});
}

void flush(self_ptr self) {
  auto& s = self->state;
  s.flush_scheduled = false;
  if (s.log) {
    if (auto r = s.log->sync(); !r)
      log::write(log::level::error, "trajectory", r.error_value().message, {{"session", s.cfg.id}});
  }
  auto waiting = std::move(s.after_sync);
  s.after_sync.clear();
  for (auto& f : waiting)
    f();
}

expected<void> open_log(self_ptr self) {
  auto& s = self->state;
  s.dir = trajectory_dir(s.cfg.trajectories, s.cfg.id);
  std::error_code ec;
  std::filesystem::create_directories(s.dir + "/packs", ec);
  if (ec)
    return make_error(errc::system_error, "creating " + s.dir + "/packs: " + ec.message());
  DSEC_TRY(f, trajectory_file::open(s.dir + "/log", true, nullptr, trajectory_format));
  s.log.emplace(std::move(f));
  trajectory_record rec;
  if (s.cfg.resume) {
    rec.kind = trajectory_record::resumed;
  } else {
    rec.kind = trajectory_record::opened;
    rec.options = s.cfg.options;
  }
  DSEC_TRY_VOID(s.log->append(encode_record(rec)));
  return s.log->sync();
}

// ---- logged commands ----------------------------------------------------------

// Packs sandbox `sb`'s writable layer after step `rec`, logs the step with
// its pack (or why there is none), and calls `done` once that is durable.
// If the session is closing (the sandbox went first) the step is not logged
// and a resume runs it again on the state before; if the sandbox's node is
// lost first, `lost` runs instead and the step is not logged either (a
// resume rebuilds the sandbox from the pack before, where the trainer's
// step runs once).
void pack_and_log(self_ptr self, const sandbox_actor& sb, trajectory_record rec,
                  std::function<void()> done, std::function<void(const error&)> lost) {
  auto& s = self->state;
  auto pack = rec.sandbox + "-" + std::to_string(s.next_pack++) + ".pack";
  ask<internal_key, std::string>(
    self, sb, sb,
    [=](internal_key& k, std::string& manifest) mutable {
      if (!genuine(k, self->state.cfg.key, "a reply to pack")) {
        rec.pack_error = "the reply to the pack was not the sandbox's (no key)";
        return commit(self, rec, done);
      }
      if (manifest.empty())
        rec.pack = pack;
      else
        rec.pack_inline = std::move(manifest);
      commit(self, rec, done);
    },
    [=](caf::error& e) mutable {
      if (self->state.closing)
        return done();
      rec.pack_error = from_caf(e).message;
      commit(self, rec, done);
    },
    std::move(lost), pack_atom::value, s.cfg.key, pack);
}

// Runs a command in a live sandbox of a session with a log: its result is
// logged (with a pack after it unless it is idempotent) and delivered once
// durable. Streamed output goes to `requester` through a relay actor.
void logged_exec(self_ptr self, const std::string& id, sandbox_actor sb, exec_request req,
                 caf::strong_actor_ptr requester, caf::typed_response_promise<exec_result> rp) {
  // A streamed command's copy of its output, for the log.
  auto kept = req.stream ? std::make_shared<kept_output>() : nullptr;
  auto on_result = [=](exec_result& r) mutable {
    trajectory_record rec;
    rec.kind = trajectory_record::executed;
    rec.sandbox = id;
    rec.req = req;
    rec.req.stream = false;
    rec.req.timeout_ms = 0;
    rec.result = r;
    if (req.stream) {
      // The relay collected the streamed output for the log; the requester
      // has had it already, as it came, all of it. The log's copy is cut at
      // max_output per stream: then its result says truncated, which a
      // replay of it from the log reports.
      rec.result.truncated = r.truncated || kept->truncated;
      r.out.clear();
      r.err.clear();
    }
    if (req.idempotent || req.detach) {
      commit(self, rec, [rp, r]() mutable { rp.deliver(std::move(r)); });
      return;
    }
    pack_and_log(
      self, sb, std::move(rec), [rp, r]() mutable { rp.deliver(std::move(r)); },
      [rp](const error& e) mutable { rp.deliver(to_caf(e)); });
  };
  auto fail = [rp](caf::error& e) mutable { rp.deliver(e); };
  // A handle's command tells whoever asked its id (and dies with it): the
  // relay, which forwards that too.
  if (!req.stream && !req.handle) {
    ask<exec_result>(
      self, sb, sb, on_result, fail, [rp](const error& e) mutable { rp.deliver(to_caf(e)); },
      exec_atom::value, self->state.cfg.key, req);
    return;
  }
  // The sandbox streams to whoever asked: a relay that forwards the chunks
  // and hands the result back here to be logged, with a copy of the output
  // (up to max_output per stream, as a collected command would) for the log.
  auto relay = spawn_relay(self, sb, requester, kept, req.max_output);
  ask<exec_result>(
    self, sb, relay, on_result, fail,
    [rp, relay](const error& e) mutable {
      caf::anon_send_exit(relay, caf::exit_reason::kill);
      rp.deliver(to_caf(e));
    },
    exec_atom::value, process_key(), req);
}

void logged_put(self_ptr self, const std::string& id, sandbox_actor sb, std::string dir,
                std::string tar, caf::typed_response_promise<uint64_t> rp) {
  auto digest = put_digest(tar);
  auto lost = [rp](const error& e) mutable { rp.deliver(to_caf(e)); };
  ask<uint64_t>(
    self, sb, sb,
    [=](uint64_t size) mutable {
      trajectory_record rec;
      rec.kind = trajectory_record::put;
      rec.sandbox = id;
      rec.dir = dir;
      rec.digest = digest;
      rec.size = size;
      pack_and_log(self, sb, std::move(rec), [rp, size]() mutable { rp.deliver(size); }, lost);
    },
    [rp](caf::error& e) mutable { rp.deliver(e); }, lost, put_atom::value, self->state.cfg.key,
    dir, std::move(tar));
}

// A live sandbox's new egress policy: set, then logged (durable before the
// trainer hears it took effect), so that a resume answers the same change
// from the log and rebuilds the sandbox with it.
void logged_network(self_ptr self, const std::string& id, sandbox_actor sb,
                    std::vector<std::string> allow, std::vector<std::string> deny,
                    caf::typed_response_promise<bool> rp) {
  ask<bool>(
    self, sb, sb,
    [=](bool ok) mutable {
      trajectory_record rec;
      rec.kind = trajectory_record::network;
      rec.sandbox = id;
      rec.env.allow = allow;
      rec.env.deny = deny;
      commit(self, rec, [rp, ok]() mutable { rp.deliver(ok); });
    },
    [rp](caf::error& e) mutable { rp.deliver(e); },
    [rp](const error& e) mutable { rp.deliver(to_caf(e)); }, network_atom::value,
    self->state.cfg.key, allow, deny);
}

// An event from a sandbox: logged (to be replayed by a resume, before the
// step that follows it), then handed to the watchers. A sandbox being
// rebuilt runs logged commands again, whose events were sent (and replayed)
// already: theirs are dropped.
void sandbox_event(self_ptr self, chronus_event_msg ev) {
  auto& s = self->state;
  if (!s.replay.empty()) {
    if (auto d = decode_event(as_bytes(ev.bytes))) {
      auto it = s.replay.find(d->sandbox_id);
      if (it != s.replay.end() && it->second.materializing)
        return;
    }
  }
  if (s.log) {
    trajectory_record rec;
    rec.kind = trajectory_record::event;
    rec.bytes = ev.bytes;
    append_only(self, rec);
  }
  publish_event(self, std::move(ev));
}

} // namespace dsec::session_detail

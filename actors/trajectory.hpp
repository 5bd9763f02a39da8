// The trajectory log of a session (docs/trajectory.md): what the session did,
// record by record, in <state dir>/trajectories/<session id>/log (framed by
// runtime/trajectory.hpp), with the packs of its sandboxes' writable layers in
// packs/ and their contents in blobs/ beside it.
//
// A record is a trajectory_record serialized with CAF's binary serializer.
// Reading a log gives a trajectory_plan: per sandbox, its environment and the
// commands (and puts) it ran in order, each with its result and the pack
// taken after it; resume answers a trainer from it (actors/session.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "actors/messages.hpp"
#include "runtime/error.hpp"

namespace dsec {

struct trajectory_record {
  enum kind : uint8_t {
    opened = 1,    ///< the session: options
    created = 2,   ///< a sandbox: id, env, group, group_count
    executed = 3,  ///< a command: sandbox, req, result, pack
    put = 4,       ///< an upload: sandbox, dir, digest, size, pack
    destroyed = 5, ///< sandbox destroyed by the trainer
    truncated = 6, ///< sandbox went live on resume after `position` of its steps:
                   ///< the ones after that are void
    resumed = 7,   ///< the session was resumed
    failed = 8,    ///< a sandbox of `group` could not be created: fail_code, fail_message
    event = 9,     ///< a Chronus event a sandbox sent: bytes (Event; its sandbox is inside)
    answered = 10, ///< the trainer's answer to a feedback request: sandbox, bytes (Feedback)
    network = 11,  ///< a new egress policy of a sandbox: sandbox, env.allow, env.deny; it
                   ///< holds from the steps logged after it (and a rebuild after them)
  };
  uint8_t kind = 0;
  std::string sandbox;
  session_options options;
  environment env;
  uint64_t group = 0;       ///< which create call (created, failed)
  uint32_t group_count = 0; ///< how many it asked for
  exec_request req;         ///< stream, detach and timeout cleared
  exec_result result;
  std::string dir;          ///< put: the directory
  std::string digest;       ///< put: hex SHA-256 of the tar archive
  uint64_t size = 0;        ///< put: its size
  std::string pack;         ///< executed/put: the pack taken after it (file name in packs/)
  std::string pack_inline;  ///< executed/put: or the pack's manifest itself, when small
  std::string pack_error;   ///< executed/put: why none could be taken
  uint64_t position = 0;    ///< truncated
  // (fields added later go at the end, so that the records above keep their layout)
  std::string key;          ///< created: the sandbox's key (create_labels)
  std::string group_key;    ///< created/failed: the key of its create call
  std::map<std::string, std::string> tags; ///< created: its create's tags
  uint8_t fail_code = 0;    ///< failed: the errc
  std::string fail_message; ///< failed: why
  std::string bytes;        ///< event: Event bytes; answered: Feedback bytes
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, trajectory_record& x) {
  return f(caf::meta::type_name("dsec.trajectory_record"), x.kind, x.sandbox, x.options, x.env,
           x.group, x.group_count, x.req, x.result, x.dir, x.digest, x.size, x.pack,
           x.pack_inline, x.pack_error, x.position, x.key, x.group_key, x.tags, x.fail_code,
           x.fail_message, x.bytes);
}

/// The payload format of the logs this dsecd writes and reads (the header
/// names it; runtime/trajectory.hpp). Bump it whenever the serialized form of
/// trajectory_record changes: a field of it or of a type in it
/// (session_options, environment, exec_request, exec_result, ...) added,
/// removed or reordered. A log of another format is refused with both
/// numbers, never misread. The trajectory suite pins the size of a default
/// record, so that a change which forgets the bump fails there.
/// 2: host_mount gained recursive and idmap.
inline constexpr uint32_t trajectory_format = 2;

std::string encode_record(const trajectory_record& r);
expected<trajectory_record> decode_record(std::string_view bytes);

/// What a log says happened, arranged for replay.
struct trajectory_plan {
  session_options options;
  /// A Chronus event of a sandbox, replayed when the step it came before is
  /// answered from the log.
  struct event {
    size_t position = 0;  ///< the box's steps logged before it
    uint64_t seq = 0;
    std::string bytes;    ///< Event
    std::string answer;   ///< the trainer's Feedback to it, if it was a request and answered
    bool feedback = false; ///< a feedback request
  };
  struct box {
    std::string id;
    environment env;
    uint64_t group = 0;
    std::vector<trajectory_record> steps; ///< executed and put, in order
    size_t logged = 0; ///< steps in the log (more than `steps` after a failed pack)
    bool destroyed = false;
    std::string key;       ///< its key (create_labels)
    std::string group_key; ///< its create's key
    std::map<std::string, std::string> tags;
    std::vector<event> events; ///< in order; only those before a logged step are kept
    /// Its egress policy changes, in order, each after `position` of its steps.
    struct policy {
      size_t position = 0;
      std::vector<std::string> allow, deny;
    };
    std::vector<policy> policies;
  };
  std::vector<box> boxes; ///< in creation order
  struct group {
    uint64_t number = 0;
    environment env;
    uint32_t count = 0;            ///< asked for
    std::vector<std::string> ids;  ///< created, in order
    std::string key;               ///< the create's key ("#N" if it gave none)
    std::vector<std::string> keys; ///< of ids, in order
    std::map<std::string, std::string> tags;
    std::vector<error> failures;   ///< sandboxes it asked for that could not be made
  };
  std::vector<group> groups;       ///< in order
  uint64_t next_group = 1;
  uint64_t records = 0;
  uint64_t torn_bytes = 0;         ///< a torn tail left out
  uint64_t events = 0;             ///< Chronus events kept for replay
};

/// Reads and arranges the log of session `id` under `root` (the trajectories dir).
expected<trajectory_plan> load_trajectory(const std::string& root, const std::string& id);

/// Removes the logs under `root` not written for longer than `keep` and not
/// of a session for which `live` says true; returns what it removed, as
/// "the trajectory log of session ID (unused for DURATION)".
std::vector<std::string> expire_trajectories(const std::string& root, std::chrono::milliseconds keep,
                                             const std::function<bool(const std::string&)>& live);

/// The files of a session's log.
inline std::string trajectory_dir(const std::string& root, const std::string& id) {
  return root + "/" + id;
}

/// Whether a step has a pack after it (in a file or in the record).
inline bool has_pack(const trajectory_record& r) {
  return !r.pack.empty() || !r.pack_inline.empty();
}

/// Whether a command given again matches the logged one: same argv, env, cwd,
/// user, input and trust (timeout, streaming and output limit do not matter).
bool same_command(const exec_request& a, const exec_request& b);
/// The hex SHA-256 by which a put is recognised again: of the tar archive
/// with its modification times left out (the mtime and checksum fields of
/// each ustar/GNU header, and mtime/atime/ctime records of pax headers), so
/// that the same files put again later match. An archive that does not parse
/// as tar is taken whole.
std::string put_digest(const std::string& tar);

} // namespace dsec

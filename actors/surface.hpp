// surface: what tells dsec's own messages from a client's (docs/security.md,
// "Who may send what").
//
// Every connection to a dsecd reaches every actor of its process that was ever
// named over a connection (CAF's BASP looks the receiver up by its numeric id,
// and ids are small and sequential), and the sender a message claims is the
// peer's word. So neither the actor a handle points to nor the sender decides
// what a message may do. What does is data only genuine senders have:
//
//   - every internal verb carries an internal_key as its first argument after
//     the atom, and the receiver checks it with genuine() before it does
//     anything; a message without the right key is refused (errc::unauthorized,
//     counted in node_stats.refused_internal);
//   - the replies to internal requests that the requester acts on carry the key
//     too (CAF matches a response by its message id alone, which a peer can
//     guess), checked the same way;
//   - a down message is acted on only when the actor it names has really ended
//     (really_down): a peer can send a down_msg, not end an actor.
//
// Two keys. process_key(): random at start, never in a message that leaves the
// process (timers, the reactor thread, the node and its sandboxes, a session
// and its scheduler). The member key: what the members of a cluster share (the
// cluster key, dsecd --cluster-key FILE), for messages between processes; a
// daemon that is in no cluster uses a random one of its own.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <caf/meta/type_name.hpp>

#include "runtime/error.hpp"

namespace dsec {

/// 256 random bits. Compared only with genuine() (constant time).
struct internal_key {
  uint64_t a = 0, b = 0, c = 0, d = 0;

  /// A new random key (getrandom).
  static internal_key random();
  /// The key as 64 lower-case hex digits (the key file's text).
  [[nodiscard]] std::string to_hex() const;
  /// 64 hex digits; anything else is malformed.
  static expected<internal_key> from_hex(std::string_view text);
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, internal_key& x) {
  return f(caf::meta::type_name("dsec.internal_key"), x.a, x.b, x.c, x.d);
}

/// This process's key: random, made once, never sent to another process.
const internal_key& process_key();

/// Whether `got` is `want`, in constant time. False is counted (see
/// refused_internal) and said on stdout now and then (the 1st, 2nd, 4th, 8th,
/// ... time), naming `what` (the verb and the actor).
bool genuine(const internal_key& got, const internal_key& want, const char* what);

/// Internal messages refused in this process since it started: wrong keys,
/// down messages naming an actor that had not ended, and what a connection may
/// not make CAF do (actors/basp_guard.hpp).
uint64_t refused_internal() noexcept;

/// Counts a refusal that genuine() did not see (a forged down message, one of
/// CAF's own messages from a connection), said on stdout like genuine()'s.
void count_refusal(const char* what);

/// The error an internal verb without the right key is refused with.
error unauthorized(const char* what);

// ---- the cluster key file (dsecd --cluster-key) ---------------------------------

/// Reads the cluster key from `path`: a regular file owned by this process's
/// user, open to neither group nor others, holding 64 hex digits (and perhaps
/// a newline). With `create`, a missing file is made first (0600, a new random
/// key, written to a temporary name and renamed). Errors name the file and
/// what is wrong with it.
expected<internal_key> load_cluster_key(const std::string& path, bool create);

// ---- names that become parts of host paths --------------------------------------

/// A session id, a sandbox id or a pack name that the daemon puts into a path
/// under its own state dir: 1 to 128 of [A-Za-z0-9._-], not starting with '.'
/// (so neither "." nor ".."). `what` names it in the error.
expected<void> check_name(std::string_view name, const char* what);

} // namespace dsec

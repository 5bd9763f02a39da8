// The messages dsec's actors exchange, and the atoms that name them. Every type
// here that crosses a process boundary has an inspect() and is registered on
// both sides by register_types() (actors/types.cpp).
#pragma once

#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/environment.hpp"
#include "runtime/usage.hpp"

namespace dsec {

// ---- atoms (CAF 0.17: at most 10 characters) ---------------------------------
using open_atom = caf::atom_constant<caf::atom("open")>;
using close_atom = caf::atom_constant<caf::atom("close")>;
using create_atom = caf::atom_constant<caf::atom("create")>;
using exec_atom = caf::atom_constant<caf::atom("exec")>;
using destroy_atom = caf::atom_constant<caf::atom("destroy")>;
using put_atom = caf::atom_constant<caf::atom("put")>;
using get_atom = caf::atom_constant<caf::atom("get")>;
using list_atom = caf::atom_constant<caf::atom("list")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using usage_atom = caf::atom_constant<caf::atom("usage")>;
using lookup_atom = caf::atom_constant<caf::atom("lookup")>;
using place_atom = caf::atom_constant<caf::atom("place")>;
using spawn_atom = caf::atom_constant<caf::atom("spawn")>;
using ready_atom = caf::atom_constant<caf::atom("ready")>;
using failed_atom = caf::atom_constant<caf::atom("failed")>;
using gone_atom = caf::atom_constant<caf::atom("gone")>;
using acquire_atom = caf::atom_constant<caf::atom("acquire")>;
using release_atom = caf::atom_constant<caf::atom("release")>;
using output_atom = caf::atom_constant<caf::atom("output")>;
using event_atom = caf::atom_constant<caf::atom("event")>;
using reaped_atom = caf::atom_constant<caf::atom("reaped")>;
using timeout_atom = caf::atom_constant<caf::atom("timeout")>;
using ttl_atom = caf::atom_constant<caf::atom("ttl")>;
using lifetime_atom = caf::atom_constant<caf::atom("lifetime")>;
/// Egress networking (issue 14): a live sandbox's network policy.
using network_atom = caf::atom_constant<caf::atom("network")>;
/// Port exposure (issue 14): a port of a live sandbox forwarded from the node.
using expose_atom = caf::atom_constant<caf::atom("expose")>;
using signal_atom = caf::atom_constant<caf::atom("signal")>;
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using chronus_atom = caf::atom_constant<caf::atom("chronus")>;
using watch_atom = caf::atom_constant<caf::atom("watch")>;
using feedback_atom = caf::atom_constant<caf::atom("feedback")>;
using resume_atom = caf::atom_constant<caf::atom("resume")>;
using pack_atom = caf::atom_constant<caf::atom("pack")>;
using flush_atom = caf::atom_constant<caf::atom("flush")>;
// the cluster (docs/cluster.md)
using join_atom = caf::atom_constant<caf::atom("join")>;
using beat_atom = caf::atom_constant<caf::atom("beat")>;
using lost_atom = caf::atom_constant<caf::atom("lost")>;
using cluster_atom = caf::atom_constant<caf::atom("cluster")>;
using placed_atom = caf::atom_constant<caf::atom("placed")>;
using reset_atom = caf::atom_constant<caf::atom("reset")>;
// layer distribution
using describe_atom = caf::atom_constant<caf::atom("describe")>;
using fetch_atom = caf::atom_constant<caf::atom("fetch")>;
using copy_atom = caf::atom_constant<caf::atom("copy")>;
using source_atom = caf::atom_constant<caf::atom("source")>;
// operating nodes
using cordon_atom = caf::atom_constant<caf::atom("cordon")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
// warm pools and the function backend (actors/warm_pool.hpp)
using pool_atom = caf::atom_constant<caf::atom("pool")>;
using claim_atom = caf::atom_constant<caf::atom("claim")>;
using call_atom = caf::atom_constant<caf::atom("call")>;
using pressure_atom = caf::atom_constant<caf::atom("pressure")>;
// snapshots: pause/resume, pack_diff, fork (issue 16)
using pause_atom = caf::atom_constant<caf::atom("pause")>;
using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using fork_atom = caf::atom_constant<caf::atom("fork")>;
// `dsec session list` (the scheduler's sessions)
using sessions_atom = caf::atom_constant<caf::atom("sessions")>;
// a coordinator restart (docs/cluster.md, "When the coordinator dies")
using adopt_atom = caf::atom_constant<caf::atom("adopt")>;
using orphan_atom = caf::atom_constant<caf::atom("orphan")>;
using held_atom = caf::atom_constant<caf::atom("held")>;
using reattach_atom = caf::atom_constant<caf::atom("reattach")>;
// process handles (issues 20, 23): a running command's stdin
using stdin_atom = caf::atom_constant<caf::atom("stdin")>;
// terminals (issue 23): a running command's window size
using resize_atom = caf::atom_constant<caf::atom("resize")>;
// streamed output's flow control (issue 20): bytes the requester consumed
using credit_atom = caf::atom_constant<caf::atom("credit")>;
/// The output and ends of a sandbox's detached commands (logs_request).
using logs_atom = caf::atom_constant<caf::atom("logs")>;

// ---- what a sandbox is made of --------------------------------------------------

/// An environment (runtime/environment.hpp): the one spec of a sandbox, the
/// value trainers send.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, host_mount& x) {
  return f(caf::meta::type_name("dsec.host_mount"), x.host, x.target, x.read_only, x.recursive,
           x.idmap);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, environment& x) {
  return f(caf::meta::type_name("dsec.environment"), x.base, x.workdir, x.tools, x.memory,
           x.pids, x.cpus, x.disk, x.net, x.ttl_ms, x.backend, x.chronus,
           x.egress, x.allow, x.deny, // networking (issue 14)
           /* snapshots */ x.snapshot,
           /* port exposure */ x.expose,
           /* host mounts */ x.mounts);
}

/// How a session is opened.
struct session_options {
  uint32_t quota = 1024;         ///< most live sandboxes at once
  uint64_t default_ttl_ms = 3'600'000; ///< a sandbox's lifetime unless its environment says
  std::string name;              ///< for `ps`; empty: the session id
  /// Keep a trajectory log (docs/trajectory.md): every create, exec and put
  /// with its result, durably, so that `resume` can rebuild the session's
  /// sandboxes and answer the commands it already ran from the log.
  bool trajectory = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, session_options& x) {
  return f(caf::meta::type_name("dsec.session_options"), x.quota, x.default_ttl_ms, x.name,
           x.trajectory);
}

/// What a create call carries besides its environment (docs/trajectory.md):
/// the trainer's name for it and tags for its sandboxes. A resumed session
/// gives a create the sandboxes its log made for the same key, and never
/// another key's. The sandboxes of a call keyed K are keyed K (count 1) or
/// K#0, K#1, ... in the order they were announced; a call without a key gets
/// "#N" (N: its number in the session).
struct create_labels {
  std::string key;                         ///< empty: dsec picks "#N"
  std::map<std::string, std::string> tags; ///< shown by list(), kept in the log
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, create_labels& x) {
  return f(caf::meta::type_name("dsec.create_labels"), x.key, x.tags);
}

/// Where and how the sandboxes of one create request are made (session ->
/// scheduler -> node).
struct placement {
  uint64_t request = 0;     ///< the session's create request
  std::string session_id;
  uint64_t ttl_ms = 0;      ///< the session's default, for an environment without one
  /// Keep the writable layer reachable for packs (a session with a trajectory log).
  bool keep_upper = false;
  /// A sandbox rebuilt from a trajectory log (count 1): its old id, and the
  /// pack of its writable layer to start from: by name (check_name), a file in
  /// the node's <trajectories>/<session_id>/packs/, or the manifest itself
  /// (seed_manifest) when the log kept it inline; its contents are in
  /// <trajectories>/<session_id>/blobs/. Both empty: a fresh one. Never a
  /// path: the node derives every path from its own trajectory dir.
  std::string id;
  std::string seed_pack;
  std::string seed_manifest;
  /// The node tells the session itself (failed_atom, overloaded) about the
  /// sandboxes it has no slot for; false when the cluster's scheduler places
  /// them elsewhere instead.
  bool report_refusals = true;
  /// The session's options and whether a trainer owns it: the node keeps
  /// them with its sandboxes, so that a coordinator restarted after a crash
  /// learns them back from the node (node_report.held).
  session_options session;
  bool owned = false;
  /// The create's key as the trainer gave it (empty: none; dsec's "#N" keys
  /// are not sent) and its tags, and its count: the node keeps them with its
  /// sandboxes too, so that a restarted coordinator's session gets them back
  /// when it adopts them.
  create_labels labels;
  uint32_t count = 1;
  /// A sandbox id: place them only on its node (a fork: its diff is in that
  /// node's store alone, until diffs travel between nodes). Empty: anywhere.
  std::string near;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, placement& x) {
  return f(caf::meta::type_name("dsec.placement"), x.request, x.session_id, x.ttl_ms,
           x.keep_upper, x.id, x.seed_pack, x.seed_manifest, x.report_refusals, x.session,
           x.owned, x.labels, x.count, x.near);
}


// ---- commands -------------------------------------------------------------------

/// A command to run in a sandbox.
struct exec_request {
  /// Empty: the base image's Entrypoint and Cmd (an error if it has none).
  std::vector<std::string> argv;
  std::vector<std::string> env;  ///< "K=V" over the defaults (dsec's, under the image's Env)
  /// Empty: the base image's WorkingDir, else /.
  std::string cwd;
  /// -1: the base image's User, else root of the sandbox.
  int32_t uid = -1;
  int32_t gid = -1;
  uint64_t timeout_ms = 0;       ///< 0: none; then the command's group is killed
  std::string input;             ///< bytes for stdin
  bool stream = false;           ///< send output_chunk messages to the requester
  bool detach = false;           ///< reply once it runs; nobody collects its output
  uint64_t max_output = 16ull << 20; ///< per stream, when collecting
  /// A trusted command (a grader): it reaches Chronus over the trusted channel
  /// at fd 3 ($CHRONUS_FD), its PATH starts with /.dsec/bin (dsec's `chronus`),
  /// and the agent's commands cannot trace, signal or read it. Needs
  /// environment.chronus.
  bool trusted = false;
  /// Safe to run again (docs/trajectory.md): in a session with a trajectory
  /// log, no pack of the writable layer is taken after it, and a resume that
  /// must rebuild the sandbox's files runs it again instead.
  bool idempotent = false;
  /// With `trusted`: the command's root is the pristine root, the sandbox's
  /// layers without anything the agent wrote (a private /tmp), with the agent's
  /// root read-only at /.dsec/agent (docs/chronus.md).
  bool pristine = false;
  /// A process handle (issues 20, 23; docs/actors.md, "Process handles"): the
  /// requester is told the command's id in its sandbox as soon as it runs
  /// (an output_chunk of stream 0, empty data, `exec` the id), which the
  /// stdin and signal verbs name it by; and the command is SIGKILLed when
  /// the requester goes away (a cancelled call, a client that died), as a
  /// streamed one is. The reply is still the command's end.
  bool handle = false;
  /// With `handle`: the command's stdin is a pipe that `input` starts and
  /// the stdin verb feeds (with back-pressure) until it is closed; without
  /// it, stdin is `input` and then its end, as for any command.
  bool open_stdin = false;
  /// A pseudo-terminal (issue 23; docs/actors.md, "Terminals"): the command is
  /// a session leader whose controlling terminal is a pty of the sandbox's
  /// own devpts, at its stdin, stdout and stderr; TERM is xterm-256color
  /// unless `env` sets it. Its output is one stream (stdout: `out`, or
  /// output_chunk stream 1). Its input is `input`, then (with open_stdin) what
  /// the stdin verb sends; closing stdin types the terminal's end-of-file
  /// character (VEOF, ^D) instead of closing anything, and without
  /// open_stdin that comes right after `input`. The resize verb sets its
  /// window size. Not with `trusted` or `detach`; refused (errc::unsupported)
  /// by backends without terminals (microvm, sim, function calls).
  bool tty = false;
  uint16_t rows = 0; ///< with tty: its window size; 0: 24 rows, 80 columns
  uint16_t cols = 0;
  /// Flow control of streamed output (issue 20; docs/actors.md, "Transfers"):
  /// with `stream`, at most this many bytes of output are sent to the
  /// requester and not yet acknowledged with the credit verb (credit_atom,
  /// by sandbox and command id); beyond it the sandbox stops reading the
  /// command's pipes, so the command waits. 0: no bound (as before).
  uint64_t window = 0;
  /// A file transfer (transfer_kind; docs/actors.md, "Transfers"): the
  /// sandbox runs its own tar (argv, env, timeout and output limits are its
  /// own, not the request's): transfer_put unpacks the tar stream written to
  /// the command's stdin (a handle's open stdin) into the directory
  /// `transfer_path`; transfer_get streams a tar archive of `transfer_path`
  /// (a file or a directory) to the requester as stdout, with `window`.
  /// Errors are put's and get's (a missing path names it).
  uint8_t transfer = 0;
  std::string transfer_path;
  /// The user by name (issue 23; `--user USER[:GROUP]`): each part a name or a
  /// number, looked up in the sandbox's image's /etc/passwd and /etc/group
  /// (its layers, never what the agent wrote): uid, gid, supplementary groups,
  /// and HOME and USER unless `env` sets them (resolve_command_user). Wins
  /// over uid and gid. Empty: uid and gid as they are.
  std::string user;
};

/// exec_request.transfer
enum transfer_kind : uint8_t { transfer_none = 0, transfer_put = 1, transfer_get = 2 };

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exec_request& x) {
  return f(caf::meta::type_name("dsec.exec_request"), x.argv, x.env, x.cwd, x.uid, x.gid,
           x.timeout_ms, x.input, x.stream, x.detach, x.max_output, x.trusted,
           x.idempotent, x.pristine,
           /* process handles */ x.handle, x.open_stdin,
           /* terminals */ x.tty, x.rows, x.cols,
           /* transfers */ x.window, x.transfer, x.transfer_path, /* by name */ x.user);
}

/// Process handles: the most bytes one stdin message may carry, and what a
/// sandbox keeps of a command's stdin beyond its pipe before it stops taking
/// more (a stdin message then waits for its reply until the command reads).
constexpr size_t max_stdin_chunk = 1u << 20;
constexpr size_t stdin_buffer = 256u << 10;

/// How a command ended, and its output when it was collected.
struct exec_result {
  int32_t exit_code = 0;
  int32_t signal = 0;       ///< the signal that killed it, or 0
  bool timed_out = false;   ///< killed by its timeout
  bool truncated = false;   ///< output beyond max_output was dropped
  /// SIGKILLed after the sandbox's memory cgroup OOM-killed something (in a
  /// sandbox that ran other commands, not necessarily this one)
  bool oom_killed = false;
  std::string out;
  std::string err;
  uint64_t duration_us = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exec_result& x) {
  return f(caf::meta::type_name("dsec.exec_result"), x.exit_code, x.signal, x.timed_out,
           x.truncated, x.oom_killed, x.out, x.err, x.duration_us);
}

/// A piece of a streamed command's output: stream 1 is stdout, 2 stderr.
/// Stream 0 (process handles, exec_request.handle): no output, but the news
/// that the command runs, with `exec` its id in sandbox `sandbox`.
struct output_chunk {
  std::string sandbox;
  uint64_t exec = 0;
  uint8_t stream = 1;
  std::string data;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, output_chunk& x) {
  return f(caf::meta::type_name("dsec.output_chunk"), x.sandbox, x.exec, x.stream, x.data);
}

// ---- Logs of detached commands (issue 23; docs/actors.md, "Logs") ------------------

/// A piece of a detached command's output, as its sandbox's log keeps it:
/// stream 1 is stdout, 2 stderr.
struct log_piece {
  uint64_t exec = 0; ///< the command's id in its sandbox (detached_command.exec)
  uint8_t stream = 1;
  std::string data;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, log_piece& x) {
  return f(caf::meta::type_name("dsec.log_piece"), x.exec, x.stream, x.data);
}

/// A detached command (exec_request.detach) of a sandbox, as its log records
/// it: the sandbox's first one and the 63 latest.
struct detached_command {
  uint64_t exec = 0;       ///< its id in the sandbox: the signal verb's, logs_request.exec
  std::string command;     ///< its argv, joined by spaces (at most 256 bytes of it)
  uint64_t started_ms = 0; ///< unix ms
  bool running = true;     ///< it has not exited
  bool open = true;        ///< its stdout or stderr is still open (a background child may hold it)
  uint64_t ended_ms = 0;   ///< unix ms, once it exited
  int32_t exit_code = 0;   ///< as exec_result's: 128+N if signal N killed it
  int32_t signal = 0;
  bool timed_out = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, detached_command& x) {
  return f(caf::meta::type_name("dsec.detached_command"), x.exec, x.command, x.started_ms,
           x.running, x.open, x.ended_ms, x.exit_code, x.signal, x.timed_out);
}

/// What of a sandbox's log to read. Positions count the bytes of output the
/// log has taken since the sandbox began (both streams, every detached
/// command); the log keeps the latest detached_log_bytes of them.
struct logs_request {
  uint64_t exec = 0;      ///< one command's (detached_command.exec); 0: every one's
  uint64_t since = 0;     ///< output after this position (logs_reply.next of the last read)
  uint64_t max_bytes = 0; ///< at most this many bytes of output; 0: all the log holds
  bool output = true;     ///< false: the commands only, no output
  /// When nothing newer than `since` is there and the command (any, with
  /// exec 0) is still live (running, or with output open; with `output`
  /// false: running): reply once something comes or it ends, or after 20 s
  /// with nothing (ask again).
  bool wait = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, logs_request& x) {
  return f(caf::meta::type_name("dsec.logs_request"), x.exec, x.since, x.max_bytes, x.output,
           x.wait);
}

struct logs_reply {
  std::vector<log_piece> pieces; ///< in the order the sandbox read them
  uint64_t next = 0;     ///< the position after them: the next request's `since`
  uint64_t dropped = 0;  ///< bytes after `since` the log no longer holds (its bound)
  std::vector<detached_command> commands; ///< the commands asked about, oldest first
  bool live = false;     ///< one of them is live (as logs_request.wait counts it)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, logs_reply& x) {
  return f(caf::meta::type_name("dsec.logs_reply"), x.pieces, x.next, x.dropped, x.commands,
           x.live);
}

/// What a sandbox keeps of its detached commands' output (logs_request).
constexpr uint64_t detached_log_bytes = 1u << 20;

// ---- Chronus (capnp/chronus.capnp; docs/chronus.md) --------------------------------

/// One Chronus Event, as the Cap'n Proto bytes the node encoded: a sandbox's
/// stage, report, log line or feedback request. Sessions forward the bytes
/// as they are; readers decode them in place (dsec::decode_event).
struct chronus_event_msg {
  std::string bytes;
  /// Sent again by a resumed session from its trajectory log, at the step
  /// where the sandbox first sent it (docs/trajectory.md).
  bool replayed = false;
  /// Replayed feedback requests: the trainer's logged answer (Feedback
  /// bytes), empty if it gave none.
  std::string answer;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chronus_event_msg& x) {
  return f(caf::meta::type_name("dsec.chronus_event"), x.bytes, x.replayed, x.answer);
}

/// A trainer's answer to a feedback request: Cap'n Proto Feedback bytes.
struct chronus_feedback_msg {
  std::string bytes;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chronus_feedback_msg& x) {
  return f(caf::meta::type_name("dsec.chronus_feedback"), x.bytes);
}

// ---- what is there ----------------------------------------------------------------

/// A port of a sandbox that its node forwards (docs/network.md, "Exposed
/// ports"): TCP to host:host_port on the node reaches `port` on the
/// sandbox's loopback, inside its network namespace.
struct exposed_port {
  uint16_t port = 0;      ///< inside the sandbox
  std::string host;       ///< the node's address (dsecd --expose-address)
  uint16_t host_port = 0; ///< on the node, chosen by the kernel
  /// "HOST:PORT" (IPv6 hosts in brackets), what a trainer connects to.
  [[nodiscard]] std::string address() const {
    return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":"
           + std::to_string(host_port);
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exposed_port& x) {
  return f(caf::meta::type_name("dsec.exposed_port"), x.port, x.host, x.host_port);
}

struct sandbox_info {
  std::string id;
  std::string session;
  std::string state;        ///< creating, ready, running (a command runs), paused, destroying
  environment env;
  uint64_t created_ms = 0;  ///< unix time
  uint64_t ttl_left_ms = 0;
  uint32_t running = 0;     ///< commands running now
  std::string node;         ///< the node it lives on (its name)
  /// Its key and its create's tags (create_labels): filled in by its
  /// session's list and lookup, empty in the node's.
  std::string key;
  std::map<std::string, std::string> tags;
  /// Its exposed ports (environment::expose and later expose calls), in the
  /// order they were exposed.
  std::vector<exposed_port> exposed;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sandbox_info& x) {
  return f(caf::meta::type_name("dsec.sandbox_info"), x.id, x.session, x.state, x.env,
           x.created_ms, x.ttl_left_ms, x.running, x.node, x.key, x.tags, x.exposed);
}

/// One session of a daemon, for `dsec session list` (the scheduler's
/// `sessions` verb): a live one, or a trajectory log on disk that no live
/// session has (it can be resumed).
struct session_summary {
  std::string id;
  std::string name;         ///< "" when it has none
  std::string state;        ///< "live" or "resumable"
  bool owned = false;       ///< live and owned by a trainer: it ends with it
  bool trajectory = false;  ///< it keeps a trajectory log (a resumable one: true)
  uint32_t quota = 0;       ///< live: most sandboxes at once
  uint64_t log_ms = 0;      ///< its log's last write (unix ms), 0 without one
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, session_summary& x) {
  return f(caf::meta::type_name("dsec.session_summary"), x.id, x.name, x.state, x.owned,
           x.trajectory, x.quota, x.log_ms);
}

/// A backend a node offers (actors/backend.hpp) and its capacity: sandboxes
/// of that backend it admits at most, and has now. Backends share the node's
/// slots, so each one's `slots` is the node's admission limit.
struct backend_offer {
  std::string name; ///< environment::backend
  uint32_t slots = 0;
  uint32_t live = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, backend_offer& x) {
  return f(caf::meta::type_name("dsec.backend_offer"), x.name, x.slots, x.live);
}

/// A warm pool of one node (actors/warm_pool.hpp): ready sandboxes of one
/// environment that no caller has touched, for creates to claim.
struct pool_info {
  std::string node;       ///< the node it is on
  environment env;        ///< as the node makes them (its defaults filled in)
  std::string owner;      ///< the session id, or "node" (dsecd --pool, `dsec pool set`)
  uint32_t target = 0;    ///< ready sandboxes it keeps
  uint32_t ready = 0;     ///< ready now
  uint32_t warming = 0;   ///< being created
  uint64_t claimed = 0;   ///< handed to creates since it was set
  uint64_t refills = 0;   ///< sandboxes made to refill it
  uint64_t evicted = 0;   ///< destroyed for a real create or under memory pressure
  /// pool_key of the environment as it was asked for (before the node's
  /// defaults): what a coordinator compares a create's with to place it
  /// where a ready one is (actors/cluster_map.hpp).
  std::string key;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pool_info& x) {
  return f(caf::meta::type_name("dsec.pool_info"), x.node, x.env, x.owner, x.target, x.ready,
           x.warming, x.claimed, x.refills, x.evicted, x.key);
}

/// One egress sandbox's traffic through its node since it was attached
/// (node_stats.egress_by_sandbox; runtime/egress.hpp sandbox_traffic).
struct egress_traffic {
  std::string sandbox;
  uint64_t sent_bytes = 0;     ///< what it sent out, allowed
  uint64_t received_bytes = 0; ///< what came back to it
  uint64_t connections = 0;    ///< connections its policy let it open
  uint64_t denied = 0;         ///< packets denied (connection attempts and their retries)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, egress_traffic& x) {
  return f(caf::meta::type_name("dsec.egress_traffic"), x.sandbox, x.sent_bytes,
           x.received_bytes, x.connections, x.denied);
}

/// One process of a sandbox, as `dsec top ID` shows it (runtime/usage.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sandbox_process& x) {
  return f(caf::meta::type_name("dsec.sandbox_process"), x.pid, x.ppid, x.uid, x.state,
           x.threads, x.rss_bytes, x.cpu_ms, x.age_ms, x.command);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, resource_usage& x) {
  return f(caf::meta::type_name("dsec.resource_usage"), x.memory_bytes, x.memory_limit,
           x.cpu_ms, x.tasks, x.tasks_limit, x.processes, x.disk_bytes, x.disk_limit, x.inodes,
           x.inodes_limit, x.memory_from_cgroup);
}

/// What a sandbox uses now (`dsec stats ID`, `dsec top ID`; usage_atom):
/// read by its node from the host's side when asked, never from inside it.
struct sandbox_usage {
  std::string id;
  std::string node;
  uint64_t uptime_ms = 0;      ///< since it became ready
  resource_usage usage;
  bool egress = false;         ///< an egress sandbox: `traffic` counts its packets
  egress_traffic traffic;
  std::vector<sandbox_process> processes; ///< only when asked for, by pid
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sandbox_usage& x) {
  return f(caf::meta::type_name("dsec.sandbox_usage"), x.id, x.node, x.uptime_ms, x.usage,
           x.egress, x.traffic, x.processes);
}

struct node_stats {
  std::string node;          ///< its name (host:port or "embedded")
  uint32_t slots = 0;        ///< admission limit (after oversubscription)
  uint32_t live = 0;         ///< sandboxes now
  uint32_t creating = 0;
  uint64_t created = 0;      ///< since start
  uint64_t failed = 0;
  uint64_t destroyed = 0;
  uint32_t sessions = 0;
  uint32_t layers_mounted = 0;
  uint64_t layer_bytes = 0;  ///< of mounted layers
  uint64_t cache_budget = 0;
  uint64_t evicted = 0;      ///< layers unmounted by the cache
  std::vector<std::string> gc; ///< what start-up garbage collection removed
  // Chronus, since start: sandboxes served now, events forwarded, feedback
  // delivered, and frames refused by reason (docs/chronus.md)
  uint32_t chronus_sandboxes = 0;
  uint64_t chronus_events = 0;
  uint64_t chronus_answered = 0;
  uint64_t chronus_too_large = 0;
  uint64_t chronus_malformed = 0;
  uint64_t chronus_unauthenticated = 0;
  uint64_t chronus_invalid = 0;
  uint64_t chronus_flooding = 0;
  uint64_t chronus_refused_connections = 0;
  /// Connections to the daemon's port refused before their first message
  /// (without --tls: not root nor group dsec; actors/door.hpp)
  uint64_t refused_clients = 0;
  /// Internal messages this dsecd refused since start (docs/security.md): an
  /// internal verb without the daemon's or cluster's key, a reply to an
  /// internal request without it, a down message naming an actor that had
  /// not ended.
  uint64_t refused_internal = 0;
  // The limits a sandbox gets when its environment names none (dsecd
  // --default-memory, --default-pids, --default-disk); 0: no such default
  uint64_t default_memory = 0;
  uint64_t default_pids = 0;
  uint64_t default_disk = 0;
  // Sandbox cgroups since start: taken from the node's pool, made for it
  uint64_t cgroups_reused = 0;
  uint64_t cgroups_made = 0;
  /// The backends it offers, each with its capacity.
  std::vector<backend_offer> backends;
  /// Memory admission (actors/node.hpp node_config::memory): the bound, 0
  /// for none, and what the live sandboxes count against it.
  uint64_t memory_capacity = 0;
  uint64_t memory_admitted = 0;
  /// Cordoned (`dsec node cordon`): it admits no new sandbox; its own go on.
  bool cordoned = false;
  /// Its warm pools (actors/warm_pool.hpp); `pooled`: their sandboxes now
  /// (ready or warming, in `live` too); `memory_pressure`: pools are shrunk
  /// because the node's memory is under pressure.
  std::vector<pool_info> pools;
  uint32_t pooled = 0;
  bool memory_pressure = false;
  /// Egress networking (docs/network.md): sandboxes attached now, and the
  /// packets their policies allowed (first packets of connections) and
  /// denied since the node started (0 on a node without --uplink).
  uint32_t egress_sandboxes = 0;
  uint64_t egress_allowed = 0;
  uint64_t egress_denied = 0;
  /// Each egress sandbox's own counters (the sandboxes attached now).
  std::vector<egress_traffic> egress_by_sandbox;
  /// Port exposure: ports forwarded now, and the connections forwarded and
  /// refused (the per-port limit, or nothing listening inside) since start,
  /// and those closed for idleness (dsecd --expose-idle-timeout).
  uint32_t exposed_ports = 0;
  uint64_t exposed_connections = 0;
  uint64_t exposed_refused = 0;
  uint64_t exposed_idle_closed = 0;
  /// Sandboxes paused now (`dsec pause`; in `live` too).
  uint32_t paused = 0;
  /// Its create latency since it started (dsec_sandbox_create_seconds over
  /// every backend): cumulative counts per bucket of
  /// metrics::latency_buckets(), then +Inf, and the sum in seconds.
  std::vector<uint64_t> create_buckets;
  double create_sum = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_stats& x) {
  return f(caf::meta::type_name("dsec.node_stats"), x.node, x.slots, x.live, x.creating,
           x.created, x.failed, x.destroyed, x.sessions, x.layers_mounted, x.layer_bytes,
           x.cache_budget, x.evicted, x.gc, x.chronus_sandboxes, x.chronus_events,
           x.chronus_answered, x.chronus_too_large, x.chronus_malformed,
           x.chronus_unauthenticated, x.chronus_invalid, x.chronus_flooding,
           x.chronus_refused_connections, x.refused_clients, x.refused_internal,
           x.default_memory, x.default_pids, x.default_disk, x.cgroups_reused,
           x.cgroups_made, x.backends, x.memory_capacity, x.memory_admitted, x.cordoned,
           x.pools, x.pooled, x.memory_pressure,
           x.egress_sandboxes, x.egress_allowed, x.egress_denied, x.egress_by_sandbox,
           /* snapshots */ x.paused,
           /* port exposure */ x.exposed_ports, x.exposed_connections, x.exposed_refused,
           x.exposed_idle_closed,
           x.create_buckets, x.create_sum);
}

/// The layers of one sandbox, mounted by the node's layer_cache: directory fds
/// (topmost first) and the id to release them with. Local to a node.
struct layer_set {
  uint64_t lease = 0;
  std::vector<int> fds;
  /// The base image's config (layer_info::config, one line of JSON; empty for
  /// a base that is not an OCI image) and how many of `fds`, the last ones,
  /// are its lowers: the defaults of the sandbox's commands
  /// (runtime/image_config.hpp) come from them.
  std::string config;
  uint32_t base_lowers = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, layer_set& x) {
  return f(caf::meta::type_name("dsec.layer_set"), x.lease, x.fds, x.config, x.base_lowers);
}

// ---- the cluster (docs/cluster.md) ---------------------------------------------------

/// A layer as a node's store describes it to a peer that lacks it.
struct layer_meta {
  std::string ref;      ///< NAME@VERSION
  std::string kind;     ///< base, workdir or tool
  std::string digest;   ///< "sha256:<64 hex>" of the image bytes
  uint64_t size = 0;    ///< image bytes
  int64_t created = 0;  ///< unix seconds
  std::string source;   ///< what it was built from, on the node that built it
  /// A diff layer's record of the environment it sits on (layer_info::on).
  std::string on;
  /// An OCI image (layer_info::lowers; empty for every other layer): its
  /// lowers' blob digests, topmost first (lowers[0] == digest), each one's
  /// bytes, and the config and manifest digest it keeps. `size` is then the
  /// sum. A node fetches only the lowers its store lacks.
  std::vector<std::string> lowers;
  std::vector<uint64_t> lower_sizes;
  std::string config;
  std::string manifest;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, layer_meta& x) {
  return f(caf::meta::type_name("dsec.layer_meta"), x.ref, x.kind, x.digest, x.size,
           x.created, x.source,
           /* snapshots */ x.on,
           /* OCI images */ x.lowers, x.lower_sizes, x.config, x.manifest);
}

/// The sandboxes a node holds for one session of its coordinator, as its
/// join report says after it lost the coordinator (docs/cluster.md): a
/// restarted coordinator rebuilds the session from this and adopts them.
struct held_session {
  std::string id;            ///< the session's id
  session_options options;   ///< as its creates carried them
  bool owned = false;        ///< a trainer owned it (it ends if none comes back)
  std::vector<std::string> sandboxes; ///< their ids
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, held_session& x) {
  return f(caf::meta::type_name("dsec.held_session"), x.id, x.options, x.owned, x.sandboxes);
}

/// What a node's heartbeat carries (node -> coordinator, one message per
/// interval however much changed).
struct node_report {
  std::string name;         ///< host:port
  uint32_t slots = 0;       ///< admission limit (after oversubscription)
  uint32_t live = 0;        ///< sandboxes now, including those being created
  uint32_t creating = 0;
  uint64_t created = 0;     ///< since start
  uint64_t failed = 0;
  uint64_t destroyed = 0;
  /// The NAME@VERSION layers in its store, sent whole when they changed since
  /// the last report (layers_sent true), else left empty.
  bool layers_sent = false;
  std::vector<std::string> layers;
  uint64_t fetched_layers = 0; ///< layers fetched from peers since start
  uint64_t fetched_bytes = 0;
  /// The backends it offers (actors/backend.hpp); the scheduler places a
  /// sandbox only where its backend is offered.
  std::vector<backend_offer> backends;
  /// Cordoned: the scheduler places nothing there.
  bool cordoned = false;
  /// Its warm pools (node_stats.pools); `live` leaves their idle sandboxes
  /// out (a create placed there takes their slots).
  std::vector<pool_info> pools;
  /// In a join report only: the sandboxes it kept after losing its
  /// coordinator (its --orphan-grace), by session, for the coordinator to
  /// adopt (docs/cluster.md, "When the coordinator dies").
  std::vector<held_session> held;
  /// Its create latency since it started (node_stats.create_buckets): the
  /// coordinator's cluster-wide histogram (dsec_cluster_create_seconds).
  std::vector<uint64_t> create_buckets;
  double create_sum = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_report& x) {
  return f(caf::meta::type_name("dsec.node_report"), x.name, x.slots, x.live, x.creating,
           x.created, x.failed, x.destroyed, x.layers_sent, x.layers, x.fetched_layers,
           x.fetched_bytes, x.backends, x.cordoned, x.pools, x.held, x.create_buckets,
           x.create_sum);
}

/// One node as `dsec cluster status` shows it.
struct member_info {
  std::string name;
  std::string state;          ///< "up", "cordoned" (up, admits nothing new), or "lost" (kept a while after)
  std::string why;            ///< for lost: what happened
  bool coordinator = false;   ///< the node in the coordinator's own process
  node_report last;           ///< its last heartbeat (layers: all it holds)
  uint64_t since_beat_ms = 0; ///< since that heartbeat
  uint64_t joined_ms = 0;     ///< unix time it joined
  uint32_t placed = 0;        ///< sandboxes placed there since the last heartbeat
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, member_info& x) {
  return f(caf::meta::type_name("dsec.member_info"), x.name, x.state, x.why, x.coordinator,
           x.last, x.since_beat_ms, x.joined_ms, x.placed);
}

} // namespace dsec

// The typed interfaces of dsec's actors. Each is a short list of signatures in
// up to three surfaces (docs/security.md, "Who may send what"):
//
//   client    what a trainer or the command line sends: the scheduler's and the
//             session's verbs without a key. Nothing else is for clients.
//   member    between the actors of a cluster's processes (or of one daemon):
//             the first argument after the atom is the member key (the
//             cluster's, dsecd --cluster-key); replies that the requester acts
//             on start with it too.
//   process   within one process only (timers, the reactor thread, a node and
//             its sandboxes, a session and its scheduler): the first argument
//             after the atom is process_key().
//
// A message of the member or process surface without the right key is refused
// before anything is done (actors/surface.hpp: errc::unauthorized, counted in
// node_stats.refused_internal). Every actor that was ever named over a
// connection can be reached by any peer, so the key, not the handle or the
// claimed sender, is what tells dsec's own messages from a client's.
//
//   trainer --client--> scheduler --place--> node --spawn--> sandbox --> runtime::container
//                 \--open--> session <--ready/gone-- sandbox        \--> layer_cache
#pragma once

#include <caf/node_id.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/messages.hpp"
#include "actors/surface.hpp"

namespace dsec {

/// One per node, over its layer store: serves the layers it holds to peers
/// that lack them (docs/cluster.md, layer distribution).
/// Member surface only.
using layer_store_actor = caf::typed_actor<
  /// A layer by NAME@VERSION.
  caf::replies_to<describe_atom, internal_key, std::string>::with<internal_key, layer_meta>,
  /// Bytes [offset, offset + length) of the image with this digest; length at
  /// most 1 MiB; shorter only at the end of the image.
  caf::replies_to<fetch_atom, internal_key, std::string, uint64_t,
                  uint32_t>::with<internal_key, std::string>>;

/// One per node: mounts each layer once, counts its users, evicts unused ones.
/// A layer missing from the node's store is fetched from its source (a peer's
/// layer_store), once however many sandboxes wait for it. Process surface only.
using layer_cache_actor = caf::typed_actor<
  /// Mounts (or finds) the environment's layers; one reference each until release.
  caf::replies_to<acquire_atom, internal_key, environment>::with<internal_key, layer_set>,
  caf::reacts_to<release_atom, internal_key, uint64_t>,
  /// Fetch missing layers from here from now on (a node that joined a
  /// cluster); the name is how errors call it ("the coordinator HOST:PORT").
  caf::reacts_to<source_atom, internal_key, layer_store_actor, std::string>,
  /// Copies layer NAME@VERSION from `from` (a peer's layer store, named
  /// `from_name` in errors) into the node's store, as a fetch does: a diff
  /// made on another node, which the coordinator keeps so that every node can
  /// fetch it. true: copied now; false: the store had it.
  caf::replies_to<copy_atom, internal_key, std::string, layer_store_actor,
                  std::string>::with<internal_key, bool>,
  /// The NAME@VERSION layers in the node's store; layers fetched so far and
  /// their bytes.
  caf::replies_to<list_atom, internal_key>::with<std::vector<std::string>, uint64_t, uint64_t>,
  /// layers mounted, bytes mounted, budget, evicted so far
  caf::replies_to<stats_atom, internal_key>::with<uint32_t, uint64_t, uint64_t, uint64_t>>;

/// One per sandbox: its state machine and its runtime::container. No client
/// surface: clients reach sandboxes through their session or the scheduler.
using sandbox_actor = caf::typed_actor<
  // member surface (from its session, the scheduler and its node)
  caf::replies_to<exec_atom, internal_key, exec_request>::with<exec_result>,
  caf::replies_to<signal_atom, internal_key, int32_t>::with<bool>, ///< to every running command
  /// Process handles (exec_request.handle): to command `exec` only (its
  /// process group); not_found once it ended.
  caf::replies_to<signal_atom, internal_key, uint64_t, int32_t>::with<bool>,
  /// Bytes for the stdin of command `exec` (exec_request.open_stdin), then,
  /// with `close`, its end. Replies the bytes taken once they are in the
  /// sandbox's buffer (stdin_buffer): a command that does not read holds the
  /// reply back. errc::closed once its stdin is closed or it stopped reading.
  caf::replies_to<stdin_atom, internal_key, uint64_t, std::string, bool>::with<uint64_t>,
  /// Terminals (exec_request.tty): the window size (rows, columns) of
  /// command `exec`'s terminal; its foreground process group gets SIGWINCH.
  /// invalid_argument if it has none, not_found once it ended.
  caf::replies_to<resize_atom, internal_key, uint64_t, uint16_t, uint16_t>::with<bool>,
  /// Flow control (exec_request.window): the requester of streamed command
  /// `exec` consumed `bytes` more of its output. False when no such command
  /// runs (it ended: credit after the end is not an error).
  caf::replies_to<credit_atom, internal_key, uint64_t, uint64_t>::with<bool>,
  /// Unpacks a tar archive into a directory of the sandbox; replies its size.
  caf::replies_to<put_atom, internal_key, std::string, std::string>::with<uint64_t>,
  /// Packs a file or directory of the sandbox as a tar archive.
  caf::replies_to<get_atom, internal_key, std::string>::with<std::string>,
  caf::replies_to<destroy_atom, internal_key>::with<bool>,
  /// Destroys it, `why` ending what its calls in flight hear ("sandbox ID
  /// " + why, errc::lost) and its log line (a node declared lost: member.cpp).
  caf::reacts_to<destroy_atom, internal_key, std::string>,
  caf::replies_to<list_atom, internal_key>::with<sandbox_info>,
  /// Answers one of its Chronus feedback requests (Feedback bytes).
  caf::replies_to<feedback_atom, internal_key, chronus_feedback_msg>::with<bool>,
  /// Packs its writable layer (runtime/pack.hpp) as the pack of that name
  /// (check_name) in its node's trajectory dir, <trajectories>/<session
  /// id>/packs/, its contents in <trajectories>/<session id>/blobs/: replies
  /// the manifest itself when it is small (the session keeps it in its log
  /// record), else empty once it is durable in the pack file. Sandboxes made
  /// with placement.keep_upper only. No path comes from the message.
  caf::replies_to<pack_atom, internal_key, std::string>::with<internal_key, std::string>,
  /// Its TTL from now on: it is destroyed `ms` milliseconds from now (as if
  /// created with that TTL now); replies the milliseconds left.
  caf::replies_to<lifetime_atom, internal_key, uint64_t>::with<uint64_t>,
  /// Its egress policy from now on (allow, deny: runtime/net_policy.hpp
  /// rules): new connections see it at once. Egress sandboxes only.
  caf::replies_to<network_atom, internal_key, std::vector<std::string>,
                  std::vector<std::string>>::with<bool>,
  /// Forwards a port of the node to `port` inside it (loopback and egress
  /// sandboxes only; docs/network.md); replies where it is.
  caf::replies_to<expose_atom, internal_key, uint16_t>::with<exposed_port>,
  /// The output and ends of its detached commands (logs_request; docs/actors.md
  /// "Logs"): what its log holds after a position, at once or (`wait`) once
  /// there is some.
  caf::replies_to<logs_atom, internal_key, logs_request>::with<logs_reply>,
  /// What it uses now (sandbox_usage), with its processes when asked (true).
  caf::replies_to<usage_atom, internal_key, bool>::with<sandbox_usage>,
  // process surface: from the reactor thread and timers
  caf::reacts_to<event_atom, internal_key>,                  ///< init has something to say
  caf::reacts_to<output_atom, internal_key, uint64_t, uint8_t, std::string,
                 bool>,                                      ///< exec, stream, data, eof
  caf::reacts_to<reaped_atom, internal_key>,                 ///< init's pidfd is readable
  caf::reacts_to<timeout_atom, internal_key, uint64_t>,      ///< a command's deadline
  caf::reacts_to<stdin_atom, internal_key, uint64_t>,        ///< a command's stdin pipe has room
  caf::reacts_to<ttl_atom, internal_key, uint64_t>,          ///< its TTL ran out (of this setting)
  /// From its node: a sandbox of a warm pool (actors/warm_pool.hpp) is handed
  /// to a create: it belongs to `session` (id `session_id`) from now on, as a
  /// sandbox of its create request `request` with TTL `ttl_ms`, and tells it
  /// that it is ready; `keep_upper`: packs of it can be taken from now on (a
  /// session with a trajectory log). One that ran anything, or is going,
  /// reports the request failed instead (and replies false).
  /// (The session as a caf::actor: session_actor is declared after this.)
  caf::replies_to<claim_atom, internal_key, caf::actor, std::string, uint64_t, uint64_t,
                  bool>::with<bool>,
  /// From its node, after a coordinator restart (docs/cluster.md): a sandbox
  /// whose session's process went away (orphaned, kept for its node's
  /// --orphan-grace) belongs to `session` from now on (the restarted
  /// coordinator's session of the same id), and tells it so (adopt_atom).
  /// Nothing happens if it was not orphaned (or cannot be adopted).
  caf::reacts_to<adopt_atom, internal_key, caf::actor, create_labels, uint32_t>,
  /// Process surface: the orphan grace of its `n`th orphaning ran out: if it
  /// is still orphaned, it is destroyed.
  caf::reacts_to<orphan_atom, internal_key, uint64_t>,
  // ---- snapshots (issue 16), member surface ----
  /// Pauses (true: freezes its processes, stops its TTL clock) or resumes
  /// (false) it; replies whether its state changed.
  caf::replies_to<pause_atom, internal_key, bool>::with<bool>,
  /// pack_diff: freezes it, makes its writable layer a layer of kind diff
  /// named NAME@VERSION in its node's store (recording its environment),
  /// thaws it; replies the layer's digest.
  caf::replies_to<snapshot_atom, internal_key, std::string>::with<internal_key, std::string>>;

/// One per training run: the trainer's sandboxes, their quota and lifetime.
using session_actor = caf::typed_actor<
  // ---- client surface ----
  /// Creates `count` sandboxes. Each one, as it becomes ready or fails, is told
  /// to `listener` as (ready_atom, id) or (failed_atom, error); the reply, once
  /// all are done, is how many were created.
  caf::replies_to<create_atom, environment, uint32_t, caf::actor>::with<uint32_t>,
  /// The same with a key and tags (create_labels): each sandbox is then told
  /// to `listener` as (ready_atom, ready_ids) with its key. A resumed session
  /// gives the call the sandboxes its log made for the key (docs/trajectory.md).
  caf::replies_to<create_atom, environment, uint32_t, caf::actor, create_labels>::with<uint32_t>,
  /// The same, placed only on the node of the session's own sandbox `near`
  /// (a fork's: its snapshot is in that node's store alone); errc::not_found
  /// for a sandbox the session does not have.
  caf::replies_to<create_atom, environment, uint32_t, caf::actor, create_labels,
                  std::string>::with<uint32_t>,
  /// The sandbox with this key (create_labels), or errc::not_found.
  caf::replies_to<lookup_atom, std::string>::with<sandbox_info>,
  caf::replies_to<exec_atom, std::string, exec_request>::with<exec_result>,
  caf::replies_to<put_atom, std::string, std::string, std::string>::with<uint64_t>,
  caf::replies_to<get_atom, std::string, std::string>::with<std::string>,
  caf::replies_to<destroy_atom, std::string>::with<bool>,
  /// Sets the TTL of one of its sandboxes: destroyed `ms` (1 s to 30 days)
  /// from now; replies the milliseconds left.
  caf::replies_to<lifetime_atom, std::string, uint64_t>::with<uint64_t>,
  /// Sets the egress policy of one of its sandboxes (allow, deny).
  caf::replies_to<network_atom, std::string, std::vector<std::string>,
                  std::vector<std::string>>::with<bool>,
  /// Exposes a port of one of its sandboxes on its node; replies where.
  caf::replies_to<expose_atom, std::string, uint16_t>::with<exposed_port>,
  caf::replies_to<list_atom>::with<std::vector<sandbox_info>>,
  /// Destroys every sandbox of the session and ends it; replies how many.
  caf::replies_to<close_atom>::with<uint32_t>,
  /// Sends the session's Chronus events to `watcher` as (chronus_atom,
  /// chronus_event_msg), starting with those kept while nobody watched;
  /// replies how many of those there were.
  caf::replies_to<watch_atom, caf::actor>::with<uint64_t>,
  /// Answers a feedback request of one of its sandboxes.
  caf::replies_to<feedback_atom, std::string, chronus_feedback_msg>::with<bool>,
  /// A warm pool of `size` ready sandboxes of `env` for this session's
  /// creates (0 removes it), spread over the nodes; ends with the session.
  /// Replies how many the nodes took (actors/warm_pool.hpp).
  caf::replies_to<pool_atom, environment, uint32_t>::with<uint32_t>,
  /// The function backend: creates a sandbox of `env` (from a warm pool when
  /// one has a ready one), runs the command, destroys the sandbox; replies the
  /// command's result once the sandbox is gone.
  caf::replies_to<call_atom, environment, exec_request>::with<exec_result>,
  /// Process handles (exec_request.handle): a running command of one of its
  /// sandboxes, by the sandbox's id and the command's: a signal to it, and
  /// bytes (then, with `close`, the end) for its stdin, as sandbox_actor's.
  caf::replies_to<signal_atom, std::string, uint64_t, int32_t>::with<bool>,
  caf::replies_to<stdin_atom, std::string, uint64_t, std::string, bool>::with<uint64_t>,
  /// Terminals: a command's window size (rows, columns), as sandbox_actor's.
  caf::replies_to<resize_atom, std::string, uint64_t, uint16_t, uint16_t>::with<bool>,
  /// Flow control of a streamed command's output, as sandbox_actor's.
  caf::replies_to<credit_atom, std::string, uint64_t, uint64_t>::with<bool>,
  /// The log of one of its sandboxes' detached commands, as sandbox_actor's.
  caf::replies_to<logs_atom, std::string, logs_request>::with<logs_reply>,
  /// What one of its sandboxes uses now, as sandbox_actor's.
  caf::replies_to<usage_atom, std::string, bool>::with<sandbox_usage>,
  // ---- member surface: from the nodes and their sandboxes ----
  /// an Event from the node's Chronus endpoint
  caf::reacts_to<chronus_atom, internal_key, chronus_event_msg>,
  caf::reacts_to<ready_atom, internal_key, std::string, sandbox_actor,
                 uint64_t>,                                              ///< id, actor, request
  caf::reacts_to<failed_atom, internal_key, caf::error, uint64_t>,       ///< why, request
  caf::reacts_to<gone_atom, internal_key, std::string>,
  caf::reacts_to<ttl_atom, internal_key, std::string>,                   ///< id reached its TTL
  // ---- process surface ----
  /// the trajectory log's batch is complete; make it durable
  caf::reacts_to<flush_atom, internal_key>,
  /// the daemon stops; close, but keep the trajectory log for resume
  caf::reacts_to<shutdown_atom, internal_key>,
  // from the cluster's scheduler (docs/cluster.md)
  /// `count` sandboxes of request `request` were admitted by the node `where`
  caf::reacts_to<placed_atom, internal_key, uint64_t, caf::node_id, uint32_t>,
  /// node `where` (named `name`) was lost, and why: its sandboxes are gone
  caf::reacts_to<lost_atom, internal_key, caf::node_id, std::string, std::string>,
  /// node `where` is a member (again): what comes from it now is of its new
  /// membership, not of the one that was lost
  caf::reacts_to<join_atom, internal_key, caf::node_id>,
  /// From one of its sandboxes (member surface): it was kept by its node while
  /// the coordinator was gone, and is this session's again (a restarted
  /// coordinator's session rebuilt from the nodes' reports).
  caf::reacts_to<adopt_atom, internal_key, std::string, sandbox_actor, create_labels, uint32_t>,
  /// From the scheduler (process surface): `trainer` owns the session from
  /// now on (a trainer's client reattached after a coordinator restart).
  caf::reacts_to<reattach_atom, internal_key, caf::actor>,
  /// Process surface: a rebuilt owned session's wait for its trainer ran out
  /// (it closes if none reattached).
  caf::reacts_to<orphan_atom, internal_key>,
  // ---- snapshots (issue 16), client surface ----
  /// Pauses (true) or resumes (false) one of its sandboxes; replies whether
  /// its state changed.
  caf::replies_to<pause_atom, std::string, bool>::with<bool>,
  /// Pauses or resumes every sandbox of the session; replies how many changed.
  caf::replies_to<pause_atom, bool>::with<uint32_t>,
  /// pack_diff of one of its sandboxes as the diff layer NAME@VERSION;
  /// replies its digest.
  caf::replies_to<snapshot_atom, std::string, std::string>::with<std::string>,
  /// Forks one of its sandboxes into `count` new ones (one pack_diff, one
  /// create batch, told to `listener` as create does); replies how many.
  caf::replies_to<fork_atom, std::string, uint32_t, caf::actor>::with<uint32_t>>;

/// One per node: admission, the sandboxes' registry and the node's statistics.
/// No client surface: clients ask the scheduler.
using node_actor = caf::typed_actor<
  // ---- member surface: from the scheduler (the coordinator's) and the member ----
  /// Admits up to `count` sandboxes of `env` for `session`; each reports to
  /// the session. Replies how many were admitted.
  caf::replies_to<spawn_atom, internal_key, environment, uint32_t, session_actor,
                  placement>::with<internal_key, uint32_t>,
  caf::replies_to<lookup_atom, internal_key, std::string>::with<internal_key, sandbox_actor>,
  caf::replies_to<list_atom, internal_key>::with<internal_key, std::vector<sandbox_info>>,
  caf::replies_to<stats_atom, internal_key>::with<internal_key, node_stats>,
  /// Cordons (true) or uncordons (false) the node: a cordoned node admits no
  /// new sandbox (spawn refuses with errc::overloaded, naming it). Replies its
  /// live sandboxes.
  caf::replies_to<cordon_atom, internal_key, bool>::with<internal_key, uint32_t>,
  /// Cordons the node and replies once it has no sandbox left (how many
  /// there were), or after `timeout_ms` with errc::timeout naming how many
  /// are left (it stays cordoned).
  caf::replies_to<drain_atom, internal_key, uint64_t>::with<internal_key, uint32_t>,
  /// Sets the warm pool of `env` owned by `owner` (null: the node's own) to
  /// `size` ready sandboxes (0 removes it); `owner_id` names the owner in
  /// pool_info. Replies the size set (actors/warm_pool.hpp).
  caf::replies_to<pool_atom, internal_key, environment, uint32_t, session_actor,
                  std::string>::with<internal_key, uint32_t>,
  /// After a coordinator restart: the node's orphaned sandboxes of session
  /// `id` belong to `session` from now on (each tells it, adopt_atom); a null
  /// `session` destroys them instead (a session with a trajectory log, which
  /// its resume rebuilds). Replies how many were asked to.
  caf::replies_to<adopt_atom, internal_key, std::string, session_actor>::with<internal_key,
                                                                               uint32_t>,
  // ---- process surface ----
  /// The sandboxes it holds, by session (for a join report: held_session).
  caf::replies_to<held_atom, internal_key>::with<internal_key, std::vector<held_session>>,
  caf::reacts_to<pressure_atom, internal_key>,                ///< check memory pressure
  caf::reacts_to<gone_atom, internal_key, std::string, bool>, ///< from a sandbox: id, created ok
  caf::reacts_to<timeout_atom, internal_key, uint64_t>,     ///< a drain's timeout ran out
  caf::reacts_to<ready_atom, internal_key, std::string>,      ///< from a sandbox: creation done
  /// Destroys every sandbox and stays up (a node its coordinator declared
  /// lost), each told `why` (destroy_atom's); replies how many, once they are gone.
  caf::replies_to<reset_atom, internal_key, std::string>::with<uint32_t>,
  caf::replies_to<shutdown_atom, internal_key>::with<uint32_t>, ///< destroys everything
  // ---- snapshots (issue 16), process surface ----
  caf::reacts_to<pause_atom, internal_key, std::string, bool>>; ///< from a sandbox: id, paused now

/// The entry of a dsecd (published with CAF's middleman): sessions and placement.
using scheduler_actor = caf::typed_actor<
  // ---- client surface ----
  caf::replies_to<open_atom, session_options, caf::actor>::with<session_actor, std::string>,
  /// Reopens a session from its trajectory log (docs/trajectory.md).
  caf::replies_to<resume_atom, std::string, caf::actor>::with<session_actor, std::string>,
  caf::replies_to<lookup_atom, std::string>::with<session_actor>, ///< a session by id
  /// A trainer's client after its coordinator restarted: the session `id`
  /// it had (opened with `options`, owned or not) is found, or rebuilt empty
  /// under that id (the nodes' reports then bring its sandboxes back), and,
  /// owned, is owned by `trainer` from now on. Replies the session and its id.
  caf::replies_to<reattach_atom, std::string, session_options, bool,
                  caf::actor>::with<session_actor, std::string>,
  /// The live sessions (the daemon's "default" too) and the resumable logs.
  caf::replies_to<sessions_atom>::with<std::vector<session_summary>>,
  // by sandbox id, for the command line (no session needed)
  caf::replies_to<exec_atom, std::string, exec_request>::with<exec_result>,
  caf::replies_to<put_atom, std::string, std::string, std::string>::with<uint64_t>,
  caf::replies_to<get_atom, std::string, std::string>::with<std::string>,
  caf::replies_to<destroy_atom, std::string>::with<bool>,
  caf::replies_to<feedback_atom, std::string, chronus_feedback_msg>::with<bool>,
  /// Process handles: as session_actor's, by sandbox id.
  caf::replies_to<signal_atom, std::string, uint64_t, int32_t>::with<bool>,
  caf::replies_to<stdin_atom, std::string, uint64_t, std::string, bool>::with<uint64_t>,
  /// Terminals: a command's window size (rows, columns), as sandbox_actor's.
  caf::replies_to<resize_atom, std::string, uint64_t, uint16_t, uint16_t>::with<bool>,
  caf::replies_to<credit_atom, std::string, uint64_t, uint64_t>::with<bool>,
  /// The log of a sandbox's detached commands (`dsec logs|wait|kill ID`), as
  /// sandbox_actor's.
  caf::replies_to<logs_atom, std::string, logs_request>::with<logs_reply>,
  /// What a sandbox uses now (`dsec stats|top ID`), as sandbox_actor's.
  caf::replies_to<usage_atom, std::string, bool>::with<sandbox_usage>,
  /// Sets a sandbox's egress policy (allow, deny), `dsec net ID`.
  caf::replies_to<network_atom, std::string, std::vector<std::string>,
                  std::vector<std::string>>::with<bool>,
  /// Exposes a port of a sandbox on its node, `dsec expose ID PORT`.
  caf::replies_to<expose_atom, std::string, uint16_t>::with<exposed_port>,
  /// Every node's sandboxes, and the names of the nodes that did not answer
  /// within 3 s (their sandboxes are not in the list).
  caf::replies_to<list_atom>::with<std::vector<sandbox_info>, std::vector<std::string>>,
  caf::replies_to<stats_atom>::with<node_stats>,
  /// Every node, up or lately lost (a scheduler that is not a coordinator
  /// refuses it with errc::unsupported).
  caf::replies_to<cluster_atom>::with<std::vector<member_info>>,
  /// Operating a node by name (`dsec node cordon|uncordon|drain NODE`; on a
  /// daemon that is not a coordinator, its own node): cordon (true) or
  /// uncordon (false), replying its live sandboxes; drain: cordon, then reply
  /// once it is empty (how many it had), or errc::timeout after `timeout_ms`.
  caf::replies_to<cordon_atom, std::string, bool>::with<uint32_t>,
  caf::replies_to<drain_atom, std::string, uint64_t>::with<uint32_t>,
  /// A warm pool of the nodes' own (lives with them): `size` ready sandboxes
  /// of `env`, spread over the nodes (0 removes it); replies how many the
  /// nodes took.
  caf::replies_to<pool_atom, environment, uint32_t>::with<uint32_t>,
  /// Every node's warm pools (of the nodes that answered within 3 s).
  caf::replies_to<pool_atom>::with<std::vector<pool_info>>,
  // ---- member surface: the cluster (docs/cluster.md); a scheduler that is
  // not a coordinator refuses these with errc::unsupported ----
  /// A node joins: its first report, its node actor and its layer store.
  /// Replies the coordinator's layer store (where it fetches missing layers).
  caf::replies_to<join_atom, internal_key, node_report, node_actor,
                  layer_store_actor>::with<internal_key, layer_store_actor>,
  /// A node's heartbeat. false: it is not a member (it was declared lost):
  /// it must destroy its sandboxes and join again.
  caf::replies_to<beat_atom, internal_key, node_report>::with<internal_key, bool>,
  // ---- process surface ----
  /// From a session: places `count` sandboxes of `env` (on this node, or over
  /// the cluster's); replies how many were admitted, with the member key.
  caf::replies_to<place_atom, internal_key, environment, uint32_t, session_actor,
                  placement>::with<internal_key, uint32_t>,
  caf::reacts_to<gone_atom, internal_key, std::string>, ///< a session ended
  /// From a session: layer NAME@VERSION was just made by sandbox ID (a
  /// snapshot). A coordinator copies it from the sandbox's node into its own
  /// store, where every node fetches layers, and replies true once it has;
  /// false when there is nothing to copy (one node, the coordinator's own).
  caf::replies_to<copy_atom, internal_key, std::string, std::string>::with<internal_key, bool>,
  /// From a session: its warm pool of `env` (spread over the nodes).
  caf::replies_to<pool_atom, internal_key, environment, uint32_t, session_actor,
                  std::string>::with<internal_key, uint32_t>,
  caf::reacts_to<ttl_atom, internal_key>,               ///< expire old trajectory logs
  caf::reacts_to<timeout_atom, internal_key>,           ///< check heartbeats
  caf::replies_to<shutdown_atom, internal_key>::with<uint32_t>,
  // ---- snapshots (issue 16), client surface, by sandbox id ----
  caf::replies_to<pause_atom, std::string, bool>::with<bool>,
  caf::replies_to<snapshot_atom, std::string, std::string>::with<std::string>,
  caf::replies_to<fork_atom, std::string, uint32_t, caf::actor>::with<uint32_t>>;

/// One per node of a cluster: its link to the coordinator (joins, sends
/// heartbeats, rejoins; destroys the node's sandboxes when the coordinator is
/// lost). Process surface only: it talks to itself and to the helper that
/// connects it.
using member_actor = caf::typed_actor<
  caf::reacts_to<join_atom, internal_key>,
  /// From the helper that connects (an actor never named over a connection, so
  /// that nobody else can answer its connect request): attempt `n`, the
  /// coordinator's published actor, or null and why not.
  caf::reacts_to<join_atom, internal_key, uint64_t, scheduler_actor, std::string>,
  caf::reacts_to<beat_atom, internal_key>,
  caf::reacts_to<reset_atom, internal_key, uint64_t>>; ///< the grace period of coordinator loss `n` ended

} // namespace dsec

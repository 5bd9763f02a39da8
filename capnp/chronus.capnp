# Chronus: the messages between an agent inside a sandbox and its training session.
#
#   sandbox ──Request──► node's chronus endpoint ──Event──► session ──► trainer
#   sandbox ◄──Reply──── node's chronus endpoint ◄──Feedback────────── trainer
#
# Inside the sandbox, `chronus` (tools/chronus) sends one Request per SOCK_SEQPACKET
# packet on a connection and waits for one Reply on the same connection: a trusted
# connection it opened over its trusted channel (fd 3, docs/chronus.md), or one
# to /run/chronus.sock. Every message on a connection is a single Cap'n Proto message in the standard stream
# framing (segment table, then segments; unpacked) of at most 65,536 bytes
# (runtime/chronus.hpp: chronus_max_frame). tools/chronus/chronus.h encodes Request
# and decodes Reply by hand, so the field numbers, types and the order of the union
# members below are frozen: add new fields at the end only, never renumber.
#
# The node checks each Request (framing, size, token on /run/chronus.sock, field limits; see
# runtime/chronus.hpp) before anything else sees it. A frame that fails is
# answered with `rejected`, counted, and dropped.

@0xd225e8e315d96d73;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("dsec::wire");

struct Metric {
  # One named number of a report, e.g. loss=0.25.
  key @0 :Text;
  # The metric's name: 1 to 128 bytes of printable ASCII; unique within a report.
  value @1 :Float64;
  # The value; finite (no NaN, no infinity).
}

struct FeedbackAsk {
  # What the agent sends when it asks the trainer for feedback.
  payload @0 :Data;
  # Opaque bytes for the trainer (e.g. the agent's answer), at most 32 KiB.
  timeoutMs @1 :UInt32;
  # How long the node waits for the trainer before it replies `timedOut`, in
  # milliseconds; 0 waits for as long as the session lives.
}

struct Request {
  # Sandbox -> node: exactly one per SOCK_SEQPACKET packet. The node answers every
  # Request with one Reply on the same connection, in order.
  token @0 :Data;
  # On /run/chronus.sock: the sandbox's 32-byte secret, which never leaves the
  # node (so every such Request is refused); a Request whose token does not match
  # is rejected unread. On a trusted connection it is not looked at
  # (tools/chronus/chronus.h sends 32 zero bytes).
  union {
    stage @1 :Text;
    # The agent entered a stage (e.g. "plan", "edit", "test"): 1 to 128 bytes of
    # printable ASCII. Answered with `ack`.
    report @2 :List(Metric);
    # Metrics to record: 1 to 64 of them. Answered with `ack`.
    log @3 :Text;
    # One log line for the trainer: valid UTF-8 without NUL, at most 16 KiB.
    # Answered with `ack`.
    feedback @4 :FeedbackAsk;
    # Ask the trainer for feedback. Answered with `feedback`, `timedOut` or
    # `sessionGone` once the trainer answers, the time runs out or the session ends.
  }
}

struct Feedback {
  # Trainer -> sandbox: the answer to one feedback request. It travels from the
  # trainer to the session as these bytes and reaches the sandbox inside a Reply.
  requestId @0 :UInt64;
  # The `id` of the FeedbackRequest this answers (the Event's `seq`).
  reward @1 :Float64;
  # The reward the trainer assigns; finite.
  text @2 :Text;
  # Words for the agent, valid UTF-8 without NUL, at most 16 KiB.
  data @3 :Data;
  # Opaque bytes for the agent, at most 32 KiB.
  done @4 :Bool;
  # True when the trainer considers the episode finished.
}

struct Reply {
  # Node -> sandbox, on the connection that carried the Request: one per Request.
  union {
    ack @0 :Void;
    # The stage, report or log was accepted and forwarded to the session.
    feedback @1 :Feedback;
    # The trainer's answer to a feedback request.
    rejected @2 :Text;
    # The Request was refused; the text says why (malformed frame, bad token,
    # a field over its limit, rate limit exceeded...).
    timedOut @3 :Void;
    # The feedback request's timeoutMs passed without an answer.
    sessionGone @4 :Void;
    # The sandbox's session ended (or was never attached); nobody will answer.
  }
}

struct FeedbackRequest {
  # A feedback request as the session sees it.
  id @0 :UInt64;
  # Names the request; equals the carrying Event's `seq`. The trainer's Feedback
  # echoes it as `requestId`.
  payload @1 :Data;
  # The agent's payload, unchanged (at most 32 KiB).
}

struct Event {
  # Node -> session: one checked Request, stamped by the node. Carried as the bytes
  # of an actor message inside a node and over the network between nodes.
  sandboxId @0 :Text;
  # The sandbox the Request came from (the node's id for it; printable ASCII, at
  # most 128 bytes).
  seq @1 :UInt64;
  # Per sandbox, from 1, one more for every accepted Request; a gap means events
  # were lost.
  monotonicNs @2 :UInt64;
  # CLOCK_MONOTONIC on the node, in nanoseconds, when the node read the Request.
  union {
    stage @3 :Text;
    # As Request.stage.
    report @4 :List(Metric);
    # As Request.report.
    feedbackRequest @5 :FeedbackRequest;
    # As Request.feedback; the trainer answers with a Feedback.
    log @6 :Text;
    # As Request.log.
    lost @7 :Text;
    # Never from a sandbox: the coordinator's word that the node running the
    # sandbox was lost (it died or stopped answering), with why. The sandbox and
    # its files are gone; no event of it follows. seq is 0.
    denied @8 :Text;
    # Never from a sandbox: its node's word that the sandbox (an egress one)
    # tried to reach a destination its policy denies, as "PROTO ADDR:PORT"
    # (PROTO tcp or udp), e.g. "tcp 198.18.0.3:80", or to resolve a name the
    # node's resolver refused it, as "dns NAME", e.g. "dns pypi.org". Once per
    # destination or name while the node remembers it (60 s), within about a
    # second of the attempt. seq is 0.
  }
}

// What the verbs of dsec-client share: writing and reading descriptors, how a
// command's outcome becomes our exit status (exec, run), and the little
// formatters of ps, session and cluster.
#pragma once

#include <chrono>
#include <memory>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/messages.hpp"
#include "runtime/clock.hpp"
#include "runtime/error.hpp"
#include "runtime/io.hpp"
#include "runtime/json.hpp"
#include "tools/dsec/run_options.hpp"

namespace dsec {
class client;
}

namespace dsec::cli::remote {

class context; // tools/dsec/remote.hpp

/// Writes all of `data` to `fd`; false (errno set) if it cannot, e.g. EPIPE
/// when the reader left (SIGPIPE is ignored).
bool write_all(int fd, std::string_view data);

/// check_sandbox_options() for a daemon's sandbox: also refuses `--memory
/// none` and `--pids none` (a local `dsec run`'s), naming the daemon's
/// defaults. Prints the usage error and returns 2, or nothing.
std::optional<int> check_daemon_sandbox_options(std::string_view verb, const sandbox_options& sb);

/// The positional session id at the cursor, once its verb's own options were
/// offered: -1 when it was read into `id`; else the exit status of the usage
/// error (an unknown option, a second id).
int take_session_id(args& a, std::string_view verb, std::string& id);

/// The flags of a command that `exec` and `run` share: -i/--stdin, --trusted,
/// --pristine, --idempotent, --detach, -t/--tty (and -it).
struct exec_flags {
  bool input = false, trusted = false, pristine = false, idempotent = false, detach = false;
  bool tty = false;
  /// Sets the request's trusted, pristine and idempotent.
  void apply(exec_request& req) const {
    req.trusted = trusted;
    req.pristine = pristine;
    req.idempotent = idempotent;
  }
};

/// The sandbox ids of a verb that takes only `ID...` (rm, pause, resume,
/// inspect): --help prints `usage`, `--` ends the options, an option is a usage
/// error, no id is the usage error "no sandbox id given (`synopsis`)". -1 when
/// `ids` holds them; else the exit status to return.
int take_sandbox_ids(args& a, std::string_view verb, const char* usage,
                     std::string_view synopsis, std::vector<std::string>& ids);

/// Fills in the names (keys) and tags of `v`'s sandboxes, which a node's list
/// does not know: from their sessions' lists, one call per session. A session
/// that does not answer leaves its sandboxes without.
void fill_labels(client& c, std::vector<sandbox_info>& v);

/// The sandbox id that `name` stands for, wherever a verb takes an id: `name`
/// itself when it has the form of an id, else the one live sandbox whose
/// name is `name` (`run --name`, i.e. its key), in any session. not_found when
/// none has it (naming the nodes that did not answer, if some did not);
/// invalid_argument when several have it (one per session: their ids).
expected<std::string> resolve_sandbox(client& c, const std::string& name);

/// The arguments of a verb on one sandbox (logs, wait, kill): `ID` and the
/// given options, each `--name VALUE` (or `=VALUE`) into its string or a flag
/// into its bool, in any order. -1 once they are all taken and ID is there;
/// else the status to exit with (0 after --help, 2 after a usage error).
struct one_sandbox_args {
  std::vector<std::pair<const char*, std::string*>> options;
  std::vector<std::pair<const char*, bool*>> flags;
};
int take_one_sandbox(args& a, std::string_view verb, const char* usage, std::string_view name,
                     const one_sandbox_args& o, std::string& id);

/// The start of the verbs of detached commands (logs, wait, kill): their
/// `--exec N` (`exec_text`, a command's exec id as `dsec inspect ID` lists
/// them; 0 when empty) into `exec`, then the connection, and `id` (an id or a
/// name) turned into the sandbox's id in place. nullptr after the error was
/// printed, with the status to exit with in `rc`.
client* open_sandbox(context& ctx, std::string_view verb, std::string& id,
                     const std::string& exec_text, uint64_t& exec, int& rc);
/// fail(e), its message saying which sandbox it is about unless it does:
/// "sandbox ID: ..." (a call that raced the sandbox's end may not).
int fail_for(const std::string& id, error e);
/// A sandbox's detached commands (exec: one of them, 0: all), without output.
expected<logs_reply> detached_commands(client& c, const std::string& id, uint64_t exec);
/// open_sandbox, then detached_commands(id, exec) into `commands` (wait, kill).
client* open_detached(context& ctx, std::string_view verb, std::string& id,
                      const std::string& exec_text, uint64_t& exec, logs_reply& commands, int& rc);

/// Runs `act` on the sandbox each of `ids` names (ids or names, resolve_sandbox),
/// in order; an id that cannot be resolved, or an `act` that fails, is reported
/// and makes the result 1 (else 0), and the others still go.
int for_each_sandbox(client& c, const std::vector<std::string>& ids,
                     const std::function<expected<void>(const std::string& id)>& act);

/// Takes the current argument when it is one of those flags.
bool parse_exec_flag(args& a, exec_flags& f);

/// Without -i, says on stderr that our stdin is not sent when it holds data
/// meant for CMD: a pipe or socket with bytes waiting, or a non-empty file. A
/// terminal, /dev/null or an empty pipe is left unremarked.
void note_unsent_stdin(const exec_flags& f);

/// A whole number of at most 20 digits, no sign.
bool parse_u64(const std::string& v, uint64_t& out);

/// "42s", "3m07s", "2h05m", "3d04h".
std::string age(uint64_t ms);

/// An environment's layers: base/workdir/tool,tool... ("-": no workdir).
std::string layers_of(const environment& env);

/// One sandbox as a JSON object (`inspect`, `ps --json`): id, session, state,
/// node, created_ms, ttl_left_ms, running, key (null if none), tags, and its
/// environment (environment::to_json).
std::string sandbox_json(const sandbox_info& i);

// ---- exec and run --------------------------------------------------------------------

/// The exit status of a command that could not be started, from the daemon's
/// error: 127 not found, 126 cannot be executed (or --cwd, --user failed);
/// 0 when the error is about something else.
int exec_failure_status(const error& e);

/// How a finished command maps to our exit status (the conventions of `dsec run`).
int status_of(const exec_result& r, const std::optional<std::chrono::milliseconds>& timeout);

/// A command that could not run, reported: 126/127 when it could not be
/// started, else `code`.
int exec_error(const error& e, int code);

/// The request for `argv` with the options of `cs`.
exec_request make_request(const command_spec& cs, std::vector<std::string> argv);

/// Our stdout or stderr is gone (a `| head` that has read enough): end as
/// SIGPIPE would have ended us. `exec` just exits; `run` first destroys its
/// sandbox.
extern const int broken_pipe_status;

/// Writes streamed output to our stdout (1) or stderr (2); exits with
/// broken_pipe_status when the reader left.
void print_output(uint8_t stream, std::string_view data);

/// Writes a detached log's pieces (logs_reply) from (piece, offset) on, each
/// to our stdout or stderr as its stream says; false once our output failed
/// (a reader that went away: `dsec logs ID | head`).
bool print_pieces(const std::vector<log_piece>& pieces, std::pair<size_t, size_t> from = {0, 0});

/// Says on stderr (as `verb`) that `bytes` of a log were gone: before the
/// first read (`first`), or between two reads of a follower. Nothing for 0.
void tell_dropped(const char* verb, uint64_t bytes, bool first);

} // namespace dsec::cli::remote

namespace dsec {
class process;
}

namespace dsec::cli::remote {

/// -i through a daemon: feeds our stdin (fd 0) to `p`'s command as it reads
/// it (a process handle with open_stdin: at most max_stdin_chunk bytes are
/// in flight from us, and the daemon holds at most stdin_buffer more, so a
/// large input never sits whole in either), then closes its stdin at our
/// end of file; returns the command's end. A command that closes its stdin
/// or ends first just stops the feed. `feeding` tells whether the reader of
/// fd 0 is still blocked in read(2) then: the caller must then leave with
/// _exit (after flushing), not return, as that thread still holds `p`.
expected<exec_result> feed_stdin_and_wait(const std::shared_ptr<process>& p, bool& feeding);

/// -t: blocks SIGWINCH in this thread, before the actor system's threads
/// start (they inherit the mask), so that run_on_terminal's thread alone
/// takes it. Nothing without -t.
void prepare_terminal(const exec_flags& f);

/// -t through a daemon: CMD on a terminal of its sandbox (exec_request.tty),
/// sized as ours (the first of our stdin, stdout, stderr that is a terminal;
/// 24x80 if none is), resized on each SIGWINCH. With `input` (-i) our stdin
/// is streamed as it is (feed_stdin_and_wait; its end types ^D there) and,
/// when it is a terminal, put in raw mode until we leave, by any way out
/// (pty::restore). `start` starts the request with a process handle.
expected<exec_result>
run_on_terminal(const std::function<std::shared_ptr<process>(exec_request&)>& start,
                exec_request req, bool input, bool& feeding);

} // namespace dsec::cli::remote

"""dsec's exceptions: one class per dsec::errc code (runtime/error.hpp).

Every error that comes from the daemon or the client library is a ``dsec.Error``
with:

- ``code``: the numeric ``dsec::errc`` value (e.g. 2),
- ``code_name``: its stable name (e.g. ``"not_found"``),
- ``message``: the daemon's sentence, which names the bad input,
- ``step``, ``path``, ``errno``: where it failed, when known (else ``""``/0).

``retryable`` is true only where a retry can succeed: the codes the caller
should back off and retry (``overloaded``: a capacity that will free up) or
reconnect after (``disconnected``: the daemon went away; reconnect and resume).
``Closed`` (the session or sandbox was closed, or a sandbox's TTL ran out) and
``Lost`` are not: make a new one.

``CommandFailed`` is raised by ``exec(..., check=True)`` for a command that ran
and failed (its ``result`` attached); it comes from the SDK, not the daemon.

Mistakes caught in Python before anything is sent (a wrong type, a negative
count) raise ``TypeError`` or ``ValueError`` naming the argument instead.
"""

__all__ = [
    "Error", "InvalidArgument", "NotFound", "AlreadyExists", "WrongKind", "InUse",
    "Malformed", "TooLarge", "Unauthenticated", "Unauthorized", "Overloaded", "SystemFailure",
    "ToolFailed", "Timeout", "SandboxFailed", "Disconnected", "Lost", "Unsupported",
    "Closed", "CommandFailed",
]


class Error(Exception):
    """A dsec error: see the module's documentation for its attributes."""

    code = None
    code_name = None

    def __init__(self, message, *, code=None, code_name=None, step="", path="", errno=0):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if code_name is not None:
            self.code_name = code_name
        self.step = step
        self.path = path
        self.errno = errno

    @property
    def retryable(self):
        return self.code is not None and (20 <= self.code < 40 or self.code == 60)

    def __str__(self):
        if self.step and f"'{self.step}'" not in self.message:
            return f"step '{self.step}' failed: {self.message}"
        return self.message


def _define(name, code, code_name, doc):
    cls = type(name, (Error,), {"code": code, "code_name": code_name, "__doc__": doc})
    cls.__module__ = "dsec"
    return cls


# 1..19: the request is wrong. Fix it; retrying it unchanged fails again.
InvalidArgument = _define("InvalidArgument", 1, "invalid_argument",
                          "Malformed input: a name, a size, a flag.")
NotFound = _define("NotFound", 2, "not_found", "An unknown layer, sandbox, session or file.")
AlreadyExists = _define("AlreadyExists", 3, "already_exists", "The name is taken.")
WrongKind = _define("WrongKind", 4, "wrong_kind",
                    "A layer of the wrong kind, e.g. a tool given as the base.")
InUse = _define("InUse", 5, "in_use", "Refused while something still uses it.")
Malformed = _define("Malformed", 6, "malformed", "Bytes that do not parse as the expected message.")
TooLarge = _define("TooLarge", 7, "too_large", "Over a size limit.")
Unauthenticated = _define("Unauthenticated", 8, "unauthenticated",
                          "A missing or wrong credential.")
Unauthorized = _define("Unauthorized", 9, "unauthorized",
                       "An internal verb of dsec, sent without the daemon's or cluster's key.")
# A NotFound too (what was closed is not there any more), with its own code.
Closed = type("Closed", (NotFound,), {
    "code": 10, "code_name": "closed", "__module__": "dsec",
    "__doc__": "It was closed: the session (by close()), or the sandbox (destroyed, its TTL "
               "ran out, or closed before the session was resumed). Make a new one."})
# 20..39: fine, but cannot be served now. Back off and retry.
Overloaded = _define("Overloaded", 20, "overloaded",
                     "Out of slots, quota, pids, memory or another capacity.")
# 40..59: something failed while serving the request.
SystemFailure = _define("SystemFailure", 40, "system_error",
                        "A system call failed on the node (see .errno).")
ToolFailed = _define("ToolFailed", 41, "tool_failed", "An external tool failed.")
Timeout = _define("Timeout", 42, "timeout", "A deadline passed.")
SandboxFailed = _define("SandboxFailed", 43, "sandbox_failed",
                        "The sandbox broke its contract with dsec.")
# 60..79: the other side went away. Reconnect.
Disconnected = _define("Disconnected", 60, "disconnected",
                       "The daemon, the session or this client is gone (or was never reached).")
Lost = _define("Lost", 61, "lost",
               "The node running the sandbox was lost (it died or stopped answering); "
               "the sandbox and its state are gone.")
# 80..99: not available on this machine or build.
Unsupported = _define("Unsupported", 80, "unsupported", "Not available on this node.")

_BY_CODE = {cls.code: cls for cls in (
    InvalidArgument, NotFound, AlreadyExists, WrongKind, InUse, Malformed, TooLarge,
    Unauthenticated, Unauthorized, Closed, Overloaded, SystemFailure, ToolFailed, Timeout,
    SandboxFailed,
    Disconnected, Lost, Unsupported)}


class CommandFailed(Error):
    """A command that ran and failed, from ``exec(..., check=True)``: it exited
    with a code other than 0, was killed by a signal, or timed out.

    ``result`` is its ExecResult; ``sandbox_id`` and ``argv`` say which it
    was; ``exit_code`` is the result's (128+N for a signal N).
    """

    code = None
    code_name = "command_failed"

    def __init__(self, sandbox_id, argv, result):
        if result.timed_out:
            how = f"timed out and was killed (exit code {result.exit_code})"
        elif result.signal:
            how = f"was killed by signal {result.signal} (exit code {result.exit_code})"
            if result.oom_killed:
                how += ", out of memory"
        else:
            how = f"exited with code {result.exit_code}"
        err = result.stderr[-400:].decode(errors="replace").strip()
        cmd = argv[2] if len(argv) == 3 and argv[:2] == ["/bin/sh", "-c"] else argv
        super().__init__(f"command {cmd!r} in sandbox {sandbox_id} {how}"
                         + (f": {err}" if err else ""))
        self.result = result
        self.sandbox_id = sandbox_id
        self.argv = list(argv)
        self.exit_code = result.exit_code


def from_native(code, code_name, message, step, path, sys_errno):
    """The exception for a dsec::error (called by the _dsec extension)."""
    cls = _BY_CODE.get(code, Error)
    return cls(message or code_name, code=code, code_name=code_name, step=step, path=path,
               errno=sys_errno)

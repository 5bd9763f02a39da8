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

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._dsec import ExecResult

__all__ = [
    "Error", "InvalidArgument", "NotFound", "AlreadyExists", "WrongKind", "InUse",
    "Malformed", "TooLarge", "Unauthenticated", "Unauthorized", "Overloaded", "SystemFailure",
    "ToolFailed", "Timeout", "SandboxFailed", "Disconnected", "Lost", "Unsupported",
    "Closed", "CommandFailed", "Paused",
]


class Error(Exception):
    """A dsec error: see the module's documentation for its attributes."""

    code: int | None = None
    code_name: str | None = None

    def __init__(self, message: str, *, code: int | None = None, code_name: str | None = None,
                 step: str = "", path: str = "", errno: int = 0) -> None:
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
    def retryable(self) -> bool:
        return self.code is not None and (20 <= self.code < 40 or self.code == 60)

    def __str__(self) -> str:
        if self.step and f"'{self.step}'" not in self.message:
            return f"step '{self.step}' failed: {self.message}"
        return self.message


# One class per code, written out (not made by type()) so that type checkers
# see them; each shows as dsec.NAME.

# 1..19: the request is wrong. Fix it; retrying it unchanged fails again.
class InvalidArgument(Error):
    """Malformed input: a name, a size, a flag."""
    __module__ = "dsec"
    code = 1
    code_name = "invalid_argument"


class NotFound(Error):
    """An unknown layer, sandbox, session or file."""
    __module__ = "dsec"
    code = 2
    code_name = "not_found"


class AlreadyExists(Error):
    """The name is taken."""
    __module__ = "dsec"
    code = 3
    code_name = "already_exists"


class WrongKind(Error):
    """A layer of the wrong kind, e.g. a tool given as the base."""
    __module__ = "dsec"
    code = 4
    code_name = "wrong_kind"


class InUse(Error):
    """Refused while something still uses it."""
    __module__ = "dsec"
    code = 5
    code_name = "in_use"


class Malformed(Error):
    """Bytes that do not parse as the expected message."""
    __module__ = "dsec"
    code = 6
    code_name = "malformed"


class TooLarge(Error):
    """Over a size limit."""
    __module__ = "dsec"
    code = 7
    code_name = "too_large"


class Unauthenticated(Error):
    """A missing or wrong credential."""
    __module__ = "dsec"
    code = 8
    code_name = "unauthenticated"


class Unauthorized(Error):
    """An internal verb of dsec, sent without the daemon's or cluster's key."""
    __module__ = "dsec"
    code = 9
    code_name = "unauthorized"


# A NotFound too (what was closed is not there any more), with its own code.
class Closed(NotFound):
    """It was closed: the session (by close()), or the sandbox (destroyed, its TTL
    ran out, or closed before the session was resumed). Make a new one."""
    __module__ = "dsec"
    code = 10
    code_name = "closed"


# 20..39: fine, but cannot be served now. Back off and retry.
class Overloaded(Error):
    """Out of slots, quota, pids, memory or another capacity."""
    __module__ = "dsec"
    code = 20
    code_name = "overloaded"


# 40..59: something failed while serving the request.
class SystemFailure(Error):
    """A system call failed on the node (see .errno)."""
    __module__ = "dsec"
    code = 40
    code_name = "system_error"


class ToolFailed(Error):
    """An external tool failed."""
    __module__ = "dsec"
    code = 41
    code_name = "tool_failed"


class Timeout(Error):
    """A deadline passed."""
    __module__ = "dsec"
    code = 42
    code_name = "timeout"


class SandboxFailed(Error):
    """The sandbox broke its contract with dsec."""
    __module__ = "dsec"
    code = 43
    code_name = "sandbox_failed"


# 60..79: the other side went away. Reconnect.
class Disconnected(Error):
    """The daemon, the session or this client is gone (or was never reached)."""
    __module__ = "dsec"
    code = 60
    code_name = "disconnected"


class Lost(Error):
    """The node running the sandbox was lost (it died or stopped answering);
    the sandbox and its state are gone."""
    __module__ = "dsec"
    code = 61
    code_name = "lost"


# 80..99: not available on this machine or build.
class Unsupported(Error):
    """Not available on this node."""
    __module__ = "dsec"
    code = 80
    code_name = "unsupported"


# snapshots (issue 16)
class Paused(Error):
    """The sandbox is paused (Sandbox.pause()): resume() it first."""

    code = 11
    code_name = "paused"


_BY_CODE: dict[int, type[Error]] = {cls.code: cls for cls in (
    InvalidArgument, NotFound, AlreadyExists, WrongKind, InUse, Malformed, TooLarge,
    Unauthenticated, Unauthorized, Closed, Overloaded, SystemFailure, ToolFailed, Timeout,
    SandboxFailed, Disconnected, Lost, Unsupported, Paused) if cls.code is not None}


class CommandFailed(Error):
    """A command that ran and failed, from ``exec(..., check=True)``: it exited
    with a code other than 0, was killed by a signal, or timed out.

    ``result`` is its ExecResult; ``sandbox_id`` and ``argv`` say which it
    was; ``exit_code`` is the result's (128+N for a signal N).
    """

    code = None
    code_name = "command_failed"

    def __init__(self, sandbox_id: str, argv: list[str], result: ExecResult) -> None:
        if result.timed_out:
            how = f"timed out and was killed (exit code {result.exit_code})"
        elif result.signal:
            how = f"was killed by signal {result.signal} (exit code {result.exit_code})"
            if result.oom_killed:
                how += ", out of memory"
        else:
            how = f"exited with code {result.exit_code}"
        err = result.stderr[-400:].decode(errors="replace").strip()
        cmd: str | list[str] = argv[2] if len(argv) == 3 and argv[:2] == ["/bin/sh", "-c"] else argv
        super().__init__(f"command {cmd!r} in sandbox {sandbox_id} {how}"
                         + (f": {err}" if err else ""))
        self.result = result
        self.sandbox_id = sandbox_id
        self.argv = list(argv)
        self.exit_code = result.exit_code


def from_native(code: int, code_name: str, message: str, step: str, path: str,
                sys_errno: int) -> Error:
    """The exception for a dsec::error (called by the _dsec extension)."""
    cls = _BY_CODE.get(code, Error)
    return cls(message or code_name, code=code, code_name=code_name, step=step, path=path,
               errno=sys_errno)

"""dsec: the Python trainer SDK (python/README.md).

    import dsec
    with dsec.connect("127.0.0.1:7070") as c, c.session(quota=512, ttl=600) as s:
        sbs = s.create(base="py@1", workdir="task-17@3", tools=["grader@2"], count=512)
        r = sbs[0].exec("make test", timeout=60)
        print(r.exit_code, r.stdout, r.stderr)

Blocking calls release the GIL while they wait and are safe from many threads.
Each has an ``async def`` twin ending in ``_async`` for asyncio; thousands may be
in flight from one thread, as no thread waits for any of them. Errors are
``dsec.Error`` subclasses (``dsec.errors``).
"""

from __future__ import annotations

import asyncio
import atexit
import io
import math
import numbers
import os
import posixpath
import queue
import shutil
import signal as _signal
import tempfile
import threading
import weakref
from typing import (TYPE_CHECKING, Any, AsyncIterator, BinaryIO, Callable, Generator, Iterable,
                    Iterator, List, Literal, Mapping, NamedTuple, Optional, Sequence, Union,
                    overload)


def _import_extension() -> Any:
    """dsec._dsec, or an ImportError that says which Python it was built for."""
    try:
        from . import _dsec as ext
        return ext
    except ImportError as e:
        import glob
        import sys
        import sysconfig
        here = os.path.dirname(os.path.abspath(__file__))
        mine = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        this = (f"this is {sys.implementation.name} {sys.version.split()[0]} "
                f"({sys.executable}), which loads extensions named _dsec{mine}")
        built = sorted(os.path.basename(p) for p in glob.glob(os.path.join(here, "_dsec*.so")))
        if not built:
            why = (f"dsec's extension _dsec is not in {here}; {this}. Build it "
                   "(python/README.md)")
        elif f"_dsec{mine}" not in built:
            why = (f"dsec's extension was built for another Python: {', '.join(built)} in "
                   f"{here}; {this}. Build and install dsec with this Python, or run it "
                   "with the Python it was built for")
        else:  # the loader's own words say why (a missing shared library, ...)
            why = f"dsec's extension {here}/_dsec{mine} (built for this Python) did not load: {e}"
        raise ImportError(why, name="dsec._dsec", path=here) from e


if TYPE_CHECKING:  # the extension's types (dsec/_dsec.pyi)
    from . import _dsec
else:
    _dsec = _import_extension()

from . import _files
from ._fs import AsyncWatch, FileEvent, FileInfo, Files, Watch
from .errors import (Error, InvalidArgument, NotFound, AlreadyExists, WrongKind, InUse,
                     Malformed, TooLarge, Unauthenticated, Unauthorized, Overloaded, SystemFailure,
                     ToolFailed, Timeout, SandboxFailed, Disconnected, Lost, Unsupported,
                     Closed, CommandFailed, Paused, from_native as _from_native)

_dsec._set_error_factory(_from_native)

ExecResult = _dsec.ExecResult
SessionInfo = _dsec.SessionInfo
SandboxInfo = _dsec.SandboxInfo
SandboxList = _dsec.SandboxList
ExposedPort = _dsec.ExposedPort
NodeStats = _dsec.NodeStats
BackendOffer = _dsec.BackendOffer
EgressTraffic = _dsec.EgressTraffic
SandboxUsage = _dsec.SandboxUsage
ResourceUsage = _dsec.ResourceUsage
SandboxProcess = _dsec.SandboxProcess

# What the calls accept (each is checked at run time, with a TypeError or a
# ValueError naming the argument).
Data = Union[bytes, bytearray, memoryview, str]
# put's data: bytes or text, or a local file to stream (a path or a binary file object)
PutData = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]", BinaryIO]
# get's `into`: a local path or a binary file object to stream into
GetInto = Union[str, "os.PathLike[str]", BinaryIO]
Size = Union[int, str]
Seconds = Union[int, float]
Command = Union[str, Sequence[str]]
Env = Union[Mapping[str, str], Sequence[str]]
User = Union[int, tuple[int, int], str]
# A terminal for a command: True (24 rows, 80 columns) or (rows, cols).
Pty = Union[bool, tuple[int, int]]
OutputFn = Callable[[str, bytes], object]  # f(stream, chunk): stream "stdout" or "stderr"
_Done = Callable[[Any, Optional[BaseException]], None]

__all__ = [
    "connect", "Client", "Session", "Sandbox", "Batch", "Event", "ExecResult", "ExecStream",
    "AsyncExecStream", "SandboxInfo", "SandboxList", "ExposedPort", "NodeStats", "BackendOffer", "EgressTraffic",
    "SandboxUsage", "ResourceUsage", "SandboxProcess", "Files", "SessionInfo",
    "FileEvent",
    "FileInfo", "Watch", "AsyncWatch",
    "Error", "InvalidArgument", "NotFound", "AlreadyExists", "WrongKind", "InUse", "Malformed",
    "TooLarge", "Unauthenticated", "Unauthorized", "Overloaded", "SystemFailure", "ToolFailed",
    "Timeout", "SandboxFailed", "Disconnected", "Lost", "Unsupported", "Closed", "CommandFailed",
    "Paused", "Answer", "Data", "Size", "Seconds", "Command", "Env", "User", "Pty", "Process",
    "Egress", "Network",
]

# ---- clients still open at exit are closed before the interpreter goes ---------------

_open_clients: weakref.WeakSet[Client] = weakref.WeakSet()
_open_lock = threading.Lock()


@atexit.register
def _close_all() -> None:
    with _open_lock:
        clients = list(_open_clients)
    for c in clients:
        c.close()


# ---- arguments ---------------------------------------------------------------------------

def _labels(key: object, tags: object) -> tuple[str, dict[str, str]]:
    if key is None:
        key = ""
    else:
        key = _str("key", key, allow_empty=False)
    if tags is None:
        return key, {}
    if not isinstance(tags, dict):
        raise TypeError(f"tags: expected a dict of str to str, got {type(tags).__name__}")
    return key, {_str("tags key", k, allow_empty=False): _str(f"tags[{k!r}]", v)
                 for k, v in tags.items()}


def _int(name: str, value: object, lo: int = 0, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f"from {lo} to {hi}" if hi is not None else f"of at least {lo}"
        raise ValueError(f"{name}: expected a whole number {bound}, got {value}")
    return value


def _seconds_ms(name: str, value: object, allow_zero: bool = False) -> int:
    """Seconds (int or float) as whole milliseconds, at least 1 ms."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected seconds as a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name}: expected a positive number of seconds, got {value}")
    return max(1, int(round(value * 1000))) if value else 0


def _size(name: str, value: object) -> int:
    """Bytes from an int or a string such as '512m' or '2g'."""
    if value is None:
        return 0
    if isinstance(value, str):
        return _dsec.parse_size(value, name)
    return _int(name, value)


def _str(name: str, value: object, allow_empty: bool = True) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a str, got {type(value).__name__}")
    if not allow_empty and not value:
        raise ValueError(f"{name}: must not be empty")
    return value


def _bytes(name: str, value: object) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{name}: expected bytes or str, got {type(value).__name__}")


class _Writer:
    """A writer (write(b) -> len(b)) that hands each piece to `put`."""

    def __init__(self, put: Callable[[bytes], object]) -> None:
        self._put = put

    def write(self, b: bytes) -> int:
        self._put(b)
        return len(b)


def _parse_address(address: object) -> tuple[str, int]:
    if not isinstance(address, str):
        raise TypeError(f"address: expected 'HOST:PORT' as a str, got {type(address).__name__}")
    return _dsec.parse_endpoint(address, "address")


class Egress:
    """A sandbox network that reaches out through its node's uplink, by a
    policy (docs/network.md): ``create(..., network=dsec.Egress(allow=[...]))``.

    allow, deny: rules, each "CIDR[:PORT[-PORT]]", "DOMAIN", "*.DOMAIN" or a
    service name of the node (dsecd --services); everything else is denied,
    and private ranges, link-local, the metadata address and the node's own
    addresses are denied unless a rule names them. Domains need a node with a
    DNS upstream (dsecd --dns-upstream). The node checks the rules: a bad one
    fails the create with dsec.InvalidArgument naming it. The node needs an
    uplink (dsecd --uplink). Sandbox.set_network() changes the policy later."""

    __slots__ = ("allow", "deny")

    def __init__(self, allow: Iterable[str] = (), deny: Iterable[str] = ()) -> None:
        self.allow: list[str] = _rules("allow", allow)
        self.deny: list[str] = _rules("deny", deny)

    def __repr__(self) -> str:
        return f"Egress(allow={self.allow!r}, deny={self.deny!r})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Egress) and self.allow == other.allow
                and self.deny == other.deny)

    def __hash__(self) -> int:
        return hash((tuple(self.allow), tuple(self.deny)))


#: create()'s network: "none" (the default: no network at all), "loopback"
#: (a private network with loopback only; what net=True gives), "egress"
#: (Egress() with no rule: out through the uplink, everything denied), or an
#: Egress with its policy.
Network = Union[str, Egress]


def _rules(name: str, value: object) -> list[str]:
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name}: expected a list of rules, got a str ({value!r}); "
                        f"write {name}=[{value!r}]")
    if not isinstance(value, Iterable):
        raise TypeError(f"{name}: expected a list of rules, got {type(value).__name__}")
    return [_str(f"{name}[]", r, allow_empty=False) for r in value]


def _network(env: _dsec.Environment, net: object, network: object) -> None:
    env.net = bool(net)
    if network is None:
        return
    if isinstance(network, str):
        if network not in ("none", "loopback", "egress"):
            raise ValueError(f"network: expected 'none', 'loopback', 'egress' or a "
                             f"dsec.Egress, got {network!r}")
        if network == "none" and net:
            raise ValueError("network='none' contradicts net=True (give one of them)")
        if network == "none":
            return
        network = Egress() if network == "egress" else None
        env.net = True
        if network is None:
            return
    if not isinstance(network, Egress):
        raise TypeError(f"network: expected 'none', 'loopback', 'egress' or a dsec.Egress, "
                        f"got {type(network).__name__}")
    env.net = True
    env.egress = True
    env.allow = list(network.allow)
    env.deny = list(network.deny)


def _environment(base: object, workdir: object, tools: Iterable[str] | None, memory: object,
                 pids: object, cpus: object, disk: object, net: object, chronus: object,
                 ttl: object, snapshot: object = None,
                 backend: object = "container",
                 expose: Iterable[int] | None = None,
                 mounts: Iterable[str] | None = None,
                 network: object = None) -> _dsec.Environment:
    env = _dsec.Environment()
    env.backend = _str("backend", backend, allow_empty=False)
    if snapshot is not None:  # snapshots (issue 16): the layers come from the diff
        env.snapshot = _str("snapshot", snapshot, allow_empty=False)
        env.base = "" if base is None else _str("base", base)
    else:
        env.base = _str("base", base, allow_empty=False)
    env.workdir = "" if workdir is None else _str("workdir", workdir)
    if isinstance(tools, str):
        raise TypeError("tools: expected a list of NAME@VERSION strings, got a str "
                        f"({tools!r}); write tools=[{tools!r}]")
    env.tools = [_str("tools[]", t, allow_empty=False) for t in (tools or ())]
    env.memory = _size("memory", memory)
    env.pids = 0 if pids is None else _int("pids", pids)
    if cpus is not None:
        if isinstance(cpus, bool) or not isinstance(cpus, numbers.Real):
            raise TypeError(f"cpus: expected a number, got {type(cpus).__name__}")
        if not math.isfinite(cpus) or cpus < 0:
            raise ValueError(f"cpus: expected a positive number of CPUs, got {cpus}")
        env.cpus = float(cpus)
    env.disk = _size("disk", disk)
    _network(env, net, network)
    env.chronus = bool(chronus)
    env.ttl_ms = 0 if ttl is None else _seconds_ms("ttl", ttl)
    env.expose = [_port("expose[]", p) for p in (expose or ())]
    if isinstance(mounts, str):
        raise TypeError("mounts: expected a list of 'HOST:SANDBOX[:ro|:rw]' strings, got a str "
                        f"({mounts!r}); write mounts=[{mounts!r}]")
    env.mounts = [_str("mounts[]", m, allow_empty=False) for m in (mounts or ())]
    return env


def _port(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected a TCP port (int), got {type(value).__name__}")
    if not 1 <= value <= 65535:
        raise ValueError(f"{name}: expected a TCP port from 1 to 65535, got {value}")
    return value


def _set_pty(req: _dsec.ExecRequest, pty: object) -> None:
    """exec's pty=: True, or (rows, cols)."""
    if pty is False or pty is None:
        return
    if pty is True:
        rows, cols = 24, 80
    elif isinstance(pty, tuple) and len(pty) == 2:
        rows = _int("pty (rows)", pty[0], lo=1, hi=65535)
        cols = _int("pty (cols)", pty[1], lo=1, hi=65535)
    else:
        raise TypeError(f"pty: expected True or (rows, cols), got {pty!r}")
    req.tty = True
    req.rows = rows
    req.cols = cols


def _request(cmd: object, timeout: object, env: object, cwd: object, user: object,
             input: object, trusted: object, idempotent: object, max_output: object,
             pristine: object = False) -> _dsec.ExecRequest:
    req = _dsec.ExecRequest()
    if isinstance(cmd, str):
        req.argv = ["/bin/sh", "-c", cmd]
    elif isinstance(cmd, (list, tuple)) and cmd:
        req.argv = [_str("cmd[]", a) for a in cmd]
    else:
        raise TypeError("cmd: expected a shell command (str) or a non-empty argv list, "
                        f"got {cmd!r}")
    if timeout is not None:
        req.timeout_ms = _seconds_ms("timeout", timeout)
    if env is not None:
        if isinstance(env, dict):
            items = []
            for k, v in env.items():
                k = _str("env key", k, allow_empty=False)
                if "=" in k:
                    raise ValueError(f"env: the name {k!r} contains '='")
                items.append(f"{k}={_str(f'env[{k!r}]', v)}")
            req.env = items
        elif isinstance(env, (list, tuple)):
            for kv in env:
                if not isinstance(kv, str) or "=" not in kv:
                    raise ValueError(f"env: expected 'NAME=VALUE' strings, got {kv!r}")
            req.env = list(env)
        else:
            raise TypeError(f"env: expected a dict or a list of 'NAME=VALUE', "
                            f"got {type(env).__name__}")
    if cwd is not None:
        req.cwd = _files.check_path(cwd, "cwd")
    if user is not None:
        if isinstance(user, str):
            # USER or USER:GROUP, names or numbers: the sandbox looks names up
            # in its image.
            if not user or user.count(":") > 1 or "\0" in user:
                raise ValueError(f"user: expected 'NAME' or 'NAME:GROUP', got {user!r}")
            req.user = user
        elif isinstance(user, tuple) and len(user) == 2:
            req.uid = _int("user (uid)", user[0])
            req.gid = _int("user (gid)", user[1])
        else:
            req.uid = req.gid = _int("user", user)
    if input is not None:
        req.input = _bytes("input", input)
    req.trusted = bool(trusted)
    req.pristine = bool(pristine)
    if req.pristine and not req.trusted:
        raise ValueError("pristine=True needs trusted=True (only a trusted command runs in "
                         "the pristine root)")
    req.idempotent = bool(idempotent)
    if max_output is not None:
        req.max_output = _int("max_output", max_output, lo=1)
    return req


# ---- asyncio: a completion from one of CAF's threads settles a future on the loop --------

def _settle(fut: asyncio.Future[Any], value: object, exc: BaseException | None) -> None:
    if fut.done():  # cancelled meanwhile: the call itself ran to its end anyway
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


def _future() -> tuple[asyncio.Future[Any], _Done]:
    """A future of the running loop, and the `done(value, exc)` that settles it.

    `done` runs on one of CAF's threads (with the GIL); it only schedules the
    settling on the loop. If the loop has been closed meanwhile, nobody can
    await the result any more and it is dropped.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def done(value: object, exc: BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(_settle, fut, value, exc)
        except RuntimeError:
            pass

    return fut, done


# ---- the client ----------------------------------------------------------------------------

def connect(address: str | Sequence[str], *, threads: int = 2,
            tls: str | os.PathLike[str] | None = None) -> Client:
    """Connects to the dsecd at "HOST:PORT"; returns a Client (a context manager).

    `address` may name several addresses of the daemon (a list, or one str
    with commas: "10.0.0.1:7070,10.0.0.2:7070"): the first that answers is
    used, and when its link drops (a coordinator restarted elsewhere) the
    client reconnects to each in turn and its sessions go on
    (docs/cluster.md). ValueError for a malformed address; dsec.Disconnected,
    saying why, when no dsecd answers at any. `threads`: the client's CAF
    scheduler threads. `tls`: a directory with ca.pem, cert.pem and key.pem
    (tools/tls-certs makes it) to speak TLS, as a dsecd started with --tls
    requires; a missing or bad file raises dsec.NotFound or
    dsec.InvalidArgument naming it.
    """
    if isinstance(address, str):
        parts = [a.strip() for a in address.split(",")] if "," in address else [address]
    elif isinstance(address, (list, tuple)):
        parts = list(address)
    else:
        raise TypeError("address: expected 'HOST:PORT' (or several, as a list or with commas), "
                        f"got {type(address).__name__}")
    if not parts:
        raise ValueError("address: no address given")
    addresses = [_parse_address(a) for a in parts]
    if tls is not None:
        tls = os.fspath(tls)
        if not isinstance(tls, str) or not tls:
            raise ValueError(f"tls: expected a directory, got {tls!r}")
    return Client(_dsec.Client(addresses, _int("threads", threads, lo=1, hi=256), tls or ""))


class Client:
    """A connection to one dsecd. Close it (or use ``with``): the sessions it
    opened are closed with it, and their sandboxes destroyed. Open clients are
    closed at interpreter exit."""

    def __init__(self, native: _dsec.Client) -> None:
        self._c = native
        with _open_lock:
            _open_clients.add(self)

    @property
    def address(self) -> str:
        return self._c.address

    @property
    def closed(self) -> bool:
        return self._c.closed

    def close(self) -> None:
        """Closes the sessions this client opened and disconnects. Calls still
        in flight (in other threads or tasks) fail with dsec.Disconnected.
        Idempotent."""
        self._c.close()
        with _open_lock:
            _open_clients.discard(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<dsec.Client {self.address}{' closed' if self.closed else ''}>"

    @staticmethod
    def _options(quota: object, ttl: object, name: object,
                 trajectory: object) -> tuple[int, int, str, bool]:
        return (_int("quota", quota, lo=1, hi=1_000_000), _seconds_ms("ttl", ttl),
                _str("name", name), bool(trajectory))

    def session(self, session_id: str | None = None, *, quota: int = 1024,
                ttl: Seconds = 3600, name: str = "", trajectory: bool = True) -> Session:
        """Opens a session: at most `quota` live sandboxes, each living `ttl`
        seconds unless its create says otherwise; `name` shows in `dsec ps`.

        trajectory=True (the SDK's default) asks the daemon to keep the
        session's trajectory log, so that ``resume(session.id)`` can rebuild it
        after the trainer or the daemon died. Pass False to skip the log.

        With `session_id` (an id or the name of a live session), it opens
        nothing: it is attach(session_id), and the other arguments are not
        used.
        """
        if session_id is not None:
            return self.attach(session_id)
        return Session(self, self._c.open_session(*self._options(quota, ttl, name, trajectory)))

    def attach(self, session_id: str) -> Session:
        """A handle on a live session opened elsewhere (another process, or
        `dsec session open`), by its id or name: its sandboxes, commands,
        files and events, as its owner has them. It does not own the session:
        leaving a ``with`` block, dropping it or closing this client leaves the
        session and its sandboxes alone; only an explicit close() ends it.
        dsec.NotFound names a session that is not live (resume() reopens one
        from its log after its trainer or daemon died)."""
        native = self._c.find_session(_str("session_id", session_id, False))
        return Session(self, native, owned=False)

    async def session_async(self, *, quota: int = 1024, ttl: Seconds = 3600, name: str = "",
                            trajectory: bool = True) -> Session:
        fut, done = _future()
        self._c.open_session_async(*self._options(quota, ttl, name, trajectory), done)
        key, sid = await fut
        return Session(self, self._c.adopt_session(key, sid))

    def resume(self, session_id: str) -> Session:
        """Reopens a session from its trajectory log (after its trainer or its
        daemon died); owned by this client like a new one."""
        return Session(self, self._c.resume_session(_str("session_id", session_id, False)))

    async def resume_async(self, session_id: str) -> Session:
        fut, done = _future()
        self._c.resume_session_async(_str("session_id", session_id, False), done)
        key, sid = await fut
        return Session(self, self._c.adopt_session(key, sid))

    def sessions(self) -> List[SessionInfo]:
        """The daemon's sessions (`dsec session list`), ordered by id: the live
        ones (state "live": name, quota, owned, trajectory) and the trajectory
        logs no live session has (state "resumable": resume(id) reopens one)."""
        return list(self._c.sessions())

    def list(self) -> List[SandboxInfo]:
        """Every sandbox on the node (all sessions), as SandboxInfo; through a
        coordinator, those of every node that answered within 3 s."""
        return self._c.list()

    def list_all(self) -> SandboxList:
        """Like list(), as a SandboxList: `sandboxes`, and `missing`, the names
        of the cluster's nodes that did not answer within 3 s (hung, or cut
        off and not yet lost); their sandboxes are not in `sandboxes`."""
        return self._c.list_all()

    async def list_async(self) -> List[SandboxInfo]:
        fut, done = _future()
        self._c.list_async(done)
        infos: List[SandboxInfo] = await fut
        return infos

    def stats(self) -> NodeStats:
        """The node's counters, as NodeStats."""
        return self._c.stats()

    def pool(self, base: str, workdir: str | None = None, tools: Sequence[str] = (),
             size: int = 1, *, memory: Size | None = None, pids: int | None = None,
             cpus: float | None = None, disk: Size | None = None, net: bool = False,
             chronus: bool = False, network: Network | None = None,
             backend: str = "container") -> int:
        """A warm pool of the nodes' own (it lives with them, not with this
        client): `size` ready sandboxes of that environment spread over the
        nodes, for any session's creates and calls (0 removes it). Returns how
        many the nodes took (`dsec pool set`). network: as Session.create's; a
        create or call takes from the pool only with the same policy.
        backend: "container" (default) or "microvm" (booted microVMs, on the
        nodes that offer them; a create with backend="microvm" of the same
        environment takes one instead of booting)."""
        env = _environment(base, workdir, tools, memory, pids, cpus, disk, net, chronus, None,
                           backend=backend, network=network)
        n: int = self._c.pool(env, _int("size", size, hi=100_000))
        return n

    async def stats_async(self) -> NodeStats:
        fut, done = _future()
        self._c.stats_async(done)
        stats: NodeStats = await fut
        return stats

    def cordon(self, node: str) -> int:
        """Stops new sandboxes on ``node`` (its name as ``cluster status`` shows
        it; a daemon that is not a coordinator takes its own name): the
        coordinator places nothing there and the node refuses. Its own
        sandboxes go on. Returns how many it has."""
        n: int = self._c.cordon(node, True)
        return n

    def uncordon(self, node: str) -> int:
        """Takes a cordoned ``node`` back. Returns how many sandboxes it has."""
        n: int = self._c.cordon(node, False)
        return n

    def drain(self, node: str, timeout: Optional[Seconds] = None) -> int:
        """Cordons ``node`` and waits until its last sandbox is gone; returns
        how many it had. After ``timeout`` seconds (None: no limit) raises
        dsec.Timeout naming how many are left; the node stays cordoned."""
        ms = 0 if timeout is None else max(1, int(float(timeout) * 1000))
        n: int = self._c.drain(node, ms)
        return n


# ---- sessions ------------------------------------------------------------------------------

class Batch(list["Sandbox"]):
    """The sandboxes a create made, in the order they became ready.
    ``failures`` holds a dsec.Error per sandbox that could not be made (the
    create raises instead when none could). ``key`` is the create's key: the
    one given, or the one dsec picked ("#N"); each sandbox has its own
    (``Sandbox.key``: the create's key for a create of one, KEY#i else)."""

    def __init__(self, sandboxes: Sequence[Sandbox], failures: list[Error],
                 key: str | None = None) -> None:
        super().__init__(sandboxes)
        self.failures = failures
        self.key = key


def _batch(session: Session, made: list[tuple[str, str]], failures: list[BaseException],
           count: int) -> Batch:
    boxes = [Sandbox(session, i, k) for i, k in made]
    key = None
    if boxes and boxes[0].key is not None:
        k = boxes[0].key
        key = k if count == 1 else k.rsplit("#", 1)[0]
    errors = [e if isinstance(e, Error) else Error(str(e)) for e in failures]
    return Batch(boxes, errors, key)


def _one(batch: Batch) -> Sandbox:
    """The sandbox of a create of one, or the error that kept it from being made."""
    if batch:
        return batch[0]
    if batch.failures:  # dsec raises the failure itself for a create of one; just in case
        raise batch.failures[0]
    raise SandboxFailed("the create of one sandbox made none and said nothing about why")


class Session:
    """A training run's sandboxes, their quota and lifetime. A context manager
    (sync or async) that closes it: every sandbox destroyed."""

    def __init__(self, client: Client, native: _dsec.Session, owned: bool = True) -> None:
        self.client = client
        self._s = native
        self._owned = owned
        self._events: _dsec.EventStream | None = None
        self._events_lock = threading.Lock()

    @property
    def id(self) -> str:
        return self._s.id

    @property
    def owned(self) -> bool:
        """False for a handle from Client.attach(): leaving a ``with`` block
        does not close the session then."""
        return self._owned

    def __repr__(self) -> str:
        return f"<dsec.Session {self.id}{'' if self._owned else ' attached'}>"

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_quietly()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.client.closed or not self._owned:
            self._stop_events()
            return
        try:
            await self.close_async()
        except (Disconnected, Closed):
            pass

    def _close_quietly(self) -> None:
        if self.client.closed or not self._owned:
            self._stop_events()
            return
        try:
            self.close()
        except (Disconnected, Closed):  # closed already, or the daemon is gone
            pass

    def pool(self, base: str, workdir: str | None = None, tools: Sequence[str] = (),
             size: int = 1, *, memory: Size | None = None, pids: int | None = None,
             cpus: float | None = None, disk: Size | None = None, net: bool = False,
             chronus: bool = False, network: Network | None = None,
             backend: str = "container") -> int:
        """A warm pool of this session's: `size` ready sandboxes of that
        environment kept on the nodes for its creates and calls (0 removes it);
        it ends with the session. Returns how many the nodes took. They count
        against the session's quota (Overloaded when `size` does not fit beside
        what is live). network: as create's; a create or call takes from the
        pool only with the same environment and policy (mounts included).
        backend: "container" (default) or "microvm": booted microVMs that a
        create(backend="microvm") of the same environment takes."""
        env = _environment(base, workdir, tools, memory, pids, cpus, disk, net, chronus, None,
                           backend=backend, network=network)
        n: int = self._s.pool(env, _int("size", size, hi=100_000))
        return n

    def call(self, cmd: Command, *, base: str, workdir: str | None = None,
             tools: Sequence[str] = (), memory: Size | None = None, pids: int | None = None,
             cpus: float | None = None, disk: Size | None = None, net: bool = False,
             timeout: Seconds | None = None, env: Env | None = None, cwd: str | None = None,
             user: User | None = None, input: Data | None = None,
             max_output: int | None = None, network: Network | None = None) -> ExecResult:
        """The function backend: runs `cmd` in a fresh sandbox of that
        environment (from a warm pool when one is ready), destroys the sandbox
        (never reused) and returns the ExecResult (exit_code 128+N on a
        signal N). network: as create()'s."""
        e = _environment(base, workdir, tools, memory, pids, cpus, disk, net, False, None,
                         network=network)
        req = _request(cmd, timeout, env, cwd, user, input, False, False, max_output)
        result: ExecResult = self._s.call(e, req)
        return result

    def pause(self) -> int:
        """Pauses every sandbox of the session (snapshots, issue 16); returns
        how many were running."""
        return int(self._s.pause_all(True))

    def resume(self) -> int:
        """Resumes every paused sandbox of the session; returns how many."""
        return int(self._s.pause_all(False))

    def sandbox(self, sandbox_id: str) -> Sandbox:
        """A handle on a sandbox of this session, by id (nothing is checked)."""
        return Sandbox(self, _str("sandbox_id", sandbox_id, False))

    def create(self, base: str | None = None, workdir: str | None = None,
               tools: Sequence[str] = (),
               count: int = 1, *, memory: Size | None = None, pids: int | None = None,
               cpus: float | None = None, disk: Size | None = None, net: bool = False,
               chronus: bool = False, ttl: Seconds | None = None, key: str | None = None,
               tags: Mapping[str, str] | None = None, snapshot: str | None = None,
               backend: str = "container", expose: Sequence[int] = (),
               mounts: Sequence[str] = (), network: Network | None = None) -> Batch:
        """Creates `count` sandboxes of base + workdir + tools (NAME@VERSION
        each; the last tool on top) and returns them as a Batch (a list).

        memory, disk: bytes (int) or a size such as "512m"; pids: most
        processes (memory, pids and disk default to the node's defaults,
        NodeStats.default_*); cpus: CPU bandwidth (1.5 = one and a half CPUs);
        net: a private network with loopback; chronus: a Chronus socket
        (events(), trusted commands); ttl: seconds (default: the session's).

        network: "none" (no network, the default), "loopback" (net=True), or
        dsec.Egress(allow=[...], deny=[...]): out through the node's uplink by
        that policy ("egress" is Egress() with no rule: all denied); see
        Egress. Sandbox.set_network() changes the policy of a live one.

        key: the trainer's name for this create, e.g. its episode id (a str
        without '#'; at most one live create per key). A resumed session gives
        a create the sandboxes its log made for the same key, whatever order
        the creates come in; a create without a key gets fresh sandboxes on
        resume, never another's. tags: {str: str} shown by list() and find().

        snapshot: a diff layer (Sandbox.snapshot()) to start from instead of
        base and workdir: the environment it records with the diff on top;
        `tools` go above it.

        backend: "container" (default) or "microvm": a QEMU microVM booting
        the same layers (docs/microvm.md), on a node that offers it.

        expose: TCP ports inside each sandbox that its node forwards from a
        fresh port of its own (dsecd --expose-address) from creation on; needs
        net=True. Sandbox.ports() says where; Sandbox.expose() adds one later.

        mounts: host paths of the node bind-mounted into each sandbox, as
        "HOST:SANDBOX[:ro|:rw][,rbind][,noidmap]" (read-only unless :rw); the node must allow
        them (dsecd --allow-host-mount DIR[:rw]), else the create fails with
        dsec.InvalidArgument naming the mount (docs/security.md, "Host mounts").
        """
        env = _environment(base, workdir, tools, memory, pids, cpus, disk, net, chronus, ttl,
                           snapshot, backend, expose, mounts, network)
        count = _int("count", count, hi=1_000_000)
        made, failures = self._s.create(env, count, *_labels(key, tags))
        return _batch(self, made, failures, count)

    async def create_async(self, base: str, workdir: str | None = None,
                           tools: Sequence[str] = (), count: int = 1, *,
                           memory: Size | None = None, pids: int | None = None,
                           cpus: float | None = None, disk: Size | None = None,
                           net: bool = False, chronus: bool = False, ttl: Seconds | None = None,
                           key: str | None = None,
                           tags: Mapping[str, str] | None = None,
                           expose: Sequence[int] = (),
                           mounts: Sequence[str] = (),
                           network: Network | None = None) -> Batch:
        env = _environment(base, workdir, tools, memory, pids, cpus, disk, net, chronus, ttl,
                           expose=expose, mounts=mounts, network=network)
        count = _int("count", count, hi=1_000_000)
        fut, done = _future()
        self._s.create_async(env, count, *_labels(key, tags), done)
        made: list[tuple[str, str]]
        failures: list[BaseException]
        made, failures = await fut
        return _batch(self, made, failures, count)

    def create_one(self, base: str, workdir: str | None = None, tools: Sequence[str] = (), *,
                   memory: Size | None = None, pids: int | None = None,
                   cpus: float | None = None, disk: Size | None = None, net: bool = False,
                   chronus: bool = False, ttl: Seconds | None = None, key: str | None = None,
                   tags: Mapping[str, str] | None = None, expose: Sequence[int] = (),
                   mounts: Sequence[str] = (), network: Network | None = None) -> Sandbox:
        """Creates one sandbox (create()'s arguments, without count) and returns
        it: a Sandbox, not a Batch. If it could not be made, raises why (a
        dsec.Error) rather than returning an empty Batch with a failure.
        ``Sandbox.key`` is `key`, or the one dsec picked ("#N")."""
        return _one(self.create(base, workdir, tools, 1, memory=memory, pids=pids, cpus=cpus,
                                disk=disk, net=net, chronus=chronus, ttl=ttl, key=key,
                                tags=tags, expose=expose, mounts=mounts, network=network))

    async def create_one_async(self, base: str, workdir: str | None = None,
                               tools: Sequence[str] = (), *, memory: Size | None = None,
                               pids: int | None = None, cpus: float | None = None,
                               disk: Size | None = None, net: bool = False,
                               chronus: bool = False, ttl: Seconds | None = None,
                               key: str | None = None,
                               tags: Mapping[str, str] | None = None,
                               expose: Sequence[int] = (),
                               mounts: Sequence[str] = (),
                               network: Network | None = None) -> Sandbox:
        return _one(await self.create_async(base, workdir, tools, 1, memory=memory, pids=pids,
                                            cpus=cpus, disk=disk, net=net, chronus=chronus,
                                            ttl=ttl, key=key, tags=tags, expose=expose,
                                            mounts=mounts, network=network))

    def find(self, key: str) -> Sandbox | None:
        """The Sandbox with this key (a create's key=, or KEY#i of a batch), or
        None if no create gave it. Its info (state, tags) is in
        ``sandbox.info``. Raises dsec.Closed, saying why, if it is gone."""
        try:
            info = self._s.find(_str("key", key, allow_empty=False))
        except Closed:
            raise
        except NotFound:
            return None
        return Sandbox(self, info.id, info.key, info)

    async def find_async(self, key: str) -> Sandbox | None:
        fut, done = _future()
        self._s.find_async(_str("key", key, allow_empty=False), done)
        try:
            info: SandboxInfo = await fut
        except Closed:
            raise
        except NotFound:
            return None
        return Sandbox(self, info.id, info.key, info)

    def list(self) -> List[SandboxInfo]:
        """This session's sandboxes, as SandboxInfo."""
        return self._s.list()

    async def list_async(self) -> List[SandboxInfo]:
        fut, done = _future()
        self._s.list_async(done)
        infos: List[SandboxInfo] = await fut
        return infos

    def close(self) -> int:
        """Destroys every sandbox of the session and ends it; returns how many."""
        self._stop_events()
        return self._s.close()

    async def close_async(self) -> int:
        self._stop_events()
        fut, done = _future()
        self._s.close_async(done)
        n: int = await fut
        return n

    # ---- Chronus ----------------------------------------------------------------------

    def _stop_events(self) -> None:
        with self._events_lock:
            ev, self._events = self._events, None
        if ev is not None:
            ev.close()

    def events(self, timeout: Seconds | None = None) -> Iterator[Event]:
        """Chronus events of this session's sandboxes (created with
        chronus=True), as Event, in the order they came.

        The iteration ends when no event came for `timeout` seconds (None: it
        waits as long as the session lives); it raises dsec.Disconnected once
        the session is gone. Events sent while nobody iterated are kept by the
        session (a bounded backlog) and come first. All calls of events() share
        one subscription, so an event is yielded once.
        """
        wait = None
        if timeout is not None:
            wait = _seconds_ms("timeout", timeout, allow_zero=True) / 1000.0
        while True:
            with self._events_lock:
                if self._events is None:
                    self._events = self._s.watch()
                stream = self._events
            raw = stream.next(wait)
            if raw is None:
                return
            yield Event(self, raw)

    async def events_async(self, timeout: Seconds | None = None) -> AsyncIterator[Event]:
        """An async iterator of events: ``async for ev in s.events_async(): ...``.

        Each call subscribes anew, apart from events(): every subscriber gets
        every event, so use one of the two. Ends after `timeout` seconds without
        an event (None: never); raises dsec.Disconnected once the session is gone.
        """
        wait = None
        if timeout is not None:
            wait = _seconds_ms("timeout", timeout, allow_zero=True) / 1000.0
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def put(item: tuple[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is closed
                pass

        watch = self._s.watch_async(lambda raw: put(("event", raw)),
                                    lambda exc: put(("end", exc)))
        try:
            while True:
                try:
                    kind, item = await asyncio.wait_for(queue.get(), wait)
                except asyncio.TimeoutError:
                    return
                if kind == "end":
                    raise item
                yield Event(self, item)
        finally:
            watch.stop()

    def answer(self, sandbox_id: str, request_id: int, reward: float = 0.0, text: str = "",
               data: Data = b"", done: bool = False) -> None:
        """Answers feedback request `request_id` (the event's seq) of a sandbox."""
        self._s.answer(*_feedback(sandbox_id, request_id, reward, text, data, done))

    async def answer_async(self, sandbox_id: str, request_id: int, reward: float = 0.0,
                           text: str = "", data: Data = b"", done: bool = False) -> None:
        fut, on_done = _future()
        self._s.answer_async(*_feedback(sandbox_id, request_id, reward, text, data, done),
                             on_done)
        await fut


def _put_tar(path: object, data: object, mode: object, mtime: object) -> bytes:
    path = _files.check_path(path)
    if mtime is not None:
        if isinstance(mtime, bool) or not isinstance(mtime, numbers.Real):
            raise TypeError(f"mtime: expected seconds since the epoch, got "
                            f"{type(mtime).__name__}")
        if not math.isfinite(mtime) or not 0 <= float(mtime) < 8**11:
            raise ValueError(f"mtime: expected seconds since the epoch, got {mtime}")
    return _files.file_tar(path, _bytes("data", data), _int("mode", mode, hi=0o7777),
                           None if mtime is None else float(mtime))


def _feedback(sandbox_id: object, request_id: object, reward: object, text: object,
              data: object, done: object) -> tuple[str, int, float, str, bytes, bool]:
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        raise TypeError(f"reward: expected a number, got {type(reward).__name__}")
    if not math.isfinite(reward):
        raise ValueError(f"reward: must be finite, got {reward}")
    return (_str("sandbox_id", sandbox_id, False), _int("request_id", request_id, lo=1),
            float(reward), _str("text", text), _bytes("data", data), bool(done))


class Answer(NamedTuple):
    """A logged answer to a feedback request: (reward, text, data, done)."""

    reward: float
    text: str
    data: bytes
    done: bool


class Event:
    """A Chronus event (runtime/chronus.hpp's chronus_event).

    sandbox: the sandbox's id (also sandbox_id); seq: its number, per sandbox,
    from 1; kind: "stage", "report", "log", "feedback", "lost" (the node
    running the sandbox was lost: the sandbox is gone; seq 0, text says why;
    docs/cluster.md), or "denied" (an egress sandbox tried to reach a
    destination its policy denies, or to resolve a name the node's resolver
    refused it; seq 0, text is "PROTO ADDR:PORT", e.g. "tcp 198.18.0.3:80",
    or "dns NAME", once per destination a minute; docs/network.md);
    stage / log: the text of a stage or log event (else None); text: that
    text (or the lost reason, or the denied destination); metrics:
    {key: float} of a report; payload: bytes of a feedback request;
    request_id: seq for a feedback request (else None); monotonic_ns: when the
    node read it. answer() replies to a feedback request.

    replayed: True for an event a resumed session sends again from its
    trajectory log, when the step that came after it is answered from the
    log (so a trainer that assigns rewards in its event handler gets them
    again); monotonic_ns is then the first time's. logged_answer: for a
    replayed feedback request, the Answer the trainer gave the first time
    (None if it gave none). Answering a replayed request is accepted and
    changes nothing: the command that asked has run.
    """

    __slots__ = ("session", "sandbox", "seq", "kind", "text", "metrics", "payload",
                 "monotonic_ns", "replayed", "logged_answer")

    session: Session
    sandbox: str
    seq: int
    kind: str
    text: str
    metrics: dict[str, float]
    payload: bytes
    monotonic_ns: int
    replayed: bool
    logged_answer: Answer | None

    def __init__(self, session: Session, raw: _dsec.RawEvent) -> None:
        self.session = session
        self.sandbox = raw.sandbox_id
        self.seq = raw.seq
        self.kind = raw.kind
        self.text = raw.text
        self.metrics = raw.metrics
        self.payload = raw.payload
        self.monotonic_ns = raw.monotonic_ns
        self.replayed = raw.replayed
        a = raw.answer
        self.logged_answer = Answer(*a) if a is not None else None

    @property
    def sandbox_id(self) -> str:
        return self.sandbox

    @property
    def stage(self) -> str | None:
        return self.text if self.kind == "stage" else None

    @property
    def log(self) -> str | None:
        return self.text if self.kind == "log" else None

    @property
    def request_id(self) -> int | None:
        return self.seq if self.kind == "feedback" else None

    def _request(self) -> int:
        if self.kind != "feedback":
            raise ValueError(f"answer: event {self.seq} of {self.sandbox} is a {self.kind} "
                             "event, not a feedback request")
        return self.seq

    def answer(self, reward: float = 0.0, text: str = "", data: Data = b"",
               done: bool = False) -> None:
        """Answers this feedback request: the waiting `chronus feedback` gets it."""
        self.session.answer(self.sandbox, self._request(), reward, text, data, done)

    async def answer_async(self, reward: float = 0.0, text: str = "", data: Data = b"",
                           done: bool = False) -> None:
        await self.session.answer_async(self.sandbox, self._request(), reward, text, data, done)

    def __repr__(self) -> str:
        what: object = {"report": self.metrics, "feedback": self.payload}.get(self.kind, self.text)
        again = " replayed" if self.replayed else ""
        return f"<dsec.Event {self.sandbox}#{self.seq}{again} {self.kind} {what!r}>"


# ---- sandboxes -----------------------------------------------------------------------------

class ExecStream:
    """A command whose output comes as it is written: iterate for
    (stream, chunk) pairs, stream being "stdout" or "stderr" and chunk bytes.
    Once the iteration ended, ``result`` is the ExecResult (its stdout and
    stderr are empty: the output was streamed). A failed call raises from the
    iteration."""

    def __init__(self, native: _dsec.ExecStream) -> None:
        self._n = native

    def __iter__(self) -> ExecStream:
        return self

    def __next__(self) -> tuple[str, bytes]:
        return next(self._n)

    @property
    def result(self) -> ExecResult | None:
        return self._n.result


class AsyncExecStream:
    """The asyncio ExecStream: ``async for stream, chunk in sb.exec_stream_async(...)``,
    then ``result``."""

    def __init__(self, start: Callable[[Callable[[str, bytes], None], _Done], None]) -> None:
        self._start = start
        self._queue: asyncio.Queue[tuple[str, Any]] | None = None
        self.result: ExecResult | None = None

    def __aiter__(self) -> AsyncExecStream:
        if self._queue is None:
            loop = asyncio.get_running_loop()
            q: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
            self._queue = q

            def on_output(stream: str, chunk: bytes) -> None:
                try:
                    loop.call_soon_threadsafe(q.put_nowait, ("out", (stream, chunk)))
                except RuntimeError:
                    pass

            def done(value: object, exc: BaseException | None) -> None:
                try:
                    loop.call_soon_threadsafe(q.put_nowait, ("end", (value, exc)))
                except RuntimeError:
                    pass

            self._start(on_output, done)
        return self

    async def __anext__(self) -> tuple[str, bytes]:
        if self._queue is None:
            self.__aiter__()
        assert self._queue is not None
        kind, item = await self._queue.get()
        if kind == "out":
            chunk: tuple[str, bytes] = item
            return chunk
        self._queue.put_nowait((kind, item))  # the end stays the end
        value, exc = item
        if exc is not None:
            raise exc
        self.result = value
        raise StopAsyncIteration


_STDIN_PIECE = 128 << 10  # what one stdin message carries (the daemon takes each when it has room)


class Process:
    """A command running in the background: ``sb.exec(..., background=True)``
    (or ``await sb.exec_async(..., background=True)``) returns one at once.

    ``wait()`` / ``await wait_async()`` give its ExecResult (``check=True`` of
    the exec applies then); ``kill(sig)`` signals its process group (SIGKILL by
    default); ``send_stdin(data)`` feeds its stdin, returning once the daemon
    took the bytes (it holds at most 256 KiB of a command's stdin: a command
    that does not read makes the sender wait); ``close_stdin()`` ends it. Its
    output is collected into the result, or, with ``on_output=f`` given to
    exec, passed to ``f(stream, chunk)`` as it comes (on one of dsec's
    threads), or, with ``stream=True``, read by iterating the Process
    (``for stream, chunk in p`` from exec, ``async for`` from exec_async).
    ``pid`` is its id in the sandbox (not a pid of the host). Dropping the
    Process does not stop the command; ``cancel()`` does (SIGKILL), and so
    does the end of its client.
    """

    def __init__(self, sandbox: Sandbox, req: _dsec.ExecRequest, check: bool,
                 loop: asyncio.AbstractEventLoop | None, on_output: OutputFn | None,
                 stream: bool) -> None:
        self.sandbox = sandbox
        self._req = req
        self._check = check
        self._loop = loop
        self._sync_q: queue.SimpleQueue[tuple[str, Any]] | None = None
        self._async_q: asyncio.Queue[tuple[str, Any]] | None = None
        self._end_fut: asyncio.Future[Any] | None = None
        self._streamed_end = False
        self.result: ExecResult | None = None
        out: Callable[[str, bytes], object] | None = on_output
        if stream:
            if loop is not None:
                aq: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
                self._async_q = aq
                out_loop = loop

                def to_loop(stream_name: str, chunk: bytes) -> None:
                    try:
                        out_loop.call_soon_threadsafe(aq.put_nowait,
                                                      ("out", (stream_name, chunk)))
                    except RuntimeError:
                        pass
                out = to_loop
            else:
                sq: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
                self._sync_q = sq

                def to_queue(stream_name: str, chunk: bytes) -> None:
                    sq.put(("out", (stream_name, chunk)))
                out = to_queue
        done: _Done | None = None
        if loop is not None:
            fut: asyncio.Future[Any] = loop.create_future()
            self._end_fut = fut
            aq2 = self._async_q
            end_loop = loop

            def settle(value: object, exc: BaseException | None) -> None:
                _settle(fut, value, exc)
                if aq2 is not None:
                    aq2.put_nowait(("end", (value, exc)))

            def end_on_loop(value: object, exc: BaseException | None) -> None:
                try:
                    end_loop.call_soon_threadsafe(settle, value, exc)
                except RuntimeError:
                    pass
            done = end_on_loop
        elif self._sync_q is not None:
            sq2 = self._sync_q

            def end_to_queue(value: object, exc: BaseException | None) -> None:
                sq2.put(("end", (value, exc)))
            done = end_to_queue
        self._n = sandbox.session._s.start(sandbox.id, req, out, done)

    def __repr__(self) -> str:
        return f"<dsec.Process in {self.sandbox.id}: {list(self._req.argv)!r}>"

    @property
    def pid(self) -> int:
        """Its id in its sandbox, once it runs (waits for that); raises why it
        could not be started. 0 for a command that a resumed session answered
        from its log (it did not run)."""
        return self._n.id()

    def _checked(self, result: ExecResult) -> ExecResult:
        self.result = result
        return self.sandbox._checked(self._req, result, self._check)

    def wait(self) -> ExecResult:
        """Waits for its end; returns its ExecResult (raises as exec would)."""
        return self._checked(self._n.wait())

    async def wait_async(self) -> ExecResult:
        if self._end_fut is None:
            raise RuntimeError("wait_async: this Process was started by exec(), not "
                               "exec_async(): use wait()")
        try:
            result: ExecResult = await asyncio.shield(self._end_fut)
        except asyncio.CancelledError:
            raise
        return self._checked(result)

    @property
    def done(self) -> bool:
        """True once it ended (wait() then returns at once)."""
        return self._n.done()

    def kill(self, sig: int = _signal.SIGKILL) -> None:
        """Sends signal `sig` (SIGKILL by default) to its process group."""
        self._n.signal(_int("sig", sig, lo=1, hi=64))

    async def kill_async(self, sig: int = _signal.SIGKILL) -> None:
        fut, done = _future()
        self._n.signal_async(_int("sig", sig, lo=1, hi=64), done)
        await fut

    def resize(self, rows: int, cols: int) -> None:
        """Sets the window size of its terminal (exec(..., pty=...)); its
        foreground process group gets SIGWINCH. dsec.InvalidArgument without
        a terminal."""
        self._n.resize(_int("rows", rows, lo=1, hi=65535), _int("cols", cols, lo=1, hi=65535))

    async def resize_async(self, rows: int, cols: int) -> None:
        fut, done = _future()
        self._n.resize_async(_int("rows", rows, lo=1, hi=65535),
                             _int("cols", cols, lo=1, hi=65535), done)
        await fut

    def send_stdin(self, data: Data) -> None:
        """Writes `data` (bytes or str) to its stdin; returns once the daemon
        took it. dsec.Closed once its stdin is closed or it ended."""
        self._n.write(_bytes("data", data))

    async def send_stdin_async(self, data: Data) -> None:
        b = _bytes("data", data)
        for off in range(0, len(b), _STDIN_PIECE):  # in order: one piece at a time
            fut, done = _future()
            self._n.write_async(b[off:off + _STDIN_PIECE], done)
            await fut

    def close_stdin(self) -> None:
        """Ends its stdin (after what was sent)."""
        self._n.close_stdin()

    async def close_stdin_async(self) -> None:
        fut, done = _future()
        self._n.close_stdin_async(done)
        await fut

    def cancel(self) -> None:
        """Stops it: the daemon SIGKILLs the command; wait() raises dsec.Closed."""
        self._n.cancel()

    # ---- its output, with stream=True ----

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        if self._sync_q is None:
            raise TypeError("iterate a Process of exec(..., background=True, stream=True)")
        while not self._streamed_end:
            kind, item = self._sync_q.get()
            if kind == "out":
                yield item
                continue
            self._streamed_end = True
        return

    def __aiter__(self) -> AsyncIterator[tuple[str, bytes]]:
        if self._async_q is None:
            raise TypeError("async for over a Process of exec_async(..., background=True, "
                            "stream=True)")
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[tuple[str, bytes]]:
        assert self._async_q is not None
        while not self._streamed_end:
            kind, item = await self._async_q.get()
            if kind == "out":
                yield item
                continue
            self._streamed_end = True


class Sandbox:
    """One sandbox of a session. ``close()`` (or ``with``, ``async with``) destroys it.
    ``key`` is its key (None for a handle made by ``session.sandbox(id)``);
    ``info`` the SandboxInfo that ``find()`` got, else None."""

    def __init__(self, session: Session, sandbox_id: str, key: str | None = None,
                 info: SandboxInfo | None = None) -> None:
        self.session = session
        self.id = sandbox_id
        self.key = key or None
        self.info = info

    def __repr__(self) -> str:
        return f"<dsec.Sandbox {self.id}{' key=' + self.key if self.key else ''}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sandbox) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        except (NotFound, Disconnected):
            pass

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.close_async()
        except (NotFound, Disconnected):
            pass

    # ---- commands ------------------------------------------------------------------------

    @overload
    def exec(self, cmd: Command, *, timeout: Seconds | None = None, env: Env | None = None,
             cwd: str | None = None, user: User | None = None, input: Data | None = None,
             trusted: bool = False, idempotent: bool = False, max_output: int | None = None,
             pristine: bool = False, check: bool = False, pty: Pty = False, background: Literal[False] = False,
             stdin: None = None, stream: Literal[False] = False,
             on_output: None = None) -> ExecResult: ...

    @overload
    def exec(self, cmd: Command, *, timeout: Seconds | None = None, env: Env | None = None,
             cwd: str | None = None, user: User | None = None, input: Data | None = None,
             trusted: bool = False, idempotent: bool = False, max_output: int | None = None,
             pristine: bool = False, check: bool = False, pty: Pty = False, background: Literal[True],
             stdin: bool | None = None, stream: bool = False,
             on_output: OutputFn | None = None) -> Process: ...

    def exec(self, cmd: Command, *, timeout: Seconds | None = None, env: Env | None = None,
             cwd: str | None = None, user: User | None = None, input: Data | None = None,
             trusted: bool = False, idempotent: bool = False, max_output: int | None = None,
             pristine: bool = False, check: bool = False, pty: Pty = False, background: bool = False,
             stdin: bool | None = None, stream: bool = False,
             on_output: OutputFn | None = None) -> ExecResult | Process:
        """Runs a command and collects its output; returns an ExecResult.

        cmd: a str runs under /bin/sh -c; a list is the argv. timeout: seconds,
        then the command's process group is killed (result.timed_out). env:
        {NAME: VALUE} added to the defaults (dsec's, under an OCI base image's
        Env); cwd: the directory (default: the image's WorkingDir, else /);
        user: a uid, (uid, gid), or a name, "name:group" (looked up in the
        base image's /etc/passwd and /etc/group, never in what the agent wrote:
        uid, gid, supplementary groups, HOME and USER; an unknown name raises
        InvalidArgument) (default: the image's User, else the sandbox's
        root); input: bytes
        (or str) for stdin; trusted: a grader in a Chronus sandbox (it talks
        to Chronus over its own channel, and dsec's `chronus` comes first in its
        PATH); pristine (with trusted): its root is the sandbox's layers without
        anything the agent wrote, the agent's files read-only at /.dsec/agent
        (docs/chronus.md); idempotent: safe to run again on resume; max_output:
        bytes kept per stream (default 16 MiB; beyond, result.truncated).

        result.exit_code is the command's exit status, or 128+N when a signal
        N killed it (a timeout kills with SIGKILL: 137, timed_out True), as
        shells and the command line say; result.ok is exit code 0.
        check=True raises dsec.CommandFailed (with the result) unless it is.

        background=True returns a Process at once instead (see Process): its
        stdin stays open for send_stdin() until close_stdin() unless
        stdin=False (then it is `input` and its end); on_output=f(stream,
        chunk) streams its output to f, stream=True to the Process's
        iteration, else it is collected into its result.

        pty=True (24 rows, 80 columns) or pty=(rows, cols) runs it on a
        terminal of the sandbox: it is a session leader with the terminal as
        its controlling terminal, stdin, stdout and stderr (TERM is
        xterm-256color unless env sets it); its output is one stream
        (result.stdout, stream "stdout"), with the terminal's echo and \\r\\n.
        Its input is `input` and then its end (^D); in the background,
        send_stdin() types into it (b"\\x03" is ^C: SIGINT to its foreground
        process group), close_stdin() types ^D, and Process.resize(rows, cols)
        changes its window (SIGWINCH). Not with trusted; microVM sandboxes
        and function calls have no terminals (dsec.Unsupported).
        """
        req = _request(cmd, timeout, env, cwd, user, input, trusted, idempotent, max_output,
                       pristine)
        _set_pty(req, pty)
        if background:
            return self._start(req, check, None, stdin, stream, on_output)
        if stdin or stream or on_output is not None:
            raise ValueError("stdin, stream and on_output are for background=True (or use "
                             "exec_stream)")
        return self._checked(req, self.session._s.exec(self.id, req), check)

    def _start(self, req: _dsec.ExecRequest, check: bool,
               loop: asyncio.AbstractEventLoop | None, stdin: bool | None, stream: bool,
               on_output: OutputFn | None) -> Process:
        if stream and on_output is not None:
            raise ValueError("stream=True and on_output: choose one way to take the output")
        req.handle = True
        req.open_stdin = True if stdin is None else bool(stdin)
        return Process(self, req, check, loop, on_output, stream)

    @overload
    async def exec_async(self, cmd: Command, *, timeout: Seconds | None = None,
                         env: Env | None = None, cwd: str | None = None,
                         user: User | None = None, input: Data | None = None,
                         trusted: bool = False, idempotent: bool = False,
                         max_output: int | None = None, pristine: bool = False,
                         check: bool = False, pty: Pty = False, background: Literal[False] = False,
                         stdin: None = None, stream: Literal[False] = False,
                         on_output: None = None) -> ExecResult: ...

    @overload
    async def exec_async(self, cmd: Command, *, timeout: Seconds | None = None,
                         env: Env | None = None, cwd: str | None = None,
                         user: User | None = None, input: Data | None = None,
                         trusted: bool = False, idempotent: bool = False,
                         max_output: int | None = None, pristine: bool = False,
                         check: bool = False, pty: Pty = False, background: Literal[True],
                         stdin: bool | None = None, stream: bool = False,
                         on_output: OutputFn | None = None) -> Process: ...

    async def exec_async(self, cmd: Command, *, timeout: Seconds | None = None,
                         env: Env | None = None, cwd: str | None = None,
                         user: User | None = None, input: Data | None = None,
                         trusted: bool = False, idempotent: bool = False,
                         max_output: int | None = None, pristine: bool = False,
                         check: bool = False, pty: Pty = False, background: bool = False,
                         stdin: bool | None = None, stream: bool = False,
                         on_output: OutputFn | None = None) -> ExecResult | Process:
        """The asyncio exec. Cancelling the awaiting task stops the command in
        the sandbox (SIGKILL). background=True returns a Process at once, as
        exec's does, with wait_async() and ``async for`` over its output
        (stream=True)."""
        req = _request(cmd, timeout, env, cwd, user, input, trusted, idempotent, max_output,
                       pristine)
        _set_pty(req, pty)
        if background:
            return self._start(req, check, asyncio.get_running_loop(), stdin, stream,
                               on_output)
        if stdin or stream or on_output is not None:
            raise ValueError("stdin, stream and on_output are for background=True (or use "
                             "exec_stream_async)")
        # A handle: the command dies with its call, so a cancelled await stops it.
        req.handle = True
        fut, done = _future()
        p = self.session._s.start(self.id, req, None, done)
        try:
            result: ExecResult = await fut
        except asyncio.CancelledError:
            p.cancel()
            raise
        return self._checked(req, result, check)

    def _checked(self, req: _dsec.ExecRequest, result: ExecResult, check: bool) -> ExecResult:
        if check and not result.ok:
            raise CommandFailed(self.id, list(req.argv), result)
        return result

    def exec_stream(self, cmd: Command, *, timeout: Seconds | None = None,
                    env: Env | None = None, cwd: str | None = None, user: User | None = None,
                    input: Data | None = None, trusted: bool = False,
                    idempotent: bool = False, pristine: bool = False) -> ExecStream:
        """Runs a command, its output streamed: an ExecStream of (stream, chunk)."""
        req = _request(cmd, timeout, env, cwd, user, input, trusted, idempotent, None,
                       pristine)
        return ExecStream(self.session._s.exec_stream(self.id, req))

    def exec_stream_async(self, cmd: Command, *, timeout: Seconds | None = None,
                          env: Env | None = None, cwd: str | None = None,
                          user: User | None = None, input: Data | None = None,
                          trusted: bool = False, idempotent: bool = False,
                          pristine: bool = False) -> AsyncExecStream:
        """The asyncio exec_stream: an AsyncExecStream (the command starts when
        the iteration does)."""
        req = _request(cmd, timeout, env, cwd, user, input, trusted, idempotent, None,
                       pristine)
        s = self.session._s

        def start(on_output: Callable[[str, bytes], None], done: _Done) -> None:
            s.exec_stream_async(self.id, req, on_output, done)
        return AsyncExecStream(start)

    # ---- files ---------------------------------------------------------------------------

    @property
    def files(self) -> Files:
        """The sandbox's files by path: write, read, list, stat, exists,
        remove, make_dir, rename; none of them needs tar, a shell or coreutils
        in the image (dsec's static busybox at /.dsec/libexec does the work)."""
        return Files(self)

    def put(self, path: str, data: PutData, *, mode: int = 0o644,
            mtime: float | None = None) -> None:
        """Writes bytes (or a str, as UTF-8) to the file `path` of the sandbox,
        owned by its root, with `mode`; missing parent directories are made.

        data may also be a local file, as a path (os.PathLike, e.g.
        pathlib.Path: a plain str is the text to write) or a binary file
        object (read from where it is to its end): that streams, in pieces,
        each sent once the daemon took the one before, so neither this
        process nor the daemon holds the file (docs/actors.md, "Transfers").
        A file object that cannot say its size (a pipe) is first spooled to
        a temporary file.

        mtime: the file's modification time, in seconds since the epoch; by
        default the time of the call. A resumed session recognises the same
        put of bytes in its log whatever its time (the daemon compares the
        files, not their times), and a sandbox rebuilt from its log has the
        first time; a streamed put is recognised by its path alone.
        """
        if isinstance(data, (bytes, bytearray, memoryview, str)):
            tar = _put_tar(path, data, mode, mtime)
            self.session._s.put(self.id, "/", tar)
            return
        self._put_stream(path, data, mode, mtime)

    def _put_stream(self, path: str, data: object, mode: int, mtime: float | None) -> int:
        path = _files.check_path(path)
        _put_tar("/x", b"", mode, mtime)  # the same checks of mode and mtime
        if isinstance(data, os.PathLike):
            with open(data, "rb") as f:
                return self._put_file(path, f, mode, mtime)
        if not hasattr(data, "read"):
            raise TypeError(f"data: expected bytes, str, a path or a binary file object, got "
                            f"{type(data).__name__}")
        return self._put_file(path, data, mode, mtime)

    def _put_file(self, path: str, f: Any, mode: int, mtime: float | None) -> int:
        size = _files._size_of(f)
        if size is None:  # a pipe, a socket: spooled to disk, never held in memory
            with tempfile.TemporaryFile() as spool:
                shutil.copyfileobj(f, spool, 1 << 20)
                size = spool.tell()
                spool.seek(0)
                stream = _files.FileTarStream(path, spool, size, mode, mtime)
                return self.session._s.put_from(self.id, "/", stream.read)
        stream = _files.FileTarStream(path, f, size, mode, mtime)
        return self.session._s.put_from(self.id, "/", stream.read)

    async def put_async(self, path: str, data: Data, *, mode: int = 0o644,
                        mtime: float | None = None) -> None:
        tar = _put_tar(path, data, mode, mtime)
        fut, done = _future()
        self.session._s.put_async(self.id, "/", tar, done)
        await fut

    def put_tree(self, local_dir: str | os.PathLike[str], dest: str) -> int:
        """Copies the contents of the local directory `local_dir` into the
        sandbox's directory `dest` (made if missing); returns the tar's size.
        The archive streams, made as it is sent (as a put of a file does):
        neither this process nor the daemon holds the tree."""
        dest = _files.check_path(dest, "dest")
        stream = _files.TreeTarStream(local_dir, dest)
        try:
            return self.session._s.put_from(self.id, "/", stream.read)
        finally:
            stream.close()

    def put_tar(self, dest: str, tar: PutData) -> int:
        """Unpacks a tar archive into the sandbox's directory `dest`: bytes,
        or a local path (os.PathLike) or binary file object, which stream
        (read in pieces as they are sent); returns its size."""
        dest = _files.check_path(dest, "dest")
        if isinstance(tar, (bytes, bytearray, memoryview, str)):
            return self.session._s.put(self.id, dest, _bytes("tar", tar))
        if isinstance(tar, os.PathLike):
            with open(tar, "rb") as f:
                return self.session._s.put_from(self.id, dest, f.read)
        if not hasattr(tar, "read"):
            raise TypeError(f"tar: expected bytes, a path or a binary file object, got "
                            f"{type(tar).__name__}")
        return self.session._s.put_from(self.id, dest, tar.read)

    @overload
    def get_tar(self, path: str) -> bytes: ...

    @overload
    def get_tar(self, path: str, into: GetInto) -> int: ...

    def get_tar(self, path: str, into: GetInto | None = None) -> bytes | int:
        """The sandbox's file or directory `path` as a tar archive (bytes);
        with `into` (a binary file object, or a local path made or replaced)
        the archive streams there as it comes, and its size is returned."""
        path = _files.check_path(path)
        if into is None:
            return self.session._s.get(self.id, path)
        if isinstance(into, (str, os.PathLike)):
            with open(into, "wb") as f:
                return self.session._s.get_into(self.id, path, f.write)
        return self.session._s.get_into(self.id, path, into.write)

    @overload
    def get(self, path: str) -> bytes: ...

    @overload
    def get(self, path: str, into: GetInto) -> int: ...

    def get(self, path: str, into: GetInto | None = None) -> bytes | int:
        """The bytes of the file `path` of the sandbox. A symlink is followed
        (up to 8 links); a directory raises IsADirectoryError (get_tree reads
        one); a missing file raises dsec.NotFound.

        into: a binary file object (written from where it is) or a local path
        (str or os.PathLike, made or replaced) to stream the file into,
        at the pace it is written, instead of returning it; then the number of
        bytes written is returned."""
        path = _files.check_path(path)
        if into is not None:
            return self._get_into(path, into)
        for _ in range(9):
            one = _files.read_one(self.session._s.get(self.id, path), path)
            if one[0] == "file":
                return one[1]
            path = self._follow(path, one)
        raise ValueError(f"get {path}: more than 8 symbolic links")

    async def get_async(self, path: str) -> bytes:
        path = _files.check_path(path)
        for _ in range(9):
            fut, done = _future()
            self.session._s.get_async(self.id, path, done)
            one = _files.read_one(await fut, path)
            if one[0] == "file":
                return one[1]
            path = self._follow(path, one)
        raise ValueError(f"get {path}: more than 8 symbolic links")

    def _get_into(self, path: str, into: GetInto) -> int:
        local: str | os.PathLike[str] | None = None
        target: Any = None
        if isinstance(into, (str, os.PathLike)):
            local = into
        else:
            target = into
        opened: Any = None
        written = 0

        def write(b: bytes) -> None:
            nonlocal opened, target, written
            if target is None and local is not None:
                opened = target = open(local, "wb")
            target.write(b)
            written += len(b)
        try:
            for _ in range(9):
                reader = _files.TopFileReader(path, write)
                self.session._s.get_into(self.id, path, reader.feed)
                if reader.kind == "file":
                    if target is None:  # an empty file
                        write(b"")
                    return written
                if reader.kind is None:
                    raise ValueError(f"get {path}: the daemon's archive is empty")
                path = self._follow(path, ("symlink", reader.target) if reader.kind == "symlink"
                                    else ("dir", None))
            raise ValueError(f"get {path}: more than 8 symbolic links")
        finally:
            if opened is not None:
                opened.close()

    def read_stream(self, path: str) -> Iterator[bytes]:
        """The bytes of the file `path` of the sandbox as an iterator of
        pieces, streamed at the pace they are consumed (a get into a queue
        of four pieces, on a thread of its own; leaving the iteration early
        cancels the transfer). Errors as get's, raised by the iteration."""
        path = _files.check_path(path)
        def fill(write: Callable[[bytes], object]) -> int:
            return self._get_into(path, _Writer(write))  # type: ignore[arg-type]  # (enough)
        return self._pieces(fill)

    @staticmethod
    def _pieces(fill: Callable[[Callable[[bytes], object]], object]
                ) -> Generator[bytes, None, None]:
        """The pieces `fill(write)` writes, on a thread of its own, as an
        iterator through a queue of four: the thread waits while the queue is
        full; closing the iterator early makes its next write raise (which
        cancels a transfer), and an error of fill is raised by the iteration."""
        q: queue.Queue[Any] = queue.Queue(maxsize=4)
        stop = threading.Event()
        end = object()

        class _Stopped(Exception):
            pass

        def put(item: Any) -> None:
            while True:
                if stop.is_set():
                    raise _Stopped()
                try:
                    q.put(item, timeout=0.1)
                    return
                except queue.Full:
                    continue

        def run() -> None:
            try:
                fill(put)
                put(end)
            except _Stopped:
                pass
            except BaseException as e:  # handed to the iterating thread
                try:
                    put(e)
                except _Stopped:
                    pass

        t = threading.Thread(target=run, name="dsec-read-stream", daemon=True)

        def pieces() -> Generator[bytes, None, None]:
            t.start()
            try:
                while True:
                    item = q.get()
                    if item is end:
                        return
                    if isinstance(item, BaseException):
                        raise item
                    yield item
            finally:
                stop.set()
                t.join()
        return pieces()

    @staticmethod
    def _follow(path: str, one: _files.One) -> str:
        """Where to read next after what is not a file: a symlink's target."""
        if one[0] != "symlink":
            raise IsADirectoryError(f"get: {path} is a directory in the sandbox "
                                    "(get_tree() reads one as {path: bytes})")
        value = one[1]
        target = value if value.startswith("/") else posixpath.join(posixpath.dirname(path),
                                                                    value)
        return _files.check_path(target)

    @overload
    def get_tree(self, path: str) -> dict[str, bytes]: ...

    @overload
    def get_tree(self, path: str, into: str | os.PathLike[str]) -> int: ...

    def get_tree(self, path: str,
                 into: str | os.PathLike[str] | None = None) -> dict[str, bytes] | int:
        """The regular files below the sandbox's directory `path`, as
        {path relative to it: bytes} (directories, links and others skipped).

        into: a local directory (made if missing) to write the tree into
        instead, as it streams (a thread takes the archive, as read_stream
        does; nothing holds the whole of it): its directories and regular
        files, with their permission bits; a file there is replaced; links
        and special files are skipped. Returns the bytes of the files
        written. Every name is checked before anything of it is written: one
        that would leave `into` raises ValueError."""
        path = _files.check_path(path)
        if into is None:
            return _files.read_tree(self.session._s.get(self.id, path), path)
        pieces = self._pieces(lambda write: self.session._s.get_into(self.id, path, write))
        try:
            return _files.extract_tree(io.BufferedReader(_files.PieceReader(pieces), 1 << 20),
                                       path, into)
        finally:
            pieces.close()  # a tree refused half-way cancels the transfer

    # ---- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """Destroys the sandbox."""
        self.session._s.destroy(self.id)

    async def close_async(self) -> None:
        fut, done = _future()
        self.session._s.destroy_async(self.id, done)
        await fut

    destroy = close
    destroy_async = close_async

    def set_ttl(self, ttl: Seconds) -> float:
        """Sets the sandbox's TTL: it is destroyed `ttl` seconds (1 s to 30
        days) from now, whatever its TTL was; returns the seconds left. Its
        end then says "reached its TTL" (dsec.Closed) like any TTL's."""
        left = self.session._s.set_ttl(self.id, _seconds_ms("ttl", ttl))
        return float(left) / 1000.0

    async def set_ttl_async(self, ttl: Seconds) -> float:
        fut, done = _future()
        self.session._s.set_ttl_async(self.id, _seconds_ms("ttl", ttl), done)
        left = await fut
        return float(left) / 1000.0

    # ---- networking (issue 14) ---------------------------------------------------------

    def set_network(self, allow: Iterable[str] = (), deny: Iterable[str] = ()) -> None:
        """Replaces the policy of an egress sandbox (network=dsec.Egress(...))
        with these rules (Egress's); new connections see it at once, open ones
        keep going. A sandbox without egress raises InvalidArgument, a bad
        rule InvalidArgument naming it."""
        self.session._s.set_network(self.id, _rules("allow", allow), _rules("deny", deny))

    async def set_network_async(self, allow: Iterable[str] = (),
                                deny: Iterable[str] = ()) -> None:
        fut, done = _future()
        self.session._s.set_network_async(self.id, _rules("allow", allow),
                                          _rules("deny", deny), done)
        await fut

    # ---- port exposure (issue 14) -----------------------------------------------------

    def expose(self, port: int) -> str:
        """Forwards a fresh port of the sandbox's node (dsecd --expose-address,
        127.0.0.1 by default) to TCP `port` on the sandbox's loopback, and
        returns where to connect, "HOST:PORT". The sandbox needs a network of
        its own (net=True); a port already exposed raises AlreadyExists. The
        forward ends with the sandbox."""
        return str(self.session._s.expose(self.id, _port("port", port)).address)

    async def expose_async(self, port: int) -> str:
        fut, done = _future()
        self.session._s.expose_async(self.id, _port("port", port), done)
        got: ExposedPort = await fut
        return str(got.address)

    def ports(self) -> dict[int, str]:
        """Its exposed ports: {port inside: "HOST:PORT" on its node}."""
        for info in self.session._s.list():
            if info.id == self.id:
                return {int(p.port): str(p.address) for p in info.exposed}
        raise NotFound(f"sandbox {self.id} is not in its session")

    # ---- usage (dsec stats / top) ------------------------------------------------------

    def stats(self) -> SandboxUsage:
        """What the sandbox uses now, as its node reads it from the host's side
        (`dsec stats ID`): `.usage` holds memory (its cgroup's charge), CPU
        time (its live processes and every one that ended), tasks, and its
        writable layer's bytes and files, each with its limit (0: none);
        `.traffic` counts an egress sandbox's packets. microVMs raise
        Unsupported."""
        return self.session._s.usage(self.id, False)

    async def stats_async(self) -> SandboxUsage:
        fut, done = _future()
        self.session._s.usage_async(self.id, False, done)
        got: SandboxUsage = await fut
        return got

    def top(self) -> list[SandboxProcess]:
        """Its processes as the sandbox sees them (`dsec top ID`), by pid:
        pid and ppid in its pid namespace (init is 1), uid in its user
        namespace, state, threads, RSS, CPU time, age and command line."""
        return list(self.session._s.usage(self.id, True).processes)

    async def top_async(self) -> list[SandboxProcess]:
        fut, done = _future()
        self.session._s.usage_async(self.id, True, done)
        got: SandboxUsage = await fut
        return list(got.processes)

    # ---- snapshots (issue 16) ---------------------------------------------------------

    def pause(self) -> bool:
        """Freezes every process of the sandbox and stops its TTL clock; exec,
        put and get raise dsec.Paused until resume(). False if it was paused."""
        return bool(self.session._s.pause(self.id, True))

    def resume(self) -> bool:
        """Lets a paused sandbox run again, its TTL counting on. False if it
        was not paused."""
        return bool(self.session._s.pause(self.id, False))

    def snapshot(self, ref: str) -> str:
        """pack_diff: the sandbox's writable layer as the diff layer `ref`
        (NAME@VERSION; frozen for the copy only); returns its digest. Start
        sandboxes from it with Session.create(snapshot=ref)."""
        return str(self.session._s.snapshot(self.id, _str("ref", ref, allow_empty=False)))

    def fork(self, n: int = 1) -> Batch:
        """`n` new sandboxes of this session with this sandbox's files (one
        shared diff layer, one batch); this one goes on running. Processes are
        not copied."""
        n = _int("n", n, hi=1_000_000)
        ids = self.session._s.fork(self.id, n)
        return Batch([Sandbox(self.session, i) for i in ids], [], None)

    def answer(self, request_id: int, reward: float = 0.0, text: str = "", data: Data = b"",
               done: bool = False) -> None:
        """Answers this sandbox's Chronus feedback request `request_id`."""
        self.session.answer(self.id, request_id, reward, text, data, done)

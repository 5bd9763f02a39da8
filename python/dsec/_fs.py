"""Sandbox.files: a sandbox's files by path, without tar or coreutils in its image.

write and read are Sandbox.put and Sandbox.get (tar streams that the daemon
unpacks with the image's tar, else with the static busybox dsec puts in every
sandbox at /.dsec/libexec). list, stat, exists, remove, make_dir and rename run that
busybox as a command of the sandbox, so they work in an image that has no shell
and no coreutils; what they read comes from the sandbox (the agent may have
changed anything there) and is parsed as untrusted.
"""

from __future__ import annotations

import asyncio
import posixpath
import queue
import stat as _stat
import threading
from typing import (TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator, List, Literal,
                    NamedTuple, Union, cast, overload)

from . import _files

if TYPE_CHECKING:
    from . import PutData, Sandbox

BUSYBOX = "/.dsec/libexec/busybox"
WATCH = "/.dsec/libexec/watch"

Kind = Literal["file", "dir", "symlink", "other"]


class FileInfo(NamedTuple):
    """One entry of a sandbox's tree: what Files.stat and Files.list return.
    `kind` is file, dir, symlink or other (a fifo, socket or device); `mode`
    the permission bits; `mtime` seconds since the epoch. A symlink is
    described itself, not followed."""

    path: str
    name: str
    kind: Kind
    size: int
    mode: int
    mtime: int


def _kind(raw_mode: int) -> Kind:
    if _stat.S_ISREG(raw_mode):
        return "file"
    if _stat.S_ISDIR(raw_mode):
        return "dir"
    if _stat.S_ISLNK(raw_mode):
        return "symlink"
    return "other"


def _info(path: str, line: str) -> FileInfo:
    # busybox stat -c '%f %s %Y': the raw mode in hex, the size, the mtime.
    parts = line.split(" ")
    if len(parts) != 3:
        raise RuntimeError(f"stat {path}: unexpected answer from the sandbox: {line!r}")
    try:
        raw, size, mtime = int(parts[0], 16), int(parts[1]), int(parts[2])
    except ValueError:
        raise RuntimeError(f"stat {path}: unexpected answer from the sandbox: {line!r}") from None
    return FileInfo(path, posixpath.basename(path) or "/", _kind(raw), size,
                    _stat.S_IMODE(raw), mtime)


class Files:
    """A sandbox's files by path (Sandbox.files). Paths are absolute; every
    call raises dsec.NotFound for a path that is not there, and the
    exception of the failing command (dsec.CommandFailed) otherwise."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def watch(self, path: str, *, recursive: bool = False) -> Watch:
        """Watches the directory `path` for changes (see Watch): returns
        once the watch is set, so every change after it is reported. With
        recursive=True the directories under it are watched too, new ones
        as they appear. Raises dsec.NotFound for a missing path and
        NotADirectoryError for one that is not a directory."""
        return Watch(self._sb, _files.check_path(path), bool(recursive))

    async def watch_async(self, path: str, *, recursive: bool = False) -> AsyncWatch:
        """watch() for asyncio: an AsyncWatch, once the watch is set."""
        return await AsyncWatch._open(self._sb, _files.check_path(path), bool(recursive))

    def _run(self, what: str, path: str, argv: List[str], input: bytes | None = None) -> str:
        from .errors import CommandFailed, NotFound, Unsupported
        full = [BUSYBOX] + argv
        try:
            # As root, from /, as put and get are, whatever the image's User.
            r = self._sb.exec(full, input=input, user=0, cwd="/")
        except NotFound as e:
            if e.step != "execve":
                raise
            raise Unsupported(f"{what} {path}: sandbox {self._sb.id} has no {BUSYBOX} (the "
                              "node's system layer has none: install busybox-static on the "
                              "node)", step="execve", path=BUSYBOX) from None
        if r.ok:
            return r.stdout.decode("utf-8", "surrogateescape")
        if b"No such file or directory" in r.stderr:
            raise NotFound(f"{what} {path}: no such file or directory in sandbox {self._sb.id}",
                           path=path)
        raise CommandFailed(self._sb.id, full, r)

    def write(self, path: str, data: "PutData", *, mode: int = 0o644) -> None:
        """Writes bytes (a str as UTF-8) to the file `path`; missing parent
        directories are made (Sandbox.put). A local path (os.PathLike) or a
        binary file object streams (Sandbox.put)."""
        self._sb.put(path, data, mode=mode)

    @overload
    def read(self, path: str) -> bytes: ...

    @overload
    def read(self, path: str, *, stream: Literal[False]) -> bytes: ...

    @overload
    def read(self, path: str, *, stream: Literal[True]) -> Iterator[bytes]: ...

    def read(self, path: str, *, stream: bool = False) -> Union[bytes, Iterator[bytes]]:
        """The bytes of the file `path`, following symlinks (Sandbox.get).
        With stream=True, an iterator of its pieces, streamed at the pace
        they are consumed (Sandbox.read_stream); Sandbox.get(path, into=f)
        streams into a file."""
        if stream:
            return self._sb.read_stream(path)
        return self._sb.get(path)

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def stat(self, path: str) -> FileInfo:
        """What `path` is (a symlink itself, not its target)."""
        path = _files.check_path(path)
        out = self._run("stat", path, ["stat", "-c", "%f %s %Y", "--", path])
        return _info(path, out.rstrip("\n"))

    def exists(self, path: str) -> bool:
        from .errors import NotFound
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def list(self, path: str) -> List[FileInfo]:
        """The entries of the directory `path` (not recursive), sorted by name.
        Any name works, spaces and newlines included."""
        path = _files.check_path(path)
        info = self.stat(path)
        if info.kind != "dir":
            raise NotADirectoryError(f"list {path}: not a directory in sandbox {self._sb.id} "
                                     f"(it is a {info.kind})")
        out = self._run("list", path, ["find", path, "-mindepth", "1", "-maxdepth", "1",
                                       "-print0"])
        names = sorted(n for n in out.split("\0") if n)
        if not names:
            return []
        # One stat line per name, in order; NUL-separated names on stdin, so
        # no argument list gets too long and no name is split.
        listing = "\0".join(names).encode("utf-8", "surrogateescape") + b"\0"
        lines = self._run("list", path, ["xargs", "-0", BUSYBOX, "stat", "-c", "%f %s %Y", "--"],
                          input=listing).split("\n")
        lines = [x for x in lines if x]
        if len(lines) != len(names):
            raise RuntimeError(f"list {path}: {len(names)} entries but {len(lines)} stat lines "
                               "(an entry went away meanwhile?)")
        return [_info(n, x) for n, x in zip(names, lines)]

    def remove(self, path: str) -> None:
        """Removes the file, link or whole directory tree `path`."""
        path = _files.check_path(path)
        if path == "/":
            raise ValueError("remove: not the sandbox's root")
        self.stat(path)  # NotFound names a missing one
        self._run("remove", path, ["rm", "-rf", "--", path])

    def make_dir(self, path: str, *, mode: int = 0o755) -> None:
        """Makes the directory `path` and missing parents (fine if it exists)."""
        path = _files.check_path(path)
        self._run("make_dir", path, ["mkdir", "-p", "-m", format(mode & 0o7777, "o"), "--",
                                     path])

    def rename(self, src: str, dst: str) -> None:
        """Moves `src` to `dst` (replacing a file there)."""
        src = _files.check_path(src, "src")
        dst = _files.check_path(dst, "dst")
        self.stat(src)
        self._run("rename", src, ["mv", "-f", "--", src, dst])


EventType = Literal["create", "write", "remove", "rename", "chmod"]

_EVENT_TYPES = frozenset(("create", "write", "remove", "rename", "chmod"))


class FileEvent(NamedTuple):
    """One change seen by a Watch. `type` is create (a new entry, or one
    moved in), write (a file's contents), remove, rename (moved away, or
    renamed: its new name comes as a create) or chmod (mode, owner or times);
    `name` is the path relative to the watched directory ("" for the
    directory itself); `path` is the absolute one."""

    type: EventType
    name: str
    path: str


class _WatchBase:
    """What Watch and AsyncWatch share: the watcher command, its records
    parsed, its end. `put(kind, item)` takes ("ready", None), ("event",
    FileEvent) and ("end", ExecResult or exception), from dsec's threads."""

    def __init__(self, sandbox: Sandbox, path: str, recursive: bool,
                 put: Callable[[str, Any], None]) -> None:
        self.path = path
        self.recursive = recursive
        self.overflowed = 0
        self._sb = sandbox
        self._put = put
        self._pending = b""
        self._err = b""
        self._ended = False
        self._lock = threading.Lock()
        argv = [WATCH] + (["-r"] if recursive else []) + ["--", path]
        self._argv = argv
        # As root, from /, as the other Files calls, with no timeout: it runs
        # until close().
        from .errors import NotFound
        try:
            self._p = sandbox.exec(argv, background=True, stdin=False, user=0, cwd="/",
                                   on_output=self._out)
        except NotFound as e:
            raise self._failure(e) from None
        threading.Thread(target=self._wait, name="dsec-watch", daemon=True).start()

    def _out(self, stream: str, chunk: bytes) -> None:
        with self._lock:
            if stream != "stdout":
                self._err = (self._err + chunk)[-4096:]
                return
            data = self._pending + chunk
            *records, self._pending = data.split(b"\0")
            if len(self._pending) > 65536:  # no record is that long
                self._pending = b""
        for raw in records:
            rec = raw.decode("utf-8", "surrogateescape")
            if rec == "ready":
                self._put("ready", None)
                continue
            if rec == "overflow":
                self.overflowed += 1
                continue
            kind, _, name = rec.partition(" ")
            if kind not in _EVENT_TYPES:
                continue  # not a record of dsec-watch: dropped
            full = posixpath.join(self.path, name) if name else self.path
            self._put("event", FileEvent(cast(EventType, kind), name, full))

    def _wait(self) -> None:
        try:
            self._put("end", self._p.wait())
        except BaseException as e:  # noqa: BLE001 - handed to the reader
            self._put("end", e)

    def _failure(self, item: Any) -> BaseException:
        from .errors import CommandFailed, NotFound, Unsupported
        if isinstance(item, NotFound) and item.step == "execve":
            return Unsupported(f"watch {self.path}: sandbox {self._sb.id} has no {WATCH} (its "
                               "node's dsec is older than Files.watch)", step="execve",
                               path=WATCH)
        if isinstance(item, BaseException):
            return item
        err = self._err.decode("utf-8", "replace").strip()
        if item.exit_code == 3:
            return NotFound(f"watch {self.path}: no such directory in sandbox {self._sb.id}",
                            path=self.path)
        if item.exit_code == 5:
            return NotADirectoryError(f"watch {self.path}: not a directory in sandbox "
                                      f"{self._sb.id}")
        if err:
            return RuntimeError(f"watch {self.path} in sandbox {self._sb.id}: {err}")
        return CommandFailed(self._sb.id, self._argv, item)

    def _ends(self, item: Any) -> BaseException | None:
        """At the end `item`: what to raise (None: the iteration just ends)."""
        from .errors import Closed
        self._ended = True
        if isinstance(item, Closed):
            return None  # close()
        if isinstance(item, BaseException):
            return self._failure(item)
        if item.exit_code != 0 and item.signal == 0:
            return self._failure(item)
        return None

    def _take(self, kind: str, item: Any) -> FileEvent | None:
        """One item of the queue: its event, or None (the end, after which
        `ended` is True); raises why a watch failed."""
        if kind == "event":
            return cast(FileEvent, item)
        if kind == "end":
            exc = self._ends(item)
            if exc is not None:
                raise exc
        return None

    @property
    def ended(self) -> bool:
        """True once the watch ended (closed, or its directory went away)."""
        return self._ended

    def __repr__(self) -> str:
        return (f"<dsec.{type(self).__name__} of {self.path} in {self._sb.id}"
                f"{' (recursive)' if self.recursive else ''}{' ended' if self._ended else ''}>")


class Watch(_WatchBase):
    """A running watch of a sandbox directory (Files.watch): the changes in
    it, in the order the kernel reported them (inotify). Iterate events()
    (or the Watch itself), and close() it (or use it as a context manager):
    it is a command of the sandbox (dsec's /.dsec/libexec/watch, from the
    system layer) that runs until then, or until the directory goes away,
    which ends the iteration. An "overflow" means the kernel dropped
    changes (`overflowed` counts them). A directory that appears under a
    recursive watch is watched at once, and what it holds then is reported
    as created, so `mkdir -p a/b && touch a/b/f` gives a, a/b and a/b/f
    (a file created at that moment may come twice). What it reports comes
    from the sandbox and is parsed as untrusted."""

    def __init__(self, sandbox: Sandbox, path: str, recursive: bool) -> None:
        q: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._q = q
        super().__init__(sandbox, path, recursive, lambda kind, item: q.put((kind, item)))
        kind, item = q.get()
        if kind == "ready":
            return
        raise self._ends(item) or self._failure(item)

    def events(self, timeout: float | None = None) -> Iterator[FileEvent]:
        """The changes, as FileEvent, as they come. The iteration ends when
        none came for `timeout` seconds (None: it waits until the watch
        ends), and when the watch ends (the directory was removed or moved
        away, or close() was called); a watch that failed raises why."""
        while not self._ended:
            try:
                ev = self._take(*self._q.get(timeout=timeout))
            except queue.Empty:
                return
            if ev is not None:
                yield ev

    def __iter__(self) -> Iterator[FileEvent]:
        return self.events()

    def close(self) -> None:
        """Stops the watch (its command in the sandbox is killed)."""
        if not self._ended and not self._p.done:
            self._p.cancel()
        self._ended = True

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncWatch(_WatchBase):
    """Watch for asyncio (``w = await sb.files.watch_async(dir)``): ``async
    for ev in w.events(timeout)`` (or ``async for ev in w``), ``w.close()``,
    ``async with``. The same events and ends as Watch."""

    def __init__(self, sandbox: Sandbox, path: str, recursive: bool,
                 loop: asyncio.AbstractEventLoop) -> None:
        aq: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._q = aq

        def put(kind: str, item: Any) -> None:
            try:
                loop.call_soon_threadsafe(aq.put_nowait, (kind, item))
            except RuntimeError:  # the loop is closed
                pass
        super().__init__(sandbox, path, recursive, put)

    @classmethod
    async def _open(cls, sandbox: Sandbox, path: str, recursive: bool) -> AsyncWatch:
        w = cls(sandbox, path, recursive, asyncio.get_running_loop())
        try:
            kind, item = await w._q.get()
        except BaseException:
            w.close()
            raise
        if kind != "ready":
            raise w._ends(item) or w._failure(item)
        return w

    async def events(self, timeout: float | None = None) -> AsyncIterator[FileEvent]:
        """As Watch.events, awaited."""
        while not self._ended:
            try:
                ev = self._take(*await asyncio.wait_for(self._q.get(), timeout))
            except asyncio.TimeoutError:
                return
            if ev is not None:
                yield ev

    def __aiter__(self) -> AsyncIterator[FileEvent]:
        return self.events()

    def close(self) -> None:
        """Stops the watch (its command in the sandbox is killed)."""
        if not self._ended and not self._p.done:
            self._p.cancel()
        self._ended = True

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

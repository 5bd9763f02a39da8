"""Tar archives for put and get, made and read in memory with tarfile.

The daemon moves files as tar streams: ``put`` unpacks an archive into a
directory of the sandbox with a ``tar`` of the sandbox's (the image's, else the
static busybox dsec puts at /.dsec/libexec; busybox tar creates
missing parent directories), ``get`` packs a path of the sandbox.
"""

from __future__ import annotations

import io
import os
import posixpath
import stat
import tarfile
import time
import typing
from typing import Literal, Union

# What the top of a get's archive holds (read_one).
One = Union[tuple[Literal["file"], bytes], tuple[Literal["dir"], None],
            tuple[Literal["symlink"], str]]


def check_path(path: object, what: str = "path") -> str:
    """An absolute, normalised sandbox path; ValueError/TypeError naming `what`."""
    if not isinstance(path, str):
        raise TypeError(f"{what}: expected a str, got {type(path).__name__}")
    if not path.startswith("/"):
        raise ValueError(f"{what}: the path in the sandbox must be absolute, not {path!r}")
    if "\0" in path:
        raise ValueError(f"{what}: {path!r} contains a NUL byte")
    norm = posixpath.normpath(path)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    return norm


def _owned_by_root(info: tarfile.TarInfo, mode: int | None = None) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    if mode is not None:
        info.mode = mode
    return info




def file_tar(path: str, data: bytes, mode: int, mtime: float | None = None) -> bytes:
    """A tar that, unpacked into /, writes `data` to `path` (parents created),
    modified at `mtime` (seconds since the epoch; None: now). A resumed
    session recognises the same put again whatever its times (the daemon's
    put digest leaves them out)."""
    rel = path.lstrip("/")
    if not rel:
        raise ValueError("path: '/' is a directory, not a file to write")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        info = tarfile.TarInfo(rel)
        info.size = len(data)
        info.mtime = int(time.time()) if mtime is None else int(mtime)
        t.addfile(_owned_by_root(info, mode), io.BytesIO(data))
    return buf.getvalue()


def _open(tar_bytes: bytes, path: str) -> tarfile.TarFile:
    try:
        return tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:")
    except tarfile.TarError as e:
        raise ValueError(f"get {path}: the daemon's archive does not read as tar: {e}") from None


def _read(t: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = t.extractfile(member)
    if f is None:  # only for members that are not regular files, which callers skip
        raise ValueError(f"{member.name!r} is not a regular file in the archive")
    return f.read()


def read_one(tar_bytes: bytes, path: str) -> One:
    """What the archive of `path` (from get) holds at its top: ("file", bytes),
    ("dir", None) or ("symlink", target)."""
    with _open(tar_bytes, path) as t:
        first = t.next()
        if first is None:
            raise ValueError(f"get {path}: the daemon's archive is empty")
        if first.isdir():
            return "dir", None
        if first.issym():
            return "symlink", first.linkname
        if first.islnk() or not first.isreg():
            raise ValueError(f"get {path}: not a regular file (tar type {first.type!r})")
        return "file", _read(t, first)


def read_tree(tar_bytes: bytes, path: str) -> dict[str, bytes]:
    """The regular files of the archive of directory `path`, as {relative path: bytes}
    (a hard link to one of them: its bytes again).

    The archive comes from the sandbox (its own tar made it): every key is
    checked to be a plain relative path below `path` (no "..", not absolute,
    no empty or "." component), so that joining it to a local directory stays
    inside that directory. A member that is not raises ValueError naming it."""
    out: dict[str, bytes] = {}
    with _open(tar_bytes, path) as t:
        members = t.getmembers()
        if not members:
            raise ValueError(f"get {path}: the daemon's archive is empty")
        top = members[0].name.rstrip("/")
        if not members[0].isdir():
            raise NotADirectoryError(f"get_tree: {path} is not a directory in the sandbox "
                                     "(use get() for a file)")
        for m in members[1:]:
            if m.isreg():
                out[_tree_member(m, top, path)] = _read(t, m)
            elif m.islnk():  # another name of a file before it: its bytes
                rel = _tree_member(m, top, path)
                if (target := _link_target(m, top)) in out:
                    out[rel] = out[target]
    return out


# ---- streamed transfers (issue 20): tar streams made and read piece by piece ----

def _size_of(f: typing.Any) -> int | None:
    """The bytes left in a binary file object, when it can say (a regular
    file's descriptor, or a seekable stream); None when it cannot."""
    try:
        fileno = f.fileno()
        st = os.fstat(fileno)
        if stat.S_ISREG(st.st_mode):
            pos = f.tell()
            return max(0, st.st_size - int(pos))
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    try:
        if f.seekable():
            pos = f.tell()
            end = f.seek(0, io.SEEK_END)
            f.seek(pos)
            return int(end - pos)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    return None


class FileTarStream:
    """A tar stream, read(n) at a time, that unpacked into / writes the
    contents of the binary file object `f` (`size` bytes from where it is) to
    `path` with `mode`: its header, the bytes as `f` gives them, the padding
    and the end. Never more than n bytes in memory. A file that ends early or
    grows raises (the put is cancelled)."""

    def __init__(self, path: str, f: typing.Any, size: int, mode: int,
                 mtime: float | None) -> None:
        rel = path.lstrip("/")
        if not rel:
            raise ValueError("path: '/' is a directory, not a file to write")
        info = tarfile.TarInfo(rel)
        info.size = size
        info.mtime = int(time.time()) if mtime is None else int(mtime)
        self._head = _owned_by_root(info, mode).tobuf(format=tarfile.GNU_FORMAT)
        self._f = f
        self._left = size
        self._size = size
        pad = (-size) % tarfile.BLOCKSIZE
        self._tail = b"\0" * (pad + 2 * tarfile.BLOCKSIZE)
        self.sent = 0

    def read(self, n: int) -> bytes:
        out = bytearray()
        if self._head:
            out += self._head[:n]
            self._head = self._head[n:]
        while len(out) < n and self._left > 0:
            want = min(n - len(out), self._left)
            got = self._f.read(want)
            if not got:
                raise ValueError(f"put: the file ended after {self._size - self._left} of "
                                 f"its {self._size} bytes")
            out += got
            self._left -= len(got)
        if len(out) < n and self._left == 0 and self._tail:
            k = n - len(out)
            out += self._tail[:k]
            self._tail = self._tail[k:]
        self.sent += len(out)
        return bytes(out)


class TreeTarStream:
    """A tar stream, read(n) at a time, that unpacked into / copies the
    contents of `local_dir` into `dest` (put_tree).

    `dest` itself gets no entry (an existing directory keeps its mode); files
    and directories below it are owned by root in the sandbox. Symlinks are
    stored as symlinks, a file's further hard links as links; other special
    files are refused. The archive is made as it is sent: the walk goes on
    only as far as the pieces asked for, and a
    file's bytes are read from it in pieces, so no more than n bytes (and one
    header) are ever in memory. A file that ends before the size its header
    gave raises (the put is cancelled); one that grows is sent at that size.
    close() closes the file being read, if any."""

    def __init__(self, local_dir: str | os.PathLike[str], dest: str) -> None:
        if not os.path.isdir(local_dir):
            raise ValueError(f"local_dir: {local_dir!r} is not a directory")
        self._dir = os.fspath(local_dir)
        self._top = dest.lstrip("/")
        # gettarinfo (and its hard-link bookkeeping) of a writer that writes
        # nowhere: the headers are made here, piece by piece.
        self._t = tarfile.open(fileobj=io.BytesIO(), mode="w", format=tarfile.GNU_FORMAT)
        self._walk = self._entries()
        self._pending = bytearray()  # a header, padding or the end, not yet sent
        self._f: typing.BinaryIO | None = None
        self._name = ""
        self._size = 0
        self._left = 0
        self._ended = False
        self.sent = 0

    def _entries(self) -> typing.Iterator[tuple[str, str]]:
        for root, dirs, files in os.walk(self._dir):
            dirs.sort()
            for name in dirs + sorted(files):
                full = os.path.join(root, name)
                rel = os.path.relpath(full, self._dir)
                yield full, (posixpath.join(self._top, rel) if self._top else rel)

    def _next(self) -> bool:
        """Queues the next entry's header (and opens its file); False at the end."""
        for full, arc in self._walk:
            st = os.lstat(full)
            f: typing.BinaryIO | None = None
            if stat.S_ISREG(st.st_mode):
                # Opened first, its header made from the open file: a file
                # replaced by a symlink meanwhile is refused, not followed.
                f = os.fdopen(os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")
                info = self._t.gettarinfo(arcname=arc, fileobj=f)
            elif stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode):
                info = self._t.gettarinfo(full, arcname=arc)
            else:
                raise ValueError(f"local_dir: {full!r} is neither a file, a directory "
                                 "nor a symlink")
            _owned_by_root(info)
            self._pending += info.tobuf(tarfile.GNU_FORMAT, self._t.encoding,
                                        "surrogateescape")
            if f is not None and info.isreg() and info.size > 0:
                self._f, self._name, self._size, self._left = f, full, info.size, info.size
            elif f is not None:
                f.close()  # empty, or a hard link to a file sent already
            return True
        return False

    def read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            if self._pending:
                k = min(n - len(out), len(self._pending))
                out += self._pending[:k]
                del self._pending[:k]
            elif self._f is not None and self._left > 0:
                got = self._f.read(min(n - len(out), self._left))
                if not got:
                    raise ValueError(f"put_tree: {self._name!r} ended after "
                                     f"{self._size - self._left} of its {self._size} bytes")
                out += got
                self._left -= len(got)
            elif self._f is not None:
                self._f.close()
                self._f = None
                self._pending += b"\0" * ((-self._size) % tarfile.BLOCKSIZE)
            elif not self._ended and not self._next():
                self._ended = True
                self._pending += b"\0" * (2 * tarfile.BLOCKSIZE)
            elif self._ended and not self._pending:
                break
        self.sent += len(out)
        return bytes(out)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _tree_member(m: tarfile.TarInfo, top: str, path: str) -> str:
    """The plain relative path below the archive's top `top` that member `m`
    of get_tree's archive of `path` names; ValueError naming it otherwise."""
    if m.name != top and not m.name.startswith(top + "/"):
        raise ValueError(f"get_tree {path}: the sandbox's archive has {m.name!r}, "
                         f"which is not below {top!r}")
    rel = m.name[len(top):].lstrip("/")
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"get_tree {path}: the sandbox's archive has {m.name!r}, "
                         "which is not a plain relative path")
    return rel


def _link_target(m: tarfile.TarInfo, top: str) -> str | None:
    """The relative path below `top` that hard link `m` names, if plain."""
    name = m.linkname
    if name != top and not name.startswith(top + "/"):
        return None
    rel = name[len(top):].lstrip("/")
    if not rel or any(p in ("", ".", "..") for p in rel.split("/")):
        return None
    return rel


class PieceReader(io.RawIOBase):
    """A readable raw file over an iterator of byte pieces (a streamed get),
    for tarfile's stream mode."""

    def __init__(self, pieces: typing.Iterator[bytes]) -> None:
        super().__init__()
        self._pieces = pieces
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: typing.Any) -> int:
        while not self._buf:
            nxt = next(self._pieces, None)
            if nxt is None:
                return 0
            self._buf = nxt
        k = min(len(b), len(self._buf))
        b[:k] = self._buf[:k]
        self._buf = self._buf[k:]
        return k


def extract_tree(stream: typing.BinaryIO, path: str, into: str | os.PathLike[str]) -> int:
    """Writes the directories and regular files of get_tree's archive of
    `path`, read from `stream` as it comes, below the local directory `into`
    (made if missing; a file there is replaced); returns the bytes of the
    files written. Every name is checked as read_tree checks it, before
    anything of it is written; a hard link to a file written before it is a
    hard link here too; symlinks and special files are skipped (as read_tree
    skips them), and modes keep only their permission bits. A file is opened
    without following a symlink."""
    written = 0
    try:
        t = tarfile.open(fileobj=stream, mode="r|")
    except tarfile.TarError as e:
        raise ValueError(f"get {path}: the daemon's archive does not read as tar: {e}") from None
    with t:
        first = t.next()
        if first is None:
            raise ValueError(f"get {path}: the daemon's archive is empty")
        if not first.isdir():
            raise NotADirectoryError(f"get_tree: {path} is not a directory in the sandbox "
                                     "(use get() for a file)")
        top = first.name.rstrip("/")
        root = os.fspath(into)
        os.makedirs(root, exist_ok=True)
        done: set[str] = set()  # the files written, for hard links to them
        for m in t:  # (the iteration begins with `first` again)
            if m is first or not (m.isreg() or m.isdir() or m.islnk()):
                continue
            rel = _tree_member(m, top, path)
            local = os.path.join(root, *rel.split("/"))
            if m.isdir():
                os.makedirs(local, mode=0o755, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(local), mode=0o755, exist_ok=True)
            if m.islnk():  # another name of a file written before it
                target = _link_target(m, top)
                if target in done:
                    if os.path.lexists(local):
                        os.unlink(local)
                    os.link(os.path.join(root, *target.split("/")), local)
                    done.add(rel)
                continue
            src = t.extractfile(m)
            if src is None:
                continue
            if os.path.lexists(local) and not os.path.isdir(local):
                os.unlink(local)  # replaced, not written through (a link, another name)
            fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, m.mode & 0o777)
            with os.fdopen(fd, "wb") as out:
                while True:
                    piece = src.read(1 << 20)
                    if not piece:
                        break
                    out.write(piece)
                    written += len(piece)
            done.add(rel)
    return written


def _nul_str(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _tar_int(b: bytes) -> int:
    if b and b[0] & 0x80:  # GNU base-256
        v = int.from_bytes(b[1:], "big")
        return v
    s = b.split(b"\0", 1)[0].strip(b" \0")
    return int(s, 8) if s else 0


class TopFileReader:
    """Reads the first member of a get's tar stream as it comes (feed(piece)):
    a regular file's bytes go to `write` as they arrive; kind says what the
    top was ("file", "dir", "symlink" with target, or None before its header).
    Pax and GNU long-name headers before it are skipped. Whatever follows the
    first member is ignored."""

    def __init__(self, path: str, write: "typing.Callable[[bytes], object]") -> None:
        self._path = path
        self._write = write
        self._buf = bytearray()
        self._left = 0      # data bytes of the current header still to come
        self._skip = 0      # padding (or skipped data) still to drop
        self._pending: str | None = None  # a long name/link being read
        self._longlink: str | None = None
        self.kind: str | None = None
        self.target = ""
        self.done = False

    def feed(self, piece: bytes) -> None:
        if self.done:
            return
        self._buf += piece
        while self._buf and not self.done:
            if self._skip:
                k = min(self._skip, len(self._buf))
                del self._buf[:k]
                self._skip -= k
                continue
            if self.kind == "file":
                k = min(self._left, len(self._buf))
                if k:
                    self._write(bytes(self._buf[:k]))
                    del self._buf[:k]
                    self._left -= k
                if self._left == 0:
                    self.done = True
                return
            if self._pending is not None:  # the data of a GNU long name, or of a pax header
                if len(self._buf) < self._left:
                    return
                data = bytes(self._buf[:self._left])
                del self._buf[:self._left]
                self._skip = (-self._left) % tarfile.BLOCKSIZE
                if self._pending == "K":
                    self._longlink = _nul_str(data)
                elif self._pending == "x":
                    for rec in data.decode("utf-8", "surrogateescape").split("\n"):
                        if " linkpath=" in rec:
                            self._longlink = rec.split(" linkpath=", 1)[1]
                self._pending = None
                continue
            if len(self._buf) < tarfile.BLOCKSIZE:
                return
            h = bytes(self._buf[:tarfile.BLOCKSIZE])
            del self._buf[:tarfile.BLOCKSIZE]
            if h == b"\0" * tarfile.BLOCKSIZE:
                raise ValueError(f"get {self._path}: the daemon's archive is empty")
            size = _tar_int(h[124:136])
            typ = chr(h[156]) if h[156] else "0"
            if typ in ("L", "K", "x", "g"):
                self._pending = typ
                self._left = size
                continue
            if typ in ("0", "7"):
                self.kind = "file"
                self._left = size
                self._skip = 0
                if size == 0:
                    self.done = True
                continue
            if typ == "5":
                self.kind = "dir"
            elif typ == "2":
                self.kind = "symlink"
                self.target = self._longlink or _nul_str(h[157:257])
            else:
                raise ValueError(f"get {self._path}: not a regular file (tar type {typ!r})")
            self.done = True

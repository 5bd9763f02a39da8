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


def tree_tar(local_dir: str | os.PathLike[str], dest: str) -> bytes:
    """A tar that, unpacked into /, copies the contents of `local_dir` into `dest`.

    `dest` itself gets no entry (an existing directory keeps its mode); files
    and directories below it are owned by root in the sandbox. Symlinks are
    stored as symlinks; other special files are refused.
    """
    if not os.path.isdir(local_dir):
        raise ValueError(f"local_dir: {local_dir!r} is not a directory")
    top = dest.lstrip("/")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for root, dirs, files in os.walk(local_dir):
            dirs.sort()
            for name in dirs + sorted(files):
                full = os.path.join(root, name)
                rel = os.path.relpath(full, local_dir)
                arc = posixpath.join(top, rel) if top else rel
                st = os.lstat(full)
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)
                        or stat.S_ISLNK(st.st_mode)):
                    raise ValueError(f"local_dir: {full!r} is neither a file, a directory "
                                     "nor a symlink")
                t.add(full, arcname=arc, recursive=False, filter=_owned_by_root)
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
    """The regular files of the archive of directory `path`, as {relative path: bytes}.

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
            if not m.isreg():
                continue
            if m.name != top and not m.name.startswith(top + "/"):
                raise ValueError(f"get_tree {path}: the sandbox's archive has {m.name!r}, "
                                 f"which is not below {top!r}")
            rel = m.name[len(top):].lstrip("/")
            parts = rel.split("/")
            if not rel or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"get_tree {path}: the sandbox's archive has {m.name!r}, "
                                 "which is not a plain relative path")
            out[rel] = _read(t, m)
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

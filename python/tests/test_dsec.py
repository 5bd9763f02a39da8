"""The dsec package against a real dsecd (tests/daemon.py): commands, streams,
files, errors, sessions, asyncio at scale, Chronus, and that nothing is left."""

import asyncio
import hashlib
import io
import os
import pathlib
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import dsec

from daemon import Daemon

D = None


def setUpModule():
    global D
    D = Daemon()


def tearDownModule():
    global D
    d, D = D, None
    if d is not None:
        d.stop_clean()


def os_threads():
    return len(os.listdir("/proc/self/task"))


class Base(unittest.TestCase):
    def setUp(self):
        self.c = dsec.connect(D.address)
        self.addCleanup(self.c.close)

    def live_ids(self):
        return {i.id for i in self.c.list()}

    def assertGone(self, ids):
        deadline = time.time() + 30
        while time.time() < deadline and self.live_ids() & set(ids):
            time.sleep(0.05)
        self.assertFalse(self.live_ids() & set(ids), "sandboxes left on the node")


class HostMounts(Base):
    def test_mounts_read_only_beneath_the_allowed_directory(self):
        with self.c.session(quota=4, ttl=120, name="py-mounts") as s:
            sb = s.create_one(base="py@1", mounts=[f"{D.host_dir}:/data"])
            r = sb.exec("cat /data/data.txt; echo x > /data/new")
            self.assertEqual(r.stdout, b"from the host\n")
            self.assertNotEqual(r.exit_code, 0)
            self.assertIn(b"Read-only file system", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(D.host_dir, "new")))
            # Outside the allowed directory, or writable where only reading is
            # allowed: refused, naming the mount.
            with self.assertRaises(dsec.InvalidArgument) as e:
                s.create_one(base="py@1", mounts=[f"{D.state}:/data"])
            self.assertIn(f"{D.state}:/data:ro", str(e.exception))
            with self.assertRaises(dsec.InvalidArgument) as e:
                s.create_one(base="py@1", mounts=[f"{D.host_dir}:/data:rw"])
            self.assertIn("read-only only", str(e.exception))
            with self.assertRaises(ValueError):
                s.create_one(base="py@1", mounts=["relative:/data"])
            with self.assertRaises(TypeError):
                s.create_one(base="py@1", mounts=f"{D.host_dir}:/data")


class Commands(Base):
    def test_exec_collects_output_exit_codes_and_limits(self):
        with self.c.session(quota=8, ttl=120, name="py-exec") as s:
            sbs = s.create(base="py@1", workdir="task@1", tools=["grader@1"], count=2,
                           memory="256m", pids=64, cpus=1)
            self.assertEqual(len(sbs), 2)
            self.assertEqual(sbs.failures, [])
            self.assertNotEqual(sbs[0].id, sbs[1].id)
            sb = sbs[0]
            r = sb.exec("echo hi; echo oops >&2; exit 3", timeout=30)
            self.assertEqual((r.exit_code, r.signal, r.timed_out), (3, 0, False))
            self.assertEqual(r.stdout, b"hi\n")
            self.assertEqual(r.stderr, b"oops\n")
            self.assertFalse(r.ok)
            self.assertGreater(r.duration, 0)
            self.assertLess(r.duration, 30)
            # argv, env, cwd, stdin, user
            r = sb.exec(["cat", "README"], cwd="/work")
            self.assertEqual((r.exit_code, r.stdout), (0, b"task 17\n"))
            self.assertTrue(r.ok)
            r = sb.exec("echo $FOO-$BAR", env={"FOO": "a", "BAR": "b c"})
            self.assertEqual(r.stdout, b"a-b c\n")
            r = sb.exec(["wc", "-c"], input=b"x" * 100000)
            self.assertEqual(r.stdout.strip(), b"100000")
            r = sb.exec("id -u; id -g", user=1000)
            self.assertEqual(r.stdout, b"1000\n1000\n")
            # By name: the image's passwd gives the ids, HOME and USER.
            r = sb.exec("id -u; id -g; echo $HOME $USER", user="user")
            self.assertEqual(r.stdout, b"1000\n1000\n/home/user user\n")
            with self.assertRaises(dsec.InvalidArgument) as e:
                sb.exec("true", user="nobody-here")
            self.assertIn("nobody-here", str(e.exception))
            r = sb.exec("/opt/grader/grade.sh")
            self.assertEqual(r.stdout, b"graded\n")
            # The two sandboxes do not share files.
            sb.exec("echo mine > /tmp/x")
            self.assertNotEqual(sbs[1].exec("cat /tmp/x").exit_code, 0)
            # A timeout kills it; a signal is reported; output is capped.
            t0 = time.monotonic()
            r = sb.exec("sleep 30", timeout=0.3)
            self.assertTrue(r.timed_out)
            self.assertLess(time.monotonic() - t0, 10)
            r = sb.exec("kill -9 $$")
            self.assertEqual(r.signal, 9)
            r = sb.exec("yes | head -c 100000", max_output=1000)
            self.assertTrue(r.truncated)
            self.assertEqual(len(r.stdout), 1000)
            with self.assertRaises(dsec.NotFound) as cm:
                sb.exec(["no-such-program"])
            self.assertIn("no-such-program", str(cm.exception))
            self.assertEqual({i.id for i in s.list()}, {b.id for b in sbs})
            # A single daemon: every node (itself) answers.
            everything = self.c.list_all()
            self.assertIsInstance(everything, dsec.SandboxList)
            self.assertEqual(everything.missing, [])
            self.assertTrue({b.id for b in sbs} <= {i.id for i in everything.sandboxes})
            sbs[1].close()
            self.assertEqual({i.id for i in s.list()}, {sb.id})
            with self.assertRaises(dsec.NotFound) as cm:
                sbs[1].exec("true")
            self.assertIn(sbs[1].id, str(cm.exception))
        self.assertGone([b.id for b in sbs])

    def test_exec_stream_yields_chunks_then_the_result(self):
        with self.c.session(quota=2, ttl=120) as s:
            sb = s.create("py@1")[0]
            st = sb.exec_stream("for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.05;"
                                " done; exit 4")
            self.assertIsNone(st.result)
            out, err = b"", b""
            for stream, chunk in st:
                self.assertIn(stream, ("stdout", "stderr"))
                self.assertIsInstance(chunk, bytes)
                if stream == "stdout":
                    out += chunk
                else:
                    err += chunk
            self.assertEqual(out, b"out1\nout2\nout3\n")
            self.assertEqual(err, b"err1\nerr2\nerr3\n")
            self.assertEqual(st.result.exit_code, 4)
            self.assertEqual(list(st), [])  # exhausted
            # A failure raises from the iteration.
            sb.close()
            with self.assertRaises(dsec.NotFound):
                list(sb.exec_stream("echo never"))


class Files(Base):
    def test_put_and_get_round_trip(self):
        with self.c.session(quota=2, ttl=120) as s:
            sb = s.create("py@1", workdir="task@1")[0]
            blob = bytes(range(256)) * 4000
            sb.put("/work/new/deep/a.bin", blob)
            self.assertEqual(sb.get("/work/new/deep/a.bin"), blob)
            self.assertEqual(sb.exec("wc -c < /work/new/deep/a.bin").stdout.strip(),
                             str(len(blob)).encode())
            sb.put("/tmp/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
            self.assertEqual(sb.exec("/tmp/run.sh").stdout, b"ran\n")
            sb.put("/tmp/empty", b"")
            self.assertEqual(sb.get("/tmp/empty"), b"")
            # What the command wrote, and the layers' files.
            sb.exec("printf 'from the sandbox' > /tmp/out; ln -s /tmp/out /tmp/link")
            self.assertEqual(sb.get("/tmp/out"), b"from the sandbox")
            self.assertEqual(sb.get("/tmp/link"), b"from the sandbox")
            self.assertEqual(sb.get("/work/README"), b"task 17\n")
            with self.assertRaises(IsADirectoryError):
                sb.get("/work")
            tree = sb.get_tree("/work")
            self.assertEqual(tree["README"], b"task 17\n")
            self.assertEqual(tree["new/deep/a.bin"], blob)
            # A local directory tree.
            with tempfile.TemporaryDirectory() as local:
                os.makedirs(os.path.join(local, "pkg", "sub"))
                with open(os.path.join(local, "pkg", "sub", "m.py"), "w") as f:
                    f.write("print(1)\n")
                with open(os.path.join(local, "top.txt"), "w") as f:
                    f.write("top\n")
                sb.put_tree(local, "/opt/code")
            self.assertEqual(sb.get_tree("/opt/code"), {"pkg/sub/m.py": b"print(1)\n",
                                                        "top.txt": b"top\n"})
            with self.assertRaises(dsec.NotFound) as cm:
                sb.get("/no/such/file")
            self.assertIn("/no/such/file", str(cm.exception))
            with self.assertRaises(ValueError) as cm:
                sb.put("relative/path", b"x")
            self.assertIn("relative/path", str(cm.exception))
            with self.assertRaises(TypeError):
                sb.put("/tmp/x", 42)


    def test_streamed_put_and_get_from_and_into_file_objects(self):
        # 24 MiB: many pieces of 512 KiB; never one buffer of it in the extension.
        data = os.urandom(24 << 20)
        digest = hashlib.sha256(data).hexdigest()
        with self.c.session(quota=1, ttl=120) as s, tempfile.TemporaryDirectory() as local:
            sb = s.create("py@1", memory="512m", disk="128m")[0]
            src = os.path.join(local, "src.bin")
            with open(src, "wb") as f:
                f.write(data)
            # a binary file object, streamed from where it is
            with open(src, "rb") as f:
                sb.put("/tmp/a.bin", f)
            self.assertEqual(sb.exec("sha256sum /tmp/a.bin").stdout.split()[0].decode(), digest)
            # a path (os.PathLike), and files.write of a pipe's reading end (spooled)
            sb.files.write("/tmp/b.bin", pathlib.Path(src))
            r, w = os.pipe()
            with os.fdopen(w, "wb") as wf:
                wf.write(b"through a pipe\n")
            with os.fdopen(r, "rb") as rf:
                sb.put("/tmp/c.txt", rf)
            self.assertEqual(sb.get("/tmp/c.txt"), b"through a pipe\n")
            # get into a file object and into a path, and read(stream=True)
            out = io.BytesIO()
            self.assertEqual(sb.get("/tmp/b.bin", into=out), len(data))
            self.assertEqual(hashlib.sha256(out.getvalue()).hexdigest(), digest)
            dst = os.path.join(local, "dst.bin")
            self.assertEqual(sb.get("/tmp/a.bin", into=dst), len(data))
            with open(dst, "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), digest)
            h = hashlib.sha256()
            n = 0
            for piece in sb.files.read("/tmp/a.bin", stream=True):
                self.assertLessEqual(len(piece), 2 << 20)
                h.update(piece)
                n += 1
            self.assertEqual(h.hexdigest(), digest)
            self.assertGreater(n, 4)
            # leaving the iteration early cancels the get; the sandbox goes on
            it = sb.files.read("/tmp/a.bin", stream=True)
            next(it)
            it.close()
            self.assertEqual(sb.exec("echo ok").stdout, b"ok\n")
            # a symlink is followed, a missing file names itself
            sb.exec("ln -s /tmp/c.txt /tmp/link")
            out = io.BytesIO()
            sb.get("/tmp/link", into=out)
            self.assertEqual(out.getvalue(), b"through a pipe\n")
            with self.assertRaises(dsec.NotFound) as cm:
                sb.get("/no/such/file", into=io.BytesIO())
            self.assertIn("/no/such/file", str(cm.exception))
            with self.assertRaises(dsec.NotFound):
                list(sb.files.read("/no/such/file", stream=True))

    def test_trees_and_archives_stream_both_ways(self):
        # put_tree makes its archive as it is sent: a tree of 24 MiB in many
        # pieces, with a hard link, a symlink, an empty file and a long name.
        big = os.urandom(24 << 20)
        long_name = "n" * 120 + ".txt"
        with self.c.session(quota=1, ttl=120) as s, tempfile.TemporaryDirectory() as local:
            sb = s.create("py@1", memory="512m", disk="256m")[0]
            src = os.path.join(local, "src")
            os.makedirs(os.path.join(src, "a", "b"))
            with open(os.path.join(src, "a", "big.bin"), "wb") as f:
                f.write(big)
            os.link(os.path.join(src, "a", "big.bin"), os.path.join(src, "a", "again.bin"))
            with open(os.path.join(src, "a", "b", long_name), "w") as f:
                f.write("long\n")
            open(os.path.join(src, "empty"), "wb").close()
            os.chmod(os.path.join(src, "empty"), 0o600)
            os.symlink("a/big.bin", os.path.join(src, "link"))
            reads = []
            stream = dsec._files.TreeTarStream(src, "/opt/t")
            orig = stream.read

            def read(n: int) -> bytes:
                b = orig(n)
                reads.append((n, len(b)))
                return b
            stream.read = read  # type: ignore[method-assign]
            size = sb.session._s.put_from(sb.id, "/", stream.read)
            self.assertEqual(size, stream.sent)
            self.assertGreater(len(reads), 8)  # in pieces
            self.assertTrue(all(got <= n for n, got in reads))
            digest = hashlib.sha256(big).hexdigest()
            out = sb.exec("cd /opt/t && sha256sum a/big.bin a/again.bin && stat -c '%h %a %U' "
                          "a/big.bin empty && readlink link && cat a/b/" + long_name).stdout
            lines = out.decode().splitlines()
            self.assertEqual(lines[0].split()[0], digest)
            self.assertEqual(lines[1].split()[0], digest)
            self.assertEqual(lines[2].split()[0], "2")  # a hard link in the sandbox too
            self.assertEqual(lines[3], "1 600 root")
            self.assertEqual(lines[4:], ["a/big.bin", "long"])
            # The public call: the same tree again, into another directory.
            self.assertGreater(sb.put_tree(src, "/opt/u"), len(big))
            self.assertEqual(sb.exec("sha256sum /opt/u/a/big.bin").stdout.split()[0].decode(),
                             digest)
            # get_tree into a local directory: files and directories, as it comes.
            dst = os.path.join(local, "dst")
            self.assertEqual(sb.get_tree("/opt/t", into=dst), len(big) + 5)
            with open(os.path.join(dst, "a", "big.bin"), "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), digest)
            self.assertEqual(os.stat(os.path.join(dst, "a", "again.bin")).st_ino,
                             os.stat(os.path.join(dst, "a", "big.bin")).st_ino)
            # again: what is there is replaced (a hard link is not written through)
            self.assertEqual(sb.get_tree("/opt/t", into=dst), len(big) + 5)
            tree = sb.get_tree("/opt/t")
            self.assertEqual(sorted(tree), ["a/again.bin", "a/b/" + long_name, "a/big.bin",
                                            "empty"])
            self.assertEqual(tree["a/again.bin"], big)
            with open(os.path.join(dst, "a", "b", long_name)) as f:
                self.assertEqual(f.read(), "long\n")
            self.assertEqual(os.stat(os.path.join(dst, "empty")).st_mode & 0o777, 0o600)
            self.assertFalse(os.path.lexists(os.path.join(dst, "link")))  # links skipped
            with self.assertRaises(NotADirectoryError):
                sb.get_tree("/opt/t/a/big.bin", into=os.path.join(local, "x"))
            with self.assertRaises(dsec.NotFound):
                sb.get_tree("/no/such", into=os.path.join(local, "y"))
            # Archives: get_tar into a file, put_tar from it (a path and a file object).
            tar_path = os.path.join(local, "t.tar")
            n = sb.get_tar("/opt/t/a", into=tar_path)
            self.assertEqual(n, os.path.getsize(tar_path))
            sb.exec("mkdir -p /srv /srv2")  # (put_tar unpacks into a directory that is there)
            sb.put_tar("/srv", pathlib.Path(tar_path))
            with open(tar_path, "rb") as f:
                sb.put_tar("/srv2", f)
            got = sb.exec("sha256sum /srv/a/big.bin /srv2/a/again.bin").stdout.decode().split()
            self.assertEqual((got[0], got[2]), (digest, digest))
            buf = io.BytesIO()
            self.assertEqual(sb.get_tar("/opt/t/empty", into=buf), len(buf.getvalue()))
            with self.assertRaises(TypeError):
                sb.put_tar("/srv", 42)  # type: ignore[arg-type]

    def test_put_tree_refuses_a_file_that_shrinks_while_it_is_sent(self):
        with self.c.session(quota=1, ttl=120) as s, tempfile.TemporaryDirectory() as local:
            sb = s.create("py@1")[0]
            path = os.path.join(local, "f.bin")
            with open(path, "wb") as f:
                f.write(b"x" * (4 << 20))
            stream = dsec._files.TreeTarStream(local, "/opt/s")
            head = [stream.read(1024)]  # its header went: the size is taken

            def read(n: int) -> bytes:
                if head:  # what was read already goes first
                    return head.pop()
                return stream.read(n)
            os.truncate(path, 1000)
            with self.assertRaises(ValueError) as cm:
                sb.session._s.put_from(sb.id, "/", read)
            self.assertIn("f.bin", str(cm.exception))
            self.assertIn("ended after", str(cm.exception))
            stream.close()
            self.assertEqual(sb.exec("echo ok").stdout, b"ok\n")

    def test_get_tree_refuses_names_that_leave_the_tree(self):
        # The sandbox controls the archive get returns: here its tar is
        # replaced by one that returns a crafted archive with "..".
        import io
        import tarfile
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
            d = tarfile.TarInfo("work")
            d.type = tarfile.DIRTYPE
            t.addfile(d)
            data = b"owned\n"
            f = tarfile.TarInfo("work/../../etc/cron.d/x")
            f.size = len(data)
            t.addfile(f, io.BytesIO(data))
        with self.c.session(quota=1, ttl=120) as s:
            sb = s.create("py@1")[0]
            sb.put("/tmp/evil.tar", buf.getvalue())
            sb.exec("mkdir -p /usr/local/bin && printf '#!/bin/sh\\ncat /tmp/evil.tar\\n'"
                    " > /usr/local/bin/tar && chmod 755 /usr/local/bin/tar")
            with self.assertRaises(ValueError) as cm:
                sb.get_tree("/work")
            self.assertIn("work/../../etc/cron.d/x", str(cm.exception))
            with tempfile.TemporaryDirectory() as local:
                into = os.path.join(local, "in")
                with self.assertRaises(ValueError) as cm:
                    sb.get_tree("/work", into=into)
                self.assertIn("work/../../etc/cron.d/x", str(cm.exception))
                self.assertEqual(os.listdir(local), ["in"])  # nothing beside it
                self.assertEqual(os.listdir(into), [])


class FilesWithoutTools(Base):
    """Sandbox.files, put and get in an image with no shell, tar or
    coreutils (bare@1): dsec's own static busybox at /.dsec/bin does it."""

    def test_files_api_in_a_bare_image(self):
        with self.c.session(quota=1, ttl=120) as s:
            sb = s.create("bare@1")[0]
            with self.assertRaises(dsec.NotFound):  # truly no shell
                sb.exec(["/bin/sh", "-c", "true"])
            f = sb.files
            f.write("/work/a.txt", "alpha\n")
            f.write("/work/sub/run", b"\x00\x01", mode=0o700)
            f.write("/work/name with\nnewline", b"odd")
            self.assertEqual(f.read("/work/a.txt"), b"alpha\n")
            self.assertEqual(f.read_text("/work/a.txt"), "alpha\n")
            names = [(e.name, e.kind) for e in f.list("/work")]
            self.assertEqual(names, [("a.txt", "file"), ("name with\nnewline", "file"),
                                     ("sub", "dir")])
            st = f.stat("/work/sub/run")
            self.assertEqual((st.kind, st.size, st.mode), ("file", 2, 0o700))
            self.assertGreater(st.mtime, 0)
            self.assertEqual(f.stat("/work").kind, "dir")
            self.assertTrue(f.exists("/work/a.txt"))
            self.assertFalse(f.exists("/work/nothing"))
            f.make_dir("/work/d/e", mode=0o750)
            self.assertEqual(f.stat("/work/d/e").mode, 0o750)
            f.rename("/work/a.txt", "/work/d/b.txt")
            self.assertFalse(f.exists("/work/a.txt"))
            self.assertEqual(f.read("/work/d/b.txt"), b"alpha\n")
            f.remove("/work/d")
            self.assertFalse(f.exists("/work/d"))
            self.assertEqual(sorted(sb.get_tree("/work")),
                             ["name with\nnewline", "sub/run"])
            with self.assertRaises(dsec.NotFound) as cm:
                f.stat("/no/such")
            self.assertIn("/no/such", str(cm.exception))
            with self.assertRaises(dsec.NotFound):
                f.list("/no/such")
            with self.assertRaises(NotADirectoryError):
                f.list("/work/sub/run")
            with self.assertRaises(dsec.NotFound):
                f.remove("/no/such")
            with self.assertRaises(ValueError):
                f.remove("/")
            with self.assertRaises(ValueError):
                f.stat("relative")
            self.assertEqual(f.list("/work/sub")[0].name, "run")


class FilesWatch(Base):
    """Sandbox.files.watch: dsec's own watcher (/.dsec/libexec/watch) in the
    sandbox, its changes in order, its end, and nothing left running."""

    def watchers(self, sb):
        r = sb.exec("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
                    check=True)
        return [x for x in r.stdout.decode().splitlines() if "/.dsec/libexec/watch" in x]

    def assertSubsequence(self, want, got):
        it = iter(got)
        for w in want:
            self.assertTrue(any(g == w for g in it), f"{w} missing (or out of order) in {got}")

    def collect(self, w, last):
        got = []
        for ev in w.events(timeout=20):
            got.append((ev.type, ev.name))
            if (ev.type, ev.name) == last:
                return got
        self.fail(f"{last} never came; got {got}")

    def test_watch_reports_changes_in_order_and_ends(self):
        with self.c.session(quota=1, ttl=120) as s:
            sb = s.create("py@1")[0]
            sb.exec("mkdir -p /work/old /work/keep", check=True)
            with sb.files.watch("/work", recursive=True) as w:
                self.assertEqual(len(self.watchers(sb)), 1)
                sb.exec("echo hi > /work/a && chmod 600 /work/a && mkdir -p /work/n/d && "
                        "echo x > /work/n/d/f && mv /work/a /work/old/b && rm -r /work/n && "
                        "touch /work/done", check=True)
                got = self.collect(w, ("create", "done"))
                # (n/d/f may be written before the watcher has watched the new
                # n/d: then its scan reports it as created, with no write.)
                self.assertSubsequence(
                    [("create", "a"), ("write", "a"), ("chmod", "a"), ("create", "n"),
                     ("create", "n/d"), ("create", "n/d/f"),
                     ("rename", "a"), ("create", "old/b"), ("remove", "n/d/f"),
                     ("remove", "n/d"), ("remove", "n")], got)
                self.assertEqual(got.count(("create", "n/d")), 1, got)
            # close() kills it in the sandbox
            deadline = time.time() + 20
            while self.watchers(sb) and time.time() < deadline:
                time.sleep(0.05)
            self.assertEqual(self.watchers(sb), [])
            self.assertTrue(w.ended)

            # Not recursive: a subdirectory's changes are not its own; the
            # directory going away ends the iteration.
            w = sb.files.watch("/work/keep")
            sb.exec("mkdir /work/keep/sub && touch /work/keep/sub/x /work/keep/top && "
                    "rm -r /work/keep", check=True)
            evs = list(w.events(timeout=20))
            names = [(e.type, e.name) for e in evs]
            self.assertIn(("create", "sub"), names)
            self.assertIn(("create", "top"), names)
            self.assertNotIn("sub/x", [n for _, n in names])
            self.assertEqual(names[-1], ("remove", ""))
            self.assertEqual(evs[-1].path, "/work/keep")
            self.assertEqual([e.path for e in evs if e.name == "top"][0], "/work/keep/top")
            self.assertTrue(w.ended)

            with self.assertRaises(dsec.NotFound) as cm:
                sb.files.watch("/no/such")
            self.assertIn("/no/such", str(cm.exception))
            sb.files.write("/work/file", b"1")
            with self.assertRaises(NotADirectoryError):
                sb.files.watch("/work/file")
            with self.assertRaises(ValueError):
                sb.files.watch("relative")
            self.assertEqual(self.watchers(sb), [])

    def test_watch_async(self):
        async def main():
            s = await self.c.session_async(quota=1, ttl=120)
            async with s:
                sb = await s.create_one_async("py@1")
                await sb.exec_async("mkdir -p /work/a", check=True)
                async with await sb.files.watch_async("/work/a", recursive=True) as w:
                    await sb.exec_async("mkdir /work/a/d && touch /work/a/d/x", check=True)
                    got = []
                    async for ev in w.events(timeout=20):
                        got.append((ev.type, ev.name))
                        if got[-1] == ("create", "d/x"):
                            break
                    self.assertEqual(got[-1], ("create", "d/x"), got)
                self.assertTrue(w.ended)
                with self.assertRaises(dsec.NotFound):
                    await sb.files.watch_async("/no/such")
        asyncio.run(main())

    def test_watch_in_a_bare_image_and_odd_names(self):
        with self.c.session(quota=1, ttl=120) as s:
            sb = s.create("bare@1")[0]  # no shell, no coreutils
            sb.files.make_dir("/work")
            with sb.files.watch("/work") as w:
                sb.files.write("/work/name with\nnewline and \xe9", b"x")
                got = self.collect(w, ("create", "name with\nnewline and \xe9"))
                self.assertTrue(got)


class Attach(Base):
    def test_a_second_client_attaches_to_a_live_session(self):
        with self.c.session(quota=2, ttl=120, name="attach-me") as s:
            sb = s.create("py@1")[0]
            other = dsec.connect(D.address)
            try:
                for handle in (other.attach(s.id), other.session("attach-me")):
                    self.assertFalse(handle.owned)
                    self.assertEqual(handle.id, s.id)
                    self.assertIn("attached", repr(handle))
                    self.assertEqual([i.id for i in handle.list()], [sb.id])
                    r = handle.sandbox(sb.id).exec("echo from the other client")
                    self.assertEqual(r.stdout, b"from the other client\n")
                # Leaving a with block of an attached handle closes nothing.
                with other.attach(s.id) as h:
                    h.sandbox(sb.id).files.write("/tmp/x", b"1")
                self.assertEqual(sb.get("/tmp/x"), b"1")
                self.assertEqual(sb.exec("echo still").stdout, b"still\n")
                with self.assertRaises(dsec.NotFound) as cm:
                    other.attach("no-such-session")
                self.assertIn("no-such-session", str(cm.exception))
            finally:
                other.close()
            # Closing the other client left the session alone.
            self.assertEqual(sb.exec("echo alive").stdout, b"alive\n")
            mine = [x for x in self.c.sessions() if x.id == s.id]
            self.assertEqual(len(mine), 1, self.c.sessions())
            self.assertEqual((mine[0].name, mine[0].state, mine[0].owned, mine[0].trajectory,
                              mine[0].quota), ("attach-me", "live", True, True, 2))
            self.assertGreater(mine[0].log_ms, 0)
            self.assertIn("default", [x.id for x in self.c.sessions()])
        self.assertNotIn(s.id, [x.id for x in self.c.sessions() if x.state == "live"])


class Addresses(Base):
    def test_several_addresses_the_first_that_answers(self):
        # A port nobody listens on (bound, never listening), then the daemon.
        with socket.socket() as dead:
            dead.bind(("127.0.0.1", 0))
            nobody = f"127.0.0.1:{dead.getsockname()[1]}"
            for spec in ([nobody, D.address], f"{nobody}, {D.address}"):
                with dsec.connect(spec) as c:
                    self.assertEqual(c.address, f"{nobody},{D.address}")
                    with c.session(quota=1, ttl=60) as s:
                        sb = s.create(base="py@1")[0]
                        self.assertEqual(sb.exec(["echo", "through the second"]).stdout,
                                         b"through the second\n")
            with self.assertRaises(dsec.Disconnected) as cm:
                dsec.connect([nobody])
            self.assertIn(nobody, str(cm.exception))
        with self.assertRaises(ValueError):
            dsec.connect([])
        with self.assertRaises(ValueError):
            dsec.connect([D.address, "localhost"])
        with self.assertRaises(TypeError):
            dsec.connect(7070)  # type: ignore[arg-type]


class Errors(Base):
    def test_errors_map_to_their_classes_and_name_the_input(self):
        with self.assertRaises(ValueError) as cm:
            dsec.connect("localhost")
        self.assertIn("'localhost'", str(cm.exception))
        with self.assertRaises(ValueError):
            dsec.connect("127.0.0.1:99999")
        with self.assertRaises(dsec.Disconnected) as cm:
            dsec.connect("127.0.0.1:1")
        self.assertIn("127.0.0.1:1", str(cm.exception))
        self.assertEqual(cm.exception.code_name, "disconnected")
        self.assertTrue(cm.exception.retryable)

        with self.c.session(quota=2, ttl=60) as s:
            with self.assertRaises(dsec.NotFound) as cm:
                s.create(base="nope@1")
            self.assertIn("nope@1", str(cm.exception))
            self.assertEqual((cm.exception.code, cm.exception.code_name), (2, "not_found"))
            self.assertIsInstance(cm.exception, dsec.Error)
            with self.assertRaises(dsec.WrongKind) as cm:
                s.create(base="grader@1")
            self.assertIn("grader@1", str(cm.exception))
            # More than the quota could ever hold: a wrong request, not worth a retry.
            with self.assertRaises(dsec.InvalidArgument) as cm:
                s.create(base="py@1", count=3)
            self.assertIn("quota", str(cm.exception))
            self.assertIn("never fit", str(cm.exception))
            self.assertFalse(cm.exception.retryable)
            with self.assertRaises(dsec.InvalidArgument):
                s.create(base="bad name")
            with self.assertRaises(dsec.NotFound):
                s.sandbox("no-such-box").exec("true")
            # Caught in Python, naming the argument.
            for kwargs, exc, names in [
                ({"count": -1}, ValueError, "count"),
                ({"count": "3"}, TypeError, "count"),
                ({"tools": "grader@1"}, TypeError, "tools"),
                ({"ttl": -5}, ValueError, "ttl"),
                ({"memory": "lots"}, dsec.InvalidArgument, "memory"),
            ]:
                with self.assertRaises(exc, msg=kwargs) as cm:
                    s.create(base="py@1", **kwargs)
                self.assertIn(names, str(cm.exception))
            self.assertEqual(s.list(), [])
        with self.assertRaises(ValueError):
            self.c.session(quota=0)
        with self.assertRaises(dsec.NotFound):
            self.c.resume("no-such-session")

    def test_exec_argument_errors(self):
        with self.c.session(quota=1, ttl=60) as s:
            sb = s.create("py@1")[0]
            with self.assertRaises(TypeError) as cm:
                sb.exec(42)
            self.assertIn("cmd", str(cm.exception))
            with self.assertRaises(ValueError) as cm:
                sb.exec("true", timeout=-1)
            self.assertIn("timeout", str(cm.exception))
            with self.assertRaises(ValueError) as cm:
                sb.exec("true", cwd="tmp")
            self.assertIn("cwd", str(cm.exception))
            # A trusted command needs a Chronus sandbox: the daemon says so.
            with self.assertRaises(dsec.InvalidArgument) as cm:
                sb.exec("true", trusted=True)
            self.assertIn("Chronus", str(cm.exception))


class Lifecycle(Base):
    def test_sessions_and_clients_clean_up(self):
        s = self.c.session(quota=4, ttl=60, name="py-life", trajectory=False)
        self.assertTrue(s.id)
        ids = [b.id for b in s.create("py@1", count=3)]
        self.assertTrue(set(ids) <= self.live_ids())
        self.assertEqual(s.close(), 3)
        self.assertGone(ids)
        # A client that goes away takes its sessions' sandboxes with it.
        c2 = dsec.connect(D.address)
        s2 = c2.session(quota=2)
        ids = [b.id for b in s2.create("py@1", count=2)]
        self.assertTrue(set(ids) <= self.live_ids())
        c2.close()
        self.assertTrue(c2.closed)
        self.assertGone(ids)
        with self.assertRaises(dsec.Disconnected) as cm:
            s2.list()
        self.assertIn("closed", str(cm.exception))
        c2.close()  # idempotent
        st = self.c.stats()
        self.assertEqual(st.node, D.address)
        self.assertGreaterEqual(st.created, 5)
        # Every sandbox has limits: the node's defaults for what it leaves out.
        self.assertGreaterEqual(st.default_memory, 4 << 20)
        self.assertGreater(st.default_pids, 0)
        self.assertGreater(st.default_disk, 0)
        self.assertGreater(st.cgroups_reused + st.cgroups_made, 0)

    def test_close_fails_calls_in_flight(self):
        c2 = dsec.connect(D.address)
        s2 = c2.session(quota=1)
        sb = s2.create("py@1")[0]
        errors = []

        def run():
            try:
                sb.exec("sleep 60")
            except dsec.Error as e:
                errors.append(e)

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        c2.close()
        t.join(30)
        self.assertFalse(t.is_alive())
        self.assertLess(time.monotonic() - t0, 20)
        self.assertEqual(len(errors), 1)
        self.assertIsInstance(errors[0], dsec.Error)
        self.assertGone([sb.id])


class Async(Base):
    def test_200_sandboxes_from_one_thread(self):
        n = 200

        async def main():
            async with self.c.session(quota=n, ttl=120) as s:
                with self.assertRaises(dsec.NotFound) as cm:
                    await s.create_async("nope@2")
                self.assertIn("nope@2", str(cm.exception))
                threads_before = os_threads()
                t0 = time.monotonic()
                sbs = await s.create_async("py@1", count=n)
                created = time.monotonic() - t0
                self.assertEqual(len(sbs), n)
                peak = [0]

                async def one(i, sb):
                    r = await sb.exec_async(["sh", "-c", "cat; echo -n :$1", "sh", str(i)],
                                            input=f"box{i}")
                    peak[0] = max(peak[0], os_threads())
                    return r

                t0 = time.monotonic()
                results = await asyncio.gather(*(one(i, sb) for i, sb in enumerate(sbs)))
                elapsed = time.monotonic() - t0
                for i, r in enumerate(results):
                    self.assertEqual((r.exit_code, r.stdout), (0, f"box{i}:{i}".encode()))
                # No thread per call: the process's threads stay a handful.
                self.assertLess(peak[0], threads_before + 8, "threads grew with the calls")
                # Files and streams, asynchronously.
                await sbs[0].put_async("/tmp/a", b"async bytes")
                self.assertEqual(await sbs[0].get_async("/tmp/a"), b"async bytes")
                st = sbs[1].exec_stream_async("echo one; echo two >&2; exit 5")
                got = [(k, v) async for k, v in st]
                self.assertEqual(b"".join(v for k, v in got if k == "stdout"), b"one\n")
                self.assertEqual(b"".join(v for k, v in got if k == "stderr"), b"two\n")
                self.assertEqual(st.result.exit_code, 5)
                self.assertEqual(len(await s.list_async()), n)
                await asyncio.gather(*(sb.close_async() for sb in sbs[: n // 2]))
                self.assertEqual(len(await s.list_async()), n - n // 2)
                self.assertGreaterEqual((await self.c.stats_async()).live, n - n // 2)
                return created, elapsed, [sb.id for sb in sbs]

        created, elapsed, ids = asyncio.run(main())
        self.assertGone(ids)
        print(f"\n  {n} sandboxes created in {created:.2f}s, {n} concurrent execs from one "
              f"thread in {elapsed:.2f}s", end=" ... ")

    def test_a_loop_that_went_away_is_no_problem(self):
        # A call completes after its loop was closed: nothing to settle, no crash.
        s = self.c.session(quota=1)
        sb = s.create("py@1")[0]

        async def start():
            task = asyncio.ensure_future(sb.exec_async("sleep 0.3"))
            task._log_destroy_pending = False  # abandoned on purpose
            await asyncio.sleep(0)

        loop = asyncio.new_event_loop()
        loop.run_until_complete(start())
        loop.close()
        time.sleep(0.6)
        self.assertEqual(sb.exec("echo still").stdout, b"still\n")
        s.close()


class ExitsAndErrors(Base):
    """One rule for how a command ended (exit_code 128+N for a signal N, as the
    command line says), check=True, and errors that say what happened and are
    retryable only when a retry can succeed."""

    def test_killed_commands_report_128_plus_the_signal(self):
        with self.c.session(quota=1, ttl=60) as s:
            sb = s.create("py@1")[0]
            r = sb.exec("sleep 5", timeout=0.3)
            self.assertEqual((r.exit_code, r.signal, r.timed_out, r.ok), (137, 9, True, False))
            r = sb.exec("kill -9 $$")
            self.assertEqual((r.exit_code, r.signal, r.timed_out, r.ok), (137, 9, False, False))
            r = sb.exec("kill -TERM $$")
            self.assertEqual((r.exit_code, r.signal), (143, 15))
            r = sb.exec("exit 3")
            self.assertEqual((r.exit_code, r.signal, r.ok), (3, 0, False))
            self.assertTrue(sb.exec("true").ok)
            # The command line says the same (124 marks its --timeout, as timeout(1)).
            dsec_bin = os.environ["DSEC_BIN"]
            cli = subprocess.run([dsec_bin, "--connect", D.address, "exec", sb.id, "--", "sh",
                                  "-c", "kill -9 $$"], capture_output=True, timeout=60)
            self.assertEqual(cli.returncode, 137, cli.stderr)
            cli = subprocess.run([dsec_bin, "--connect", D.address, "exec", "--timeout", "300ms",
                                  sb.id, "--", "sleep", "5"], capture_output=True, timeout=60)
            self.assertEqual(cli.returncode, 124, cli.stderr)

    def test_check_raises_on_failure(self):
        with self.c.session(quota=1, ttl=60) as s:
            sb = s.create("py@1")[0]
            self.assertEqual(sb.exec("echo fine", check=True).stdout, b"fine\n")
            with self.assertRaises(dsec.CommandFailed) as cm:
                sb.exec("echo broken >&2; exit 4", check=True)
            e = cm.exception
            self.assertEqual((e.exit_code, e.result.exit_code, e.sandbox_id), (4, 4, sb.id))
            self.assertIn("exited with code 4", str(e))
            self.assertIn("broken", str(e))
            self.assertFalse(e.retryable)
            self.assertIsInstance(e, dsec.Error)
            with self.assertRaises(dsec.CommandFailed) as cm:
                sb.exec(["sleep", "5"], timeout=0.3, check=True)
            self.assertIn("timed out", str(cm.exception))
            self.assertEqual(cm.exception.exit_code, 137)

            async def main():
                with self.assertRaises(dsec.CommandFailed) as cm:
                    await sb.exec_async("kill -9 $$", check=True)
                self.assertIn("signal 9", str(cm.exception))
                return await sb.exec_async("true", check=True)

            self.assertTrue(asyncio.run(main()).ok)

    def test_errors_say_what_happened(self):
        s = self.c.session(quota=2, ttl=60)
        a, b = s.create("py@1", count=2)
        # A quota full now: back off and retry.
        with self.assertRaises(dsec.Overloaded) as cm:
            s.create("py@1")
        self.assertTrue(cm.exception.retryable)
        self.assertIn("quota", str(cm.exception))
        # A missing file: NotFound, in dsec's words, not tar's.
        for path in ("/nope", "/no/such/dir/file"):
            with self.assertRaises(dsec.NotFound) as cm:
                a.get(path)
            self.assertIn(path, str(cm.exception))
            self.assertIn("no such file or directory", str(cm.exception))
            self.assertNotIn("tar:", str(cm.exception))
        # A destroyed sandbox: Closed, saying who did it.
        b.close()
        with self.assertRaises(dsec.Closed) as cm:
            b.exec("true")
        self.assertIn("destroyed by its trainer", str(cm.exception))
        self.assertFalse(cm.exception.retryable)
        # A TTL that ran out, while a command ran and after.
        t = s.create("py@1", ttl=0.5)[0]
        with self.assertRaises(dsec.Closed) as cm:
            t.exec("sleep 30")
        self.assertIn("TTL", str(cm.exception))
        while t.id in {i.id for i in s.list()}:
            time.sleep(0.05)
        with self.assertRaises(dsec.Closed) as cm:
            t.exec("true")
        self.assertIn("reached its TTL", str(cm.exception))
        # After close: Closed, not a disconnection worth retrying.
        self.assertEqual(s.close(), 1)
        with self.assertRaises(dsec.Closed) as cm:
            a.exec("true")
        self.assertFalse(cm.exception.retryable)
        self.assertIn("closed", str(cm.exception))
        self.assertIn(s.id, str(cm.exception))
        with self.assertRaises(dsec.Closed):
            s.close()  # again (a with block's exit stays quiet)
        self.assertGone([a.id, b.id, t.id])

    def test_untrusted_chronus_says_it_is_not_trusted(self):
        with self.c.session(quota=1, ttl=60) as s:
            sb = s.create("py@1", chronus=True)[0]
            r = sb.exec("chronus stage build")
            self.assertEqual(r.exit_code, 1)
            self.assertIn(b"not trusted", r.stderr)
            self.assertIn(b"trusted=True", r.stderr)
            self.assertNotIn(b"is this a dsec sandbox", r.stderr)



GRADER = ("set -e; chronus stage build; chronus report score=0.5 tests=3; chronus log \"$(hostname)\";"
          " chronus feedback \"$(hostname)\"; chronus stage done")


class Chronus(Base):
    def test_events_and_answers_blocking(self):
        with self.c.session(quota=3, ttl=120) as s:
            sbs = s.create("py@1", count=3, chronus=True)
            results = {}

            def grade(sb):
                results[sb.id] = sb.exec(GRADER, trusted=True, timeout=60)

            threads = [threading.Thread(target=grade, args=(sb,)) for sb in sbs]
            for t in threads:
                t.start()
            seen = {sb.id: [] for sb in sbs}
            rewards = {sb.id: float(i) + 0.25 for i, sb in enumerate(sbs)}
            for ev in s.events(timeout=30):
                seen[ev.sandbox].append(ev)
                if ev.kind == "feedback":
                    self.assertEqual(ev.payload, ev.sandbox.encode())
                    self.assertEqual(ev.request_id, ev.seq)
                    ev.answer(reward=rewards[ev.sandbox], text=f"for {ev.sandbox}", done=True)
                if all(len(v) == 5 for v in seen.values()):
                    break
            for t in threads:
                t.join(60)
            for sb in sbs:
                evs = seen[sb.id]
                self.assertEqual([e.kind for e in evs],
                                 ["stage", "report", "log", "feedback", "stage"])
                self.assertEqual([e.seq for e in evs], [1, 2, 3, 4, 5])
                self.assertEqual(evs[0].stage, "build")
                self.assertEqual(evs[1].metrics, {"score": 0.5, "tests": 3.0})
                self.assertEqual(evs[2].log, sb.id)
                self.assertEqual(evs[4].stage, "done")
                r = results[sb.id]
                self.assertEqual(r.exit_code, 0, r.stderr)
                self.assertIn(f'"reward":{rewards[sb.id]:g}'.encode(), r.stdout)
                self.assertIn(f'"text":"for {sb.id}"'.encode(), r.stdout)
                self.assertIn(b'"done":true', r.stdout)
            # An answer nobody waits for, and a non-feedback event.
            with self.assertRaises(dsec.NotFound):
                s.answer(sbs[0].id, 4, reward=1.0)
            with self.assertRaises(ValueError):
                seen[sbs[0].id][0].answer(reward=1)
            with self.assertRaises(ValueError):
                s.answer(sbs[0].id, 4, reward=float("nan"))
            # Nothing more comes: the iteration ends after its timeout.
            t0 = time.monotonic()
            self.assertEqual(list(s.events(timeout=0.3)), [])
            self.assertLess(time.monotonic() - t0, 5)

    def test_events_and_answers_async(self):
        async def main():
            async with self.c.session(quota=20, ttl=120) as s:
                sbs = await s.create_async("py@1", count=20, chronus=True)
                events = s.events_async(timeout=30)
                runs = [asyncio.ensure_future(sb.exec_async(GRADER, trusted=True, timeout=60))
                        for sb in sbs]
                answered = 0
                async for ev in events:
                    if ev.kind == "feedback":
                        await ev.answer_async(reward=1.0, done=True)
                        answered += 1
                        if answered == len(sbs):
                            break
                await events.aclose()
                results = await asyncio.gather(*runs)
                self.assertEqual(answered, len(sbs))
                for r in results:
                    self.assertEqual(r.exit_code, 0, r.stderr)
                    self.assertIn(b'"reward":1', r.stdout)
                self.assertGreaterEqual((await self.c.stats_async()).chronus_answered, len(sbs))

        asyncio.run(main())

    def test_a_pristine_grader_runs_the_layers_own_sh_over_the_agents_files(self):
        with self.c.session(quota=1, ttl=120) as s:
            sb = s.create("py@1", chronus=True)[0]
            # The agent writes its answer and replaces /bin/sh with a wrapper.
            r = sb.exec(["/bin/busybox", "sh", "-c",
                         "echo 42 > /tmp/answer; cp /bin/busybox /tmp/busybox; rm /bin/sh;"
                         " echo '#!/tmp/busybox sh' > /bin/sh; echo 'echo wrapped >> /tmp/log' >> /bin/sh;"
                         " echo 'exec /tmp/busybox sh \"$@\"' >> /bin/sh; chmod 755 /bin/sh"])
            self.assertEqual(r.exit_code, 0, r.stderr)
            g = sb.exec("cat /.dsec/agent/tmp/answer; echo no > /.dsec/agent/tmp/answer"
                        " || echo read-only; chronus stage graded",
                        trusted=True, pristine=True, timeout=60)
            self.assertEqual(g.exit_code, 0, g.stderr)
            self.assertEqual(g.stdout, b"42\nread-only\n")
            self.assertEqual(sb.exec(["/tmp/busybox", "cat", "/tmp/answer", "/tmp/log"]).stdout,
                             b"42\n")  # untouched, and the wrapper never ran
            ev = next(s.events(timeout=30))
            self.assertEqual((ev.kind, ev.text), ("stage", "graded"))
            with self.assertRaises(ValueError) as cm:
                sb.exec("true", pristine=True)
            self.assertIn("trusted", str(cm.exception))


class ExposedPorts(Base):
    """Port exposure (docs/network.md): a server in a sandbox answers the
    trainer through a port of the node (loopback only)."""

    @staticmethod
    def fetch(address):
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as c:
            c.sendall(b"GET / HTTP/1.0\r\n\r\n")
            got = b""
            while True:
                chunk = c.recv(65536)
                if not chunk:
                    break
                got += chunk
        return got.split(b"\r\n\r\n", 1)[-1]

    def serve(self, sb, port, body):
        sb.exec(f"mkdir -p /srv && echo {body} > /srv/index.html && "
                f"/bin/busybox httpd -p 127.0.0.1:{port} -h /srv", check=True)

    def test_expose_at_create_and_later(self):
        with self.c.session(quota=3) as s:
            a = s.create_one("py@1", net=True, expose=[8080])
            self.serve(a, 8080, "from-a")
            ports = a.ports()
            self.assertEqual(list(ports), [8080])
            self.assertTrue(ports[8080].startswith("127.0.0.1:"))
            self.assertEqual(self.fetch(ports[8080]), b"from-a\n")
            info = {i.id: i for i in s.list()}[a.id]
            self.assertEqual([(p.port, p.address) for p in info.exposed], [(8080, ports[8080])])
            # Later, on another sandbox, the same inner port: another port of the node.
            b = s.create_one("py@1", net=True)
            self.serve(b, 8080, "from-b")
            at = b.expose(8080)
            self.assertNotEqual(at, ports[8080])
            self.assertEqual(self.fetch(at), b"from-b\n")
            # The node counts them (node stats' exposed_*).
            st = self.c.stats()
            self.assertGreaterEqual(st.exposed_ports, 2)
            self.assertGreaterEqual(st.exposed_connections, 2)
            self.assertIsInstance(st.exposed_refused, int)
            self.assertEqual(st.exposed_idle_closed, 0)
            # Refusals name what is wrong.
            with self.assertRaises(dsec.AlreadyExists):
                b.expose(8080)
            with self.assertRaises(ValueError):
                b.expose(0)
            with self.assertRaises(TypeError):
                b.expose("8080")
            none = s.create_one("py@1")
            with self.assertRaises(dsec.InvalidArgument) as cm:
                none.expose(8080)
            self.assertIn("network none", str(cm.exception))
            none.close()
            with self.assertRaises(dsec.InvalidArgument):
                s.create("py@1", expose=[8080])
            # Gone with its sandbox.
            a.close()
            host, port = ports[8080].rsplit(":", 1)
            with self.assertRaises(ConnectionRefusedError):
                socket.create_connection((host, int(port)), timeout=30).close()
            self.assertEqual(self.fetch(at), b"from-b\n")

    def test_expose_async(self):
        async def main():
            async with self.c.session(quota=1) as s:
                sb = await s.create_one_async("py@1", net=True)
                self.serve(sb, 9000, "async")
                at = await sb.expose_async(9000)
                self.assertEqual(self.fetch(at), b"async\n")
        asyncio.run(main())


class Conveniences(Base):
    """create_one() and async with, as E2B's and Modal's users expect them."""

    def live_in(self, s):
        return {i.id for i in s.list()}

    def test_set_ttl_extends_and_shortens_a_sandboxs_life(self):
        with self.c.session(quota=2, ttl=60) as s:
            # Created to live 1 s, given an hour: the first timer, when it
            # fires, no longer counts; it is alive well after it.
            keep = s.create_one("py@1", ttl=1)
            left = keep.set_ttl(3600)
            self.assertGreater(left, 3500)
            self.assertLessEqual(left, 3600)
            info = {i.id: i for i in s.list()}[keep.id]
            self.assertGreater(info.ttl_left_ms, 3_500_000)
            time.sleep(1.5)
            self.assertEqual(keep.exec("echo alive").stdout, b"alive\n")
            # Shortened: it goes by itself and says so.
            short = s.create_one("py@1")
            self.assertAlmostEqual(short.set_ttl(1), 1.0, delta=0.01)
            while short.id in self.live_in(s):
                time.sleep(0.05)
            with self.assertRaises(dsec.Closed) as cm:
                short.exec("true")
            self.assertIn("reached its TTL of 1.0 s", str(cm.exception))
            # Bad values are named before anything is sent, or by the session.
            with self.assertRaises(ValueError):
                keep.set_ttl(0)
            with self.assertRaises(dsec.InvalidArgument) as cm:
                keep.set_ttl(0.5)
            self.assertIn("out of range", str(cm.exception))
            with self.assertRaises(dsec.InvalidArgument):
                keep.set_ttl(31 * 24 * 3600)
            with self.assertRaises(dsec.Closed):
                short.set_ttl(10)
            with self.assertRaises(dsec.NotFound):
                s.sandbox("nosuch000000").set_ttl(10)

    def test_set_ttl_async(self):
        async def main():
            async with self.c.session(quota=1, ttl=60) as s:
                sb = await s.create_one_async("py@1", ttl=1)
                left = await sb.set_ttl_async(120)
                self.assertGreater(left, 100)
                await asyncio.sleep(1.5)
                self.assertTrue((await sb.exec_async("true")).ok)
        asyncio.run(main())

    def test_call_runs_in_a_fresh_sandbox_from_a_warm_pool(self):
        # (The pool's 2 count against the quota of 4.)
        with self.c.session(quota=4, ttl=60, trajectory=False) as s:
            self.assertEqual(s.pool("py@1", size=2), 2)
            seen = set()
            for _ in range(3):
                r = s.call("test ! -e /tmp/mark || echo STALE; echo x > /tmp/mark; hostname",
                           base="py@1")
                self.assertTrue(r.ok, r)
                self.assertNotIn(b"STALE", r.stdout)
                seen.add(r.stdout)
            self.assertEqual(len(seen), 3)  # never reused
            self.assertEqual(s.call("exit 3", base="py@1").exit_code, 3)
            self.assertEqual(s.call("kill -9 $$", base="py@1").exit_code, 128 + 9)
            self.assertEqual(s.list(), [])  # every call's sandbox is gone
            with self.assertRaises(dsec.NotFound):
                s.call("true", base="nope@1")
            self.assertEqual(s.pool("py@1", size=0), 0)

    def test_create_one_returns_the_sandbox_or_raises(self):
        with self.c.session(quota=2, ttl=120) as s:
            sb = s.create_one("py@1", workdir="task@1", key="episode-1", tags={"task": "17"})
            self.assertIsInstance(sb, dsec.Sandbox)
            self.assertNotIsInstance(sb, list)
            self.assertEqual(sb.key, "episode-1")
            self.assertEqual(sb.exec(["cat", "/work/README"]).stdout, b"task 17\n")
            found = s.find("episode-1")
            self.assertEqual(found, sb)
            self.assertEqual(found.info.tags, {"task": "17"})
            other = s.create_one("py@1")
            self.assertTrue(other.key.startswith("#"), other.key)
            self.assertNotEqual(other, sb)
            # What keeps the sandbox from being made is raised, never an empty result.
            with self.assertRaises(dsec.Overloaded) as cm:
                s.create_one("py@1")  # the quota is full now
            self.assertIn("quota", str(cm.exception))
            other.close()
            with self.assertRaises(dsec.NotFound) as cm:
                s.create_one("nope@1")
            self.assertIn("nope@1", str(cm.exception))
            with self.assertRaises(dsec.AlreadyExists):
                s.create_one("py@1", key="episode-1")  # one live create per key
            with self.assertRaises(TypeError):
                s.create_one("py@1", count=1)  # no count: it is one
            self.assertEqual(self.live_in(s), {sb.id})

            async def main():
                with self.assertRaises(dsec.NotFound):
                    await s.create_one_async("nope@1")
                a = await s.create_one_async("py@1", key="episode-2")
                self.assertIsInstance(a, dsec.Sandbox)
                self.assertEqual(a.key, "episode-2")
                self.assertEqual((await a.exec_async("echo hi")).stdout, b"hi\n")
                with self.assertRaises(dsec.Overloaded):
                    await s.create_one_async("py@1")
                return a

            a = asyncio.run(main())
            self.assertEqual(self.live_in(s), {sb.id, a.id})
        self.assertGone([sb.id, a.id])

    def test_a_batch_of_one_with_only_a_failure_raises_it(self):
        # The daemon raises a create of one's failure itself; _one() keeps that
        # promise for a Batch that came back empty with a failure all the same.
        s = self.c.session(quota=1, ttl=60)
        self.addCleanup(s.close)
        err = dsec.SandboxFailed("sandbox x: init died", code=43, code_name="sandbox_failed")
        with self.assertRaises(dsec.SandboxFailed) as cm:
            dsec._one(dsec.Batch([], [err], "k"))
        self.assertIs(cm.exception, err)
        with self.assertRaises(dsec.SandboxFailed):
            dsec._one(dsec.Batch([], [], "k"))
        sb = dsec.Sandbox(s, "sb-1", "k")
        self.assertIs(dsec._one(dsec.Batch([sb], [], "k")), sb)

    def test_async_with_closes_sandboxes_sessions_and_clients(self):
        ids = []

        async def main():
            async with dsec.connect(D.address) as c:
                async with await c.session_async(quota=3, ttl=120) as s:
                    async with await s.create_one_async("py@1") as sb:
                        ids.append(sb.id)
                        self.assertEqual((await sb.exec_async("echo in")).stdout, b"in\n")
                    # Gone once the block is left (close_async awaited the destroy).
                    self.assertNotIn(sb.id, {i.id for i in await s.list_async()})
                    with self.assertRaises(dsec.Closed):
                        await sb.exec_async("true")
                    # A sandbox closed inside its block, or left by an exception:
                    # the exit stays quiet, the exception goes on.
                    async with await s.create_one_async("py@1") as sb2:
                        ids.append(sb2.id)
                        await sb2.close_async()
                    with self.assertRaises(ZeroDivisionError):
                        async with (await s.create_async("py@1"))[0] as sb3:
                            ids.append(sb3.id)
                            1 / 0
                    self.assertEqual(await s.list_async(), [])
                    kept = await s.create_one_async("py@1")
                    ids.append(kept.id)
                # The session's exit closed it, and its last sandbox.
                with self.assertRaises(dsec.Closed):
                    await s.list_async()
                self.assertNotIn(kept.id, {i.id for i in await c.list_async()})
            self.assertTrue(c.closed)

        asyncio.run(main())
        self.assertEqual(len(ids), 4)
        self.assertGone(ids)



class Usage(Base):
    """stats() and top(): what a sandbox uses and its processes, read by its node."""

    def test_stats_and_top(self):
        with self.c.session(quota=2, ttl=120, name="py-usage") as s:
            sb = s.create_one("py@1", memory="64M", pids=50, disk="16M")
            r = sb.exec("dd if=/dev/zero of=/big bs=1M count=4 2>/dev/null; touch /f1 /f2; "
                        "sleep 1000 >/dev/null 2>&1 &")
            self.assertEqual(r.exit_code, 0, r.stderr)
            st = sb.stats()
            self.assertIsInstance(st, dsec.SandboxUsage)
            self.assertEqual(st.id, sb.id)
            u = st.usage
            self.assertEqual(u.memory_limit, 64 << 20)
            self.assertGreaterEqual(u.memory_bytes, 4 << 20, repr(u))  # tmpfs pages
            self.assertEqual(u.tasks_limit, 50)
            self.assertGreaterEqual(u.processes, 2, repr(u))  # init and the sleep
            self.assertGreaterEqual(u.disk_bytes, 4 << 20, repr(u))
            self.assertEqual(u.disk_limit, 16 << 20)
            self.assertGreaterEqual(u.inodes, 3, repr(u))
            self.assertFalse(st.egress)
            self.assertEqual(st.processes, [])  # only top() asks for them
            # what the sandbox writes shows in the next sample
            sb.exec("dd if=/dev/zero of=/big2 bs=1M count=3 2>/dev/null")
            self.assertGreaterEqual(sb.stats().usage.disk_bytes, u.disk_bytes + (3 << 20))

            procs = sb.top()
            self.assertTrue(all(isinstance(p, dsec.SandboxProcess) for p in procs))
            self.assertEqual([p.pid for p in procs], sorted(p.pid for p in procs))
            self.assertEqual((procs[0].pid, procs[0].ppid), (1, 0))
            sleeps = [p for p in procs if p.command == "sleep 1000"]
            self.assertEqual(len(sleeps), 1, [p.command for p in procs])
            self.assertGreater(sleeps[0].pid, 1)
            self.assertIn(sleeps[0].state, ("S", "R"))
            self.assertGreater(sleeps[0].rss_bytes, 0)

            async def both():
                return await sb.stats_async(), await sb.top_async()
            ast, aprocs = asyncio.run(both())
            self.assertEqual(ast.id, sb.id)
            self.assertIn("sleep 1000", [p.command for p in aprocs])

            sb.close()
            with self.assertRaises(dsec.NotFound) as cm:
                sb.stats()
            self.assertIn(sb.id, str(cm.exception))

class Operating(Base):
    """cordon, drain and uncordon a node (docs/cluster.md)."""

    def test_cordon_drain_uncordon(self):
        node = self.c.stats().node
        with self.c.session(quota=4) as s:
            sb = s.create_one("py@1")
            self.addCleanup(self.c.uncordon, node)
            self.assertGreaterEqual(self.c.cordon(node), 1)
            self.assertTrue(self.c.stats().cordoned)
            with self.assertRaises(dsec.Overloaded) as cm:
                s.create_one("py@1")
            self.assertIn("cordoned", str(cm.exception))
            self.assertEqual(sb.exec("echo on").stdout, b"on\n")  # its own go on
            with self.assertRaises(dsec.Timeout) as cm:
                self.c.drain(node, timeout=0.2)
            self.assertIn("still has", str(cm.exception))
            sb.close()
            self.assertGone([sb.id])
            self.assertEqual(self.c.drain(node, timeout=30), 0)
            self.assertEqual(self.c.uncordon(node), 0)
            self.assertFalse(self.c.stats().cordoned)
            s.create_one("py@1").close()
        with self.assertRaises(dsec.NotFound):
            self.c.cordon("127.0.0.1:1")

if __name__ == "__main__":
    unittest.main()

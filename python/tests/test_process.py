"""Process handles (issues 20, 23) against a real dsecd (tests/daemon.py):
sb.exec(..., background=True) and its asyncio twin, stdin fed and closed,
signals, output by callback and by iteration, and cancelling an awaited exec
stopping the command in the sandbox."""

import asyncio
import signal
import threading
import time
import unittest

import dsec

from daemon import Daemon, eventually

D = None


def setUpModule():
    global D
    D = Daemon()


def tearDownModule():
    global D
    d, D = D, None
    if d is not None:
        d.stop_clean()


def running(c, sb_id):
    for i in c.list():
        if i.id == sb_id:
            return i.running
    return 0


class Background(unittest.TestCase):
    def setUp(self):
        self.c = dsec.connect(D.address)
        self.addCleanup(self.c.close)

    def test_stdin_is_fed_and_closed_and_the_end_waited_for(self):
        with self.c.session(quota=2, ttl=120) as s:
            sb = s.create("py@1")[0]
            p = sb.exec(["wc", "-c"], background=True)
            self.assertIsInstance(p, dsec.Process)
            self.assertGreater(p.pid, 0)
            self.assertFalse(p.done)
            p.send_stdin(b"hello ")
            p.send_stdin("world")
            p.send_stdin(b"x" * (1 << 20))  # beyond the daemon's buffer: in pieces
            p.close_stdin()
            r = p.wait()
            self.assertTrue(p.done)
            self.assertEqual((r.exit_code, r.stdout.strip()), (0, str(11 + (1 << 20)).encode()))
            with self.assertRaises(dsec.Closed):
                p.send_stdin(b"late")
            # stdin=False: its stdin is `input` and then its end.
            q = sb.exec(["cat"], background=True, stdin=False, input=b"given")
            self.assertEqual(q.wait().stdout, b"given")

    def test_kill_sends_the_signal_and_check_applies_at_wait(self):
        with self.c.session(quota=2, ttl=120) as s:
            sb = s.create("py@1")[0]
            seen = []
            ready = threading.Event()

            def on_output(stream, chunk):
                seen.append((stream, chunk))
                if b"ready" in chunk:
                    ready.set()
            p = sb.exec("trap 'echo got-term; exit 3' TERM; echo ready; "
                        "while :; do sleep 0.1; done", background=True, stdin=False,
                        on_output=on_output, check=True)
            self.assertTrue(ready.wait(60))
            p.kill(signal.SIGTERM)
            with self.assertRaises(dsec.CommandFailed) as cm:
                p.wait()
            self.assertEqual(cm.exception.result.exit_code, 3)
            out = b"".join(c for st, c in seen if st == "stdout")
            self.assertTrue(out.startswith(b"ready\n"), out)
            self.assertIn(b"got-term\n", out)
            # The default: SIGKILL, 128+9.
            q = sb.exec(["sleep", "1000"], background=True, stdin=False)
            q.kill()
            r = q.wait()
            self.assertEqual((r.exit_code, r.signal), (137, 9))
            with self.assertRaises(dsec.NotFound):
                q.kill()

    def test_output_by_iteration(self):
        with self.c.session(quota=2, ttl=120) as s:
            sb = s.create("py@1")[0]
            p = sb.exec("while read l; do echo got-$l; echo e-$l >&2; done", background=True,
                        stream=True)
            p.send_stdin(b"a\nb\n")
            p.close_stdin()
            out, err = b"", b""
            for stream, chunk in p:
                if stream == "stdout":
                    out += chunk
                else:
                    err += chunk
            self.assertEqual((out, err), (b"got-a\ngot-b\n", b"e-a\ne-b\n"))
            self.assertEqual(p.wait().stdout, b"")  # streamed, not collected

    def test_cancel_stops_the_command(self):
        with self.c.session(quota=2, ttl=120) as s:
            sb = s.create("py@1")[0]
            p = sb.exec(["sleep", "1000"], background=True, stdin=False)
            p.pid
            self.assertEqual(running(self.c, sb.id), 1)
            p.cancel()
            with self.assertRaises(dsec.Closed):
                p.wait()
            self.assertTrue(eventually(lambda: running(self.c, sb.id) == 0))


class AsyncBackground(unittest.TestCase):
    def setUp(self):
        self.c = dsec.connect(D.address)
        self.addCleanup(self.c.close)

    def test_async_handle_stdin_iteration_and_wait(self):
        async def main():
            s = await self.c.session_async(quota=2, ttl=120)
            try:
                sb = (await s.create_async("py@1"))[0]
                p = await sb.exec_async("while read l; do echo got-$l; done", background=True,
                                        stream=True)
                await p.send_stdin_async(b"one\ntwo\n")
                await p.close_stdin_async()
                out = b""
                async for stream, chunk in p:
                    self.assertEqual(stream, "stdout")
                    out += chunk
                self.assertEqual(out, b"got-one\ngot-two\n")
                r = await p.wait_async()
                self.assertEqual(r.exit_code, 0)
                q = await sb.exec_async(["sleep", "1000"], background=True, stdin=False)
                await q.kill_async(signal.SIGTERM)
                r = await q.wait_async()
                self.assertEqual((r.exit_code, r.signal), (128 + 15, 15))
            finally:
                await s.close_async()
        asyncio.run(main())

    def test_cancelling_an_awaited_exec_stops_the_command(self):
        async def main():
            s = await self.c.session_async(quota=2, ttl=120)
            try:
                sb = (await s.create_async("py@1"))[0]
                task = asyncio.ensure_future(sb.exec_async(["sleep", "1000"]))
                # Wait until it runs in the sandbox (polled, not timed).
                for _ in range(1200):
                    if await asyncio.to_thread(running, self.c, sb.id) == 1:
                        break
                    await asyncio.sleep(0.05)
                self.assertEqual(running(self.c, sb.id), 1)
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                ok = await asyncio.to_thread(eventually, lambda: running(self.c, sb.id) == 0)
                self.assertTrue(ok, "the cancelled command still runs in the sandbox")
                # The sandbox serves on.
                r = await sb.exec_async("echo still")
                self.assertEqual(r.stdout, b"still\n")
            finally:
                await s.close_async()
        asyncio.run(main())


class Terminals(unittest.TestCase):
    """exec(..., pty=...): a terminal of the sandbox (issue 23)."""

    def setUp(self):
        self.c = dsec.connect(D.address)
        self.addCleanup(self.c.close)

    def test_a_command_on_a_terminal_sees_one_of_the_size_asked(self):
        with self.c.session(quota=1, ttl=120) as s:
            sb = s.create("py@1")[0]
            r = sb.exec("busybox tty; [ -t 0 ] && [ -t 2 ] && echo ttys; busybox stty size; "
                        "echo TERM=$TERM; exit 3", pty=(31, 97))
            self.assertEqual(r.exit_code, 3)
            self.assertEqual(r.stderr, b"")
            self.assertIn(b"/dev/pts/", r.stdout)
            self.assertIn(b"ttys\r\n31 97\r\nTERM=xterm-256color\r\n", r.stdout)
            self.assertIn(b"24 80\r\n", sb.exec("busybox stty size", pty=True).stdout)
            self.assertEqual(sb.exec("[ -t 0 ] || echo none").stdout, b"none\n")
            with self.assertRaises(TypeError):
                sb.exec("true", pty="yes")  # type: ignore[arg-type]
            with self.assertRaises(ValueError):
                sb.exec("true", pty=(0, 80))

    def test_resize_stdin_and_ctrl_c_in_the_background(self):
        with self.c.session(quota=1, ttl=120) as s:
            sb = s.create("py@1")[0]
            seen = []
            lock = threading.Lock()

            def on_output(stream, chunk):
                with lock:
                    seen.append((stream, chunk))

            def text():
                with lock:
                    return b"".join(c for _, c in seen)

            p = sb.exec("trap 'busybox stty size; echo winched' WINCH; trap 'echo int; exit 6' "
                        "INT; read -r x; echo got=$x; while :; do sleep 0.05; done",
                        background=True, pty=(20, 50), on_output=on_output)
            p.send_stdin(b"hello\n")
            self.assertTrue(eventually(lambda: b"got=hello\r\n" in text()), text())
            p.resize(44, 120)
            self.assertTrue(eventually(lambda: b"44 120\r\nwinched" in text()), text())
            p.send_stdin(b"\x03")  # ^C: SIGINT to its foreground process group
            r = p.wait()
            self.assertEqual(r.exit_code, 6, text())
            self.assertIn(b"int\r\n", text())
            self.assertTrue(all(stream == "stdout" for stream, _ in seen), seen)
            # A command without a terminal cannot be resized.
            q = sb.exec(["sleep", "100"], background=True)
            with self.assertRaises(dsec.InvalidArgument):
                q.resize(10, 10)
            q.kill()
            self.assertEqual(q.wait().signal, signal.SIGKILL)

    def test_close_stdin_types_eof(self):
        with self.c.session(quota=1, ttl=120) as s:
            sb = s.create("py@1")[0]
            p = sb.exec(["cat"], background=True, pty=True)
            p.send_stdin("line\n")
            p.close_stdin()
            r = p.wait()
            self.assertEqual((r.exit_code, r.stdout), (0, b"line\r\nline\r\n"))


if __name__ == "__main__":
    unittest.main()

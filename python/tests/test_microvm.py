"""The Python SDK on the microvm backend (issue 22): s.create(..., backend=
"microvm") boots a QEMU microVM (under TCG here) with the same layers, and the
SDK's calls work on it as on a container: exec (status, env, input, user by
name), files, a background process with stdin, and its end leaves no QEMU.

Skipped when this machine cannot have a guest (no qemu, or tools/microvm-guest
fails): the guest is built as the C++ microvm suites build it, into the build
tree's cache ($DSEC_MICROVM_CACHE)."""

import os
import subprocess
import unittest

import dsec

from daemon import Daemon, eventually


def _guest():
    script = os.environ.get("DSEC_MICROVM_SCRIPT")
    agent = os.environ.get("DSEC_GUEST_AGENT")
    cache = os.environ.get("DSEC_MICROVM_CACHE")
    if not (script and agent and cache) or not os.access("/usr/bin/qemu-system-x86_64", os.X_OK):
        return None, "no qemu-system-x86_64, or DSEC_MICROVM_* unset"
    r = subprocess.run([script, "--guest", agent, "--cache", cache], capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        return None, "tools/microvm-guest failed: " + r.stderr.strip()[-300:]
    return r.stdout.strip(), ""


GUEST, WHY = _guest()
D = None


def setUpModule():
    global D
    if GUEST:
        D = Daemon(args=["--microvm-slots", "2", "--microvm-guest", GUEST])


def tearDownModule():
    global D
    d, D = D, None
    if d is not None:
        d.stop_clean()


def qemu_children(pid):
    """QEMU processes whose parent is `pid` (dsecd's VM workers fork them)."""
    n = 0
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        rp = stat.rfind(")")
        if "(qemu-system" in stat and int(stat[rp + 2:].split()[1]) == pid:
            n += 1
    return n


@unittest.skipUnless(GUEST, f"needs a microVM guest: {WHY}")
class MicroVM(unittest.TestCase):
    def setUp(self):
        self.c = dsec.connect(D.address)
        self.addCleanup(self.c.close)

    def test_a_microvm_sandbox_through_the_sdk(self):
        with self.c.session(quota=1, ttl=300) as s:
            sb = s.create("py@1", tools=["grader@1"], backend="microvm", memory="128M")[0]
            self.assertEqual(qemu_children(D.proc.pid), 1)
            # Its own kernel: the guest's, not the host's.
            r = sb.exec("uname -r")
            self.assertEqual(r.exit_code, 0)
            self.assertNotEqual(r.stdout.decode().strip(), os.uname().release)
            r = sb.exec("echo $FOO; exit 3", env={"FOO": "a b"})
            self.assertEqual((r.exit_code, r.stdout), (3, b"a b\n"))
            r = sb.exec(["wc", "-c"], input=b"x" * 100000)
            self.assertEqual(r.stdout.strip(), b"100000")
            r = sb.exec("/opt/grader/grade.sh")
            self.assertEqual(r.stdout, b"graded\n")
            # A user by name: the image's passwd (read on the host) gives the ids.
            r = sb.exec("id -u; id -g; echo $HOME $USER", user="user")
            self.assertEqual(r.stdout, b"1000\n1000\n/home/user user\n")
            with self.assertRaises(dsec.InvalidArgument) as e:
                sb.exec("true", user="nobody-here")
            self.assertIn("nobody-here", str(e.exception))
            r = sb.exec("sleep 30", timeout=0.5)
            self.assertTrue(r.timed_out)
            # Files both ways.
            sb.put("/tmp/in.txt", b"into the VM\n")
            self.assertEqual(sb.exec("cat /tmp/in.txt").stdout, b"into the VM\n")
            sb.exec("echo out of the VM > /tmp/out.txt")
            self.assertEqual(sb.get("/tmp/out.txt"), b"out of the VM\n")
            with self.assertRaises(dsec.NotFound):
                sb.get("/tmp/none")
            # A background process: stdin fed and closed, its end waited for.
            p = sb.exec(["wc", "-c"], background=True)
            p.send_stdin(b"hello ")
            p.send_stdin(b"x" * (1 << 20))
            p.close_stdin()
            r = p.wait()
            self.assertEqual(r.stdout.strip(), str(6 + (1 << 20)).encode())
            info = [i for i in self.c.list() if i.id == sb.id]
            self.assertEqual(len(info), 1)
            sb.close()
        self.assertTrue(eventually(lambda: qemu_children(D.proc.pid) == 0))

    def test_a_warm_pool_of_microvms(self):
        with self.c.session(quota=2, ttl=300) as s:
            self.assertEqual(s.pool("py@1", size=1, backend="microvm", memory="128M"), 1)
            # Booted before any create asks for it.
            self.assertTrue(eventually(lambda: qemu_children(D.proc.pid) == 1, cap=240))
            self.assertEqual(s.list(), [])  # nobody's yet
            sb = s.create("py@1", backend="microvm", memory="128M")[0]
            r = sb.exec("hostname")
            self.assertEqual(r.stdout.decode().strip(), sb.id)
            self.assertEqual([i.id for i in s.list()], [sb.id])
            # The pool boots another: the claimed one and the new one.
            self.assertTrue(eventually(lambda: qemu_children(D.proc.pid) == 2, cap=240))
            sb.close()
        # The session's end takes its pool's microVM too.
        self.assertTrue(eventually(lambda: qemu_children(D.proc.pid) == 0))


if __name__ == "__main__":
    unittest.main()

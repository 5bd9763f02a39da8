"""Snapshots (issue 16) against a real dsecd (tests/daemon.py): Sandbox.pause()
and resume() (commands refused with dsec.Paused meanwhile), Session.pause()
and resume() for all, Sandbox.snapshot() and Session.create(snapshot=...),
and Sandbox.fork(n)."""

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


class Snapshots(unittest.TestCase):
    def setUp(self):
        self.c = dsec.connect(D.address)
        self.addCleanup(self.c.close)

    def state(self, s, sb):
        return {i.id: i.state for i in s.list()}[sb.id]

    def test_pause_refuses_commands_until_resume(self):
        with self.c.session(quota=8, ttl=120) as s:
            sb = s.create_one(base="py@1")
            self.assertTrue(sb.pause())
            self.assertFalse(sb.pause())
            self.assertEqual(self.state(s, sb), "paused")
            with self.assertRaises(dsec.Paused) as cm:
                sb.exec("true")
            self.assertEqual(cm.exception.code_name, "paused")
            self.assertTrue(sb.resume())
            self.assertEqual(sb.exec("echo back").stdout, b"back\n")
            self.assertEqual(len(s.create(base="py@1", count=2)), 2)
            self.assertEqual(s.pause(), 3)
            self.assertEqual(s.resume(), 3)

    def test_snapshot_then_create_from_it_and_fork(self):
        ref = "py-snap-%d@1" % int(time.time() * 1000)
        with self.c.session(quota=16, ttl=120) as s:
            sb = s.create_one(base="py@1", workdir="task@1")
            sb.exec("echo kept > /work/new; rm /work/README")
            digest = sb.snapshot(ref)
            self.assertTrue(digest.startswith("sha256:"))
            copy = s.create(snapshot=ref)[0]
            self.assertEqual(copy.exec("cat /work/new").stdout, b"kept\n")
            self.assertNotEqual(copy.exec("cat /work/README").exit_code, 0)
            forks = sb.fork(3)
            self.assertEqual(len(forks), 3)
            for f in forks:
                self.assertEqual(f.exec("cat /work/new").stdout, b"kept\n")
            forks[0].exec("echo mine > /work/new")
            self.assertEqual(forks[1].exec("cat /work/new").stdout, b"kept\n")
            self.assertEqual(sb.exec("cat /work/new").stdout, b"kept\n")


if __name__ == "__main__":
    unittest.main()

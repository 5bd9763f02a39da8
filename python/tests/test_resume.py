"""Resume against a real dsecd (tests/daemon.py): a session with a trajectory
log loses its trainer (a process killed with SIGKILL) or its daemon (dsecd
killed with SIGKILL, a new one started on the same state dir); a new trainer
resumes it, issues its creates and steps again from the start, gets the logged
results of the steps done, and carries on from the state the sandboxes had,
with no non-idempotent command run twice, or half.

The trainer and its steps are in resume_trainer.py: counted steps append a
line to /work/runs and print how many lines it has, so a command run again
(or a cut-off one whose effect stayed) shows in the counts.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

import dsec

import resume_trainer as T
from daemon import Daemon

D = None
HERE = os.path.dirname(os.path.abspath(__file__))
BOXES = 4


def setUpModule():
    global D
    D = Daemon()


def tearDownModule():
    global D
    d, D = D, None
    if d is not None:
        d.stop_clean()


def log_dir(sid):
    return os.path.join(D.state, "trajectories", sid)


def resume(c, sid, wait=30):
    """Resumes `sid`; while the daemon still closes it (the trainer's death is
    being noticed), it is in use: try again."""
    deadline = time.time() + wait
    while True:
        try:
            return c.resume(sid)
        except dsec.InUse:
            if time.time() > deadline:
                raise
            time.sleep(0.05)


class Resume(unittest.TestCase):
    def connect(self):
        c = dsec.connect(D.address)
        self.addCleanup(c.close)
        return c

    def states(self, s, ids):
        """The sandboxes' states as their session lists them ("replaying":
        not rebuilt yet, so not on the node)."""
        infos = {i.id: i for i in s.list()}
        return [infos[i].state if i in infos else "absent" for i in ids]

    def assertGone(self, c, ids):
        deadline = time.time() + 30
        while time.time() < deadline and {i.id for i in c.list()} & set(ids):
            time.sleep(0.05)
        self.assertFalse({i.id for i in c.list()} & set(ids), "sandboxes left on the node")

    def replay_and_finish(self, c, sid, ids, first):
        """The second trainer: resumes `sid`, goes over every step again and
        checks what it gets. `first`: the results the first trainer got, in
        order (its steps done)."""
        t0 = time.monotonic()
        s = resume(c, sid)
        t_resumed = time.monotonic() - t0
        self.assertEqual(s.id, sid)
        # Live now: it cannot be resumed twice.
        with self.assertRaises(dsec.InUse) as cm:
            c.resume(sid)
        self.assertIn(sid, str(cm.exception))
        sbs = s.create(count=BOXES, key=T.KEY, **T.ENV)
        self.assertEqual([b.id for b in sbs], ids, "the same create gets the same sandboxes")
        self.assertEqual(sbs.key, T.KEY)
        self.assertEqual([b.key for b in sbs], [f"{T.KEY}#{i}" for i in range(BOXES)])
        self.assertEqual(sbs.failures, [])
        self.assertEqual(self.states(s, ids), ["replaying"] * BOXES)
        done = [0] * BOXES  # steps of each box the log answered
        for n, (step, i) in enumerate(T.order(BOXES)):
            got = T.STEPS[step](sbs[i], i)
            if n < len(first):
                # Logged: the very result the first trainer got, timing included.
                self.assertEqual(got, first[n], f"step {step} of box {i}")
                done[i] += 1
                self.assertEqual(self.states(s, [ids[i]]), ["replaying"],
                                 f"box {i} was rebuilt at a logged step")
            if T.EXPECTED_OUT[step] is not None:
                self.assertEqual((got["exit"], got["out"]), (0, T.EXPECTED_OUT[step](i)),
                                 f"step {step} of box {i} (logged: {n < len(first)})")
        # Past the log: every box was rebuilt, and each counted command ran
        # exactly once (the one cut off by the kill left nothing).
        self.assertEqual(self.states(s, ids), ["ready"] * BOXES)
        for i, sb in enumerate(sbs):
            r = sb.exec("cat /work/runs /work/input.txt /cache/w")
            self.assertEqual(r.stdout.decode(), T.FINAL_RUNS + T._input(i) + "warm\n",
                             f"box {i}")
        self.assertTrue(os.path.exists(os.path.join(log_dir(sid), "log")))
        self.assertEqual(s.close(), BOXES)
        self.assertGone(c, ids)
        self.assertFalse(os.path.exists(log_dir(sid)), "a closed session's log stays")
        with self.assertRaises(dsec.NotFound) as cm:
            c.resume(sid)
        self.assertIn(sid, str(cm.exception))
        return t_resumed, done

    def test_trainer_killed_mid_rollout(self):
        k = 10  # of 24 steps: boxes 0 and 1 cut after 3 steps, 2 and 3 after 2
        p = subprocess.Popen([sys.executable, os.path.join(HERE, "resume_trainer.py"),
                              D.address, "--sandboxes", str(BOXES), "--stop-after", str(k)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        watchdog = threading.Timer(60, p.kill)
        watchdog.start()
        self.addCleanup(watchdog.cancel)
        sid, ids, first, stalled = None, None, [], None
        try:
            for line in p.stdout:
                msg = json.loads(line)
                if "session" in msg:
                    sid = msg["session"]
                elif "sandboxes" in msg:
                    ids = msg["sandboxes"]
                elif "n" in msg:
                    self.assertEqual(msg["n"], len(first) + 1)
                    first.append(msg["result"])
                elif "stalled" in msg:
                    stalled = msg
                    break
        finally:
            # Killed (by its pid) mid-command: the stalled one runs in a sandbox.
            t_kill = time.monotonic()
            p.send_signal(signal.SIGKILL)
            p.wait(30)
            err = p.stderr.read()
            p.stdout.close()
            p.stderr.close()
        self.assertIsNotNone(stalled, f"the trainer did not get to step {k}: {err}")
        self.assertEqual(p.returncode, -signal.SIGKILL)
        self.assertEqual(len(first), k)
        self.assertEqual(len(ids), BOXES)
        c = self.connect()
        # The session closes when the daemon notices the trainer is gone; its
        # log stays for the resume.
        self.assertGone(c, ids)
        self.assertTrue(os.path.exists(os.path.join(log_dir(sid), "log")))
        t_resumed, done = self.replay_and_finish(c, sid, ids, first)
        self.assertEqual(done, [3, 3, 2, 2])
        print(f"\n  trainer killed; gone after {time.monotonic() - t_kill:.2f}s, "
              f"resumed in {t_resumed:.2f}s", end=" ... ")

    def test_daemon_killed_mid_rollout(self):
        k = 13  # box 0 cut after 4 steps, the others after 3
        c1 = dsec.connect(D.address)
        try:
            s = c1.session(quota=T.QUOTA, ttl=T.TTL, name="resume-daemon", trajectory=True)
            sid = s.id
            sbs = s.create(count=BOXES, key=T.KEY, **T.ENV)
            ids = [b.id for b in sbs]
            first = []
            for n, (step, i) in enumerate(T.order(BOXES)):
                if n == k:
                    break
                first.append(T.STEPS[step](sbs[i], i))
            # A command in flight when dsecd dies.
            stalled = sbs[k % BOXES]
            errors = []

            def cut():
                try:
                    stalled.exec(T.STALL, timeout=120)
                except dsec.Error as e:
                    errors.append(e)

            t = threading.Thread(target=cut)
            t.start()
            deadline = time.time() + 30
            while time.time() < deadline and not any(
                    x.id == stalled.id and x.running > 0 for x in c1.list()):
                time.sleep(0.02)
            status, out = D.kill(signal.SIGKILL)
            self.assertEqual(status, -signal.SIGKILL, out)
            t.join(30)
            self.assertFalse(t.is_alive())
            self.assertEqual(len(errors), 1)
            self.assertIsInstance(errors[0], dsec.Disconnected)
            with self.assertRaises(dsec.Disconnected):
                sbs[0].exec("true")
        finally:
            c1.close()
        self.assertTrue(os.path.exists(os.path.join(log_dir(sid), "log")))
        t0 = time.monotonic()
        D.restart()  # the same state dir: it collects what the first one left
        t_restart = time.monotonic() - t0
        c = self.connect()
        # Nothing of the old daemon's sandboxes is live: the resume rebuilds them.
        self.assertEqual([i for i in c.list() if i.id in ids], [])
        t_resumed, done = self.replay_and_finish(c, sid, ids, first)
        self.assertEqual(done, [4, 3, 3, 3])
        print(f"\n  dsecd restarted in {t_restart:.2f}s, resumed in {t_resumed:.2f}s",
              end=" ... ")

    def test_a_put_given_again_later_is_answered_from_the_log(self):
        # The same put in another second (another mtime in the archive): the
        # resumed session recognises it by its files, and the rebuilt sandbox
        # has the first put's time.
        c1 = dsec.connect(D.address)
        s = c1.session(quota=1, ttl=60, trajectory=True)
        sid = s.id
        sb = s.create("py@1", key="a")[0]
        t0 = int(time.time())
        sb.put("/work/a.txt", b"same bytes\n")
        t1 = int(time.time())
        sb.put("/work/b.txt", b"stamped\n", mtime=1234567890)
        c1.close()  # the trainer goes; its log stays
        time.sleep(1.1)
        c = self.connect()
        s = resume(c, sid)
        sb = s.create("py@1", key="a")[0]
        sb.put("/work/a.txt", b"same bytes\n")
        sb.put("/work/b.txt", b"stamped\n", mtime=1234567890)
        self.assertEqual(self.states(s, [sb.id]), ["replaying"])
        r = sb.exec("stat -c %Y /work/a.txt /work/b.txt; cat /work/a.txt")
        a_time, b_time, text = r.stdout.decode().split("\n", 2)
        self.assertTrue(t0 <= int(a_time) <= t1, r.stdout)
        self.assertEqual(b_time, "1234567890")
        self.assertEqual(text, "same bytes\n")
        with self.assertRaises(ValueError):
            sb.put("/work/c.txt", b"", mtime=-1)
        with self.assertRaises(TypeError):
            sb.put("/work/c.txt", b"", mtime="now")
        s.close()

    def test_what_cannot_be_resumed(self):
        c = self.connect()
        with self.assertRaises(dsec.NotFound) as cm:
            c.resume("s-nosuchsession")
        self.assertIn("s-nosuchsession", str(cm.exception))
        with self.assertRaises(dsec.InvalidArgument) as cm:
            c.resume("../etc")
        self.assertIn("../etc", str(cm.exception))
        with self.assertRaises(ValueError):
            c.resume("")
        # Live: its trainer is using it.
        s = c.session(quota=2, ttl=60, trajectory=True)
        sb = s.create("py@1")[0]
        sb.exec("echo x >> /tmp/runs")
        self.assertTrue(os.path.exists(log_dir(s.id)))
        c2 = self.connect()
        with self.assertRaises(dsec.InUse) as cm:
            c2.resume(s.id)
        self.assertIn(s.id, str(cm.exception))
        # Closed by its trainer: the run is over, its log is gone.
        self.assertEqual(s.close(), 1)
        self.assertFalse(os.path.exists(log_dir(s.id)))
        with self.assertRaises(dsec.NotFound) as cm:
            c2.resume(s.id)
        self.assertIn(s.id, str(cm.exception))
        # Without a log: nothing to resume from.
        s = c.session(quota=1, ttl=60, trajectory=False)
        s.create("py@1")[0].exec("true")
        self.assertFalse(os.path.exists(log_dir(s.id)))
        s.close()
        with self.assertRaises(dsec.NotFound) as cm:
            c2.resume(s.id)
        self.assertIn(s.id, str(cm.exception))
        # A trainer that dies keeps its log (also without a command logged).
        c3 = dsec.connect(D.address)
        s3 = c3.session(quota=1, ttl=60, trajectory=True)
        sid = s3.id
        c3.close()  # the client goes: its sessions close, but not by their trainer
        s = resume(c2, sid)
        self.assertEqual(s.create("py@1", count=0), [])
        s.close()
        self.assertFalse(os.path.exists(log_dir(sid)))

    def test_a_streamed_output_beyond_what_the_log_keeps(self):
        # The trainer gets all of a streamed output; the log keeps max_output
        # (16 MiB) of each stream, and a replay from it says it is truncated.
        n = 17 << 20
        big = f"yes 2>/dev/null | head -c {n}"
        c1 = dsec.connect(D.address)
        try:
            s = c1.session(quota=1, ttl=60, trajectory=True)
            sid = s.id
            sb = s.create("py@1", key="big")[0]
            st = sb.exec_stream(big)
            got = sum(len(chunk) for stream, chunk in st if stream == "stdout")
            self.assertEqual(got, n)
            self.assertFalse(st.result.truncated)
            self.assertEqual(st.result.exit_code, 0)
        finally:
            c1.close()
        c = self.connect()
        s = resume(c, sid)
        try:
            sb = s.create("py@1", key="big")[0]
            st = sb.exec_stream(big)
            self.assertEqual(sum(len(chunk) for stream, chunk in st if stream == "stdout"),
                             16 << 20)
            self.assertTrue(st.result.truncated)
            self.assertEqual(self.states(s, [sb.id]), ["replaying"])
        finally:
            s.close()

    def test_background_commands_after_a_resume(self):
        # A background command whose stdin was closed at its start is
        # answered from the log: its handle has id 0 and the logged end. One
        # whose stdin the trainer fed after it started cannot be known to be
        # the logged one: it runs again, on the sandbox as it was before it,
        # with the new input (never the logged output).
        c1 = dsec.connect(D.address)
        try:
            s = c1.session(quota=1, ttl=60, trajectory=True)
            sid = s.id
            sb = s.create("py@1", key="bg")[0]
            p = sb.exec("echo from-the-log; echo err >&2", background=True, stdin=False)
            self.assertGreater(p.pid, 0)
            self.assertEqual(p.wait().stdout, b"from-the-log\n")
            fed = sb.exec(["sh", "-c", "cat >> /tmp/fed; cat /tmp/fed"], background=True,
                          idempotent=True)
            fed.send_stdin(b"first\n")
            fed.close_stdin()
            self.assertEqual(fed.wait().stdout, b"first\n")
        finally:
            c1.close()
        c = self.connect()
        s = resume(c, sid)
        try:
            sb = s.create("py@1", key="bg")[0]
            p = sb.exec("echo from-the-log; echo err >&2", background=True, stdin=False)
            self.assertEqual(p.pid, 0)  # it does not run
            r = p.wait()
            self.assertEqual((r.stdout, r.stderr, r.exit_code), (b"from-the-log\n", b"err\n", 0))
            self.assertEqual(self.states(s, [sb.id]), ["replaying"])
            with self.assertRaises(dsec.Closed):
                p.send_stdin(b"x")
            streamed = []
            q = sb.exec(["sh", "-c", "cat >> /tmp/fed; cat /tmp/fed"], background=True,
                        idempotent=True, on_output=lambda st, b: streamed.append(b))
            self.assertGreater(q.pid, 0)
            self.assertEqual(self.states(s, [sb.id]), ["running"])  # rebuilt: it runs
            q.send_stdin(b"second\n")
            q.close_stdin()
            self.assertEqual(q.wait().exit_code, 0)
            # The state before it: /tmp/fed did not have "first" yet.
            self.assertEqual(b"".join(streamed), b"second\n")
        finally:
            s.close()


import episode_trainer as E

EPISODES, CONCURRENCY, STOP_AFTER = 24, 8, 10


class Episodes(unittest.TestCase):
    """The preemption cases of a trainer with one sandbox per episode, creates
    made concurrently under a semaphore (episode_trainer.py): killed with
    episodes in flight, then resumed. No episode gets another's sandbox, the
    closed ones resume to their logged results, and the graders' Chronus
    events come again (replayed) to the event handler."""

    def trainer(self, *extra):
        p = subprocess.Popen([sys.executable, os.path.join(HERE, "episode_trainer.py"),
                              D.address, "--episodes", str(EPISODES), "--concurrency",
                              str(CONCURRENCY), *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        watchdog = threading.Timer(240, p.kill)
        watchdog.start()
        self.addCleanup(watchdog.cancel)
        return p

    def read(self, p, until):
        msgs = []
        for line in p.stdout:
            msgs.append(json.loads(line))
            if until in msgs[-1]:
                break
        return msgs

    def end(self, p):
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait(60)
        err = p.stderr.read()
        p.stdout.close()
        p.stderr.close()
        return err

    def first_run(self):
        p = self.trainer("--stop-after", str(STOP_AFTER))
        try:
            first = self.read(p, "stopping")
        except BaseException:
            self.end(p)
            raise
        self.assertIn("stopping", first[-1], f"the trainer stopped early: {first}")
        return p, first

    def resumed_run(self, sid):
        p = self.trainer("--resume", sid)
        try:
            second = self.read(p, "finished")
        finally:
            err = self.end(p)
        self.assertIn("finished", second[-1], f"the resumed trainer failed: {second} {err}")
        return second

    def check(self, first, second):
        created1 = {m["created"]: m["sandbox"] for m in first if "created" in m}
        done1 = {m["episode"]: m for m in first if "episode" in m}
        done2 = {m["episode"]: m for m in second if "episode" in m}
        self.assertGreaterEqual(len(done1), STOP_AFTER)
        self.assertLess(len(created1), EPISODES, "nothing was left for the resume")
        self.assertEqual(sorted(done2), list(range(EPISODES)))
        for i, m in done2.items():
            self.assertEqual(m["key"], f"ep-{i}")
            # Its own sandbox, its agent run once in the sandbox's history.
            self.assertEqual(m["agent"], E.expected_agent(i), f"episode {i}")
            self.assertEqual((m["agent_exit"], m["grade_exit"]), (0, 0),
                             f"episode {i}: {m}; its events then: "
                             f"{[x for x in first if x.get('sandbox') == m['sandbox']]}"
                             f" and now: {[x for x in second if x.get('sandbox') == m['sandbox']]}")
            self.assertEqual(json.loads(m["grade"])["reward"], float(i), f"episode {i}")
            if i in created1:
                self.assertEqual(m["sandbox"], created1[i], f"episode {i} got another sandbox")
            if i in done1:
                # Closed before the crash: its logged results, timing included.
                self.assertEqual(m, done1[i], f"episode {i}")
        self.assertEqual(len({m["sandbox"] for m in done2.values()}), EPISODES)
        # The handler saw one feedback request per episode; those of the
        # episodes graded before the crash came again from the log, with the
        # answer it gave then.
        fb2 = [m for m in second if "feedback" in m]
        self.assertEqual(sorted(m["feedback"] for m in fb2), list(range(EPISODES)))
        for m in fb2:
            i = m["feedback"]
            self.assertEqual(m["sandbox"], done2[i]["sandbox"])
            if i in done1:
                self.assertTrue(m["replayed"], f"episode {i}")
                self.assertEqual(m["logged_reward"], float(i), f"episode {i}")
            if not m["replayed"]:
                self.assertIsNone(m["logged_reward"])
        return [m["sandbox"] for m in done2.values()]

    def assertGone(self, ids):
        c = dsec.connect(D.address)
        try:
            deadline = time.time() + 30
            while time.time() < deadline and {i.id for i in c.list()} & set(ids):
                time.sleep(0.05)
            self.assertFalse({i.id for i in c.list()} & set(ids), "sandboxes left on the node")
        finally:
            c.close()

    def test_trainer_killed_with_episodes_in_flight(self):
        p, first = self.first_run()
        sid = first[0]["session"]
        self.end(p)  # SIGKILL, by its pid, with episodes in flight
        second = self.resumed_run(sid)
        self.assertEqual(second[0]["session"], sid)
        ids = self.check(first, second)
        self.assertGone(ids)
        self.assertFalse(os.path.exists(log_dir(sid)), "a closed session's log stays")

    def test_daemon_killed_with_episodes_in_flight(self):
        p, first = self.first_run()
        sid = first[0]["session"]
        try:
            status, out = D.kill(signal.SIGKILL)
            self.assertEqual(status, -signal.SIGKILL, out)
        finally:
            self.end(p)
        D.restart()  # the same state dir
        second = self.resumed_run(sid)
        ids = self.check(first, second)
        self.assertGone(ids)


class Keys(unittest.TestCase):
    def connect(self):
        c = dsec.connect(D.address)
        self.addCleanup(c.close)
        return c

    def test_keys_tags_and_what_a_resumed_create_gets(self):
        c1 = dsec.connect(D.address)
        s = c1.session(quota=5, ttl=60, trajectory=True)
        sid = s.id
        a = s.create("py@1", key="alpha", tags={"episode": "1", "split": "train"})
        self.assertEqual((a.key, a[0].key), ("alpha", "alpha"))
        anon = s.create("py@1")
        self.assertTrue(anon.key.startswith("#"), anon.key)
        pair = s.create("py@1", count=2, key="pair")
        self.assertEqual(sorted(b.key for b in pair), ["pair#0", "pair#1"])
        self.assertEqual(s.find("alpha").id, a[0].id)
        self.assertEqual(s.find("alpha").info.tags, {"episode": "1", "split": "train"})
        self.assertEqual(s.find(pair[1].key).id, pair[1].id)
        self.assertIsNone(s.find("nobody"))
        self.assertEqual({i.id: i.key for i in s.list()},
                         {a[0].id: "alpha", anon[0].id: anon.key, pair[0].id: pair[0].key,
                          pair[1].id: pair[1].key})
        # One live create per key; '#' is dsec's own.
        with self.assertRaises(dsec.AlreadyExists) as cm:
            s.create("py@1", key="alpha")
        self.assertIn("alpha", str(cm.exception))
        self.assertIn(a[0].id, str(cm.exception))
        with self.assertRaises(dsec.InvalidArgument):
            s.create("py@1", key="a#1")
        with self.assertRaises(TypeError):
            s.create("py@1", key="k", tags={"n": 1})
        self.assertEqual(a[0].exec("echo one > /tmp/f; cat /tmp/f").stdout, b"one\n")
        # The command line's run takes a key and tags too.
        cli = subprocess.run([os.environ["DSEC_BIN"], "--connect", D.address, "run", "--detach",
                              "--session", sid, "--key", "cli", "--tag", "from=cli",
                              "--idempotent", "--base", "py@1", "--", "sleep", "300"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(cli.returncode, 0, cli.stderr)
        found = s.find("cli")
        self.assertEqual(found.id, cli.stdout.strip())
        self.assertEqual(found.info.tags, {"from": "cli"})
        found.close()
        a[0].close()
        with self.assertRaises(dsec.Closed) as cm:
            s.find("alpha")
        self.assertIn("destroyed", str(cm.exception))
        c1.close()  # the trainer goes; the log stays

        c = self.connect()
        s = resume(c, sid)
        # Another environment under a logged key: refused, saying what differs.
        with self.assertRaises(dsec.InvalidArgument) as cm:
            s.create("py@1", key="pair", count=2, memory="64m")
        self.assertIn("memory", str(cm.exception))
        # In any order: each key its own sandboxes.
        pair2 = s.create("py@1", count=2, key="pair")
        self.assertEqual([(b.id, b.key) for b in pair2], [(b.id, b.key) for b in pair])
        # Without a key: fresh, never another's.
        fresh = s.create("py@1")
        self.assertNotIn(fresh[0].id, {anon[0].id, a[0].id, pair[0].id, pair[1].id})
        # The auto key, passed back, gets its create's sandbox.
        self.assertEqual(s.create("py@1", key=anon.key)[0].id, anon[0].id)
        # Closed before the crash: its steps answer from the log, the rest is Closed.
        a2 = s.create("py@1", key="alpha")
        self.assertEqual(a2[0].id, a[0].id)
        self.assertEqual({i.id: i.state for i in s.list()}[a[0].id], "closed")
        self.assertEqual(a2[0].exec("echo one > /tmp/f; cat /tmp/f").stdout, b"one\n")
        with self.assertRaises(dsec.Closed) as cm:
            a2[0].exec("cat /tmp/f")
        self.assertFalse(cm.exception.retryable)
        self.assertIn("closed before session", str(cm.exception))
        self.assertIsInstance(cm.exception, dsec.NotFound)
        a2[0].close()  # as it was: no error
        self.assertEqual(s.close(), 1)  # the fresh one; the others were never rebuilt



class Reconnect(unittest.TestCase):
    """The client reconnects by itself (docs/cluster.md, "When the coordinator
    dies"): a call while its daemon is gone raises Disconnected (retryable);
    once a daemon is back on the same address the same Session works again."""

    def test_a_session_goes_on_after_its_daemon_comes_back_on_its_port(self):
        d = Daemon()
        self.addCleanup(d.stop)
        c = dsec.connect(d.address)
        self.addCleanup(c.close)
        s = c.session(quota=4, name="py-reconnect")
        sb = s.create("py@1")[0]
        self.assertEqual(sb.exec("echo hi").stdout, b"hi\n")
        d.kill()
        with self.assertRaises(dsec.Disconnected) as cm:
            sb.exec("true")
        self.assertTrue(cm.exception.retryable)
        d.restart(same_port=True)
        # A single daemon's sandboxes died with it (a cluster's nodes keep
        # theirs): the session comes back under its id, empty, and serves.
        deadline = time.time() + 60
        while True:
            try:
                again = s.create("py@1")[0]
                break
            except dsec.Disconnected:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        self.assertEqual(again.exec("echo back").stdout, b"back\n")
        self.assertIn(s.id, [x.id for x in c.sessions() if x.state == "live"])
        self.assertEqual(s.close(), 1)


if __name__ == "__main__":
    unittest.main()

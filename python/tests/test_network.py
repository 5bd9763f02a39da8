"""Egress networking from the SDK (docs/network.md): network=dsec.Egress(...)
and Sandbox.set_network(), against a real dsecd whose uplink is a veth into a
network namespace this module makes (the test's "internet": busybox httpd on
198.18.0.2:8000 and 198.18.0.3:8000, dnsmasq on 198.18.0.2:53 answering
allowed.test and denied.test). No packet leaves the machine: sandboxes get
addresses of 198.19.1.0/24 and reach only that namespace. Skipped unless root
with ip, busybox and dnsmasq.
"""
import os
import shutil
import subprocess
import tempfile
import time
import unittest

import dsec
from daemon import Daemon, eventually

IP = shutil.which("ip") or "/usr/sbin/ip"
DNSMASQ = "/usr/sbin/dnsmasq"
RESOLVER = "198.19.1.1"  # the first address of --sandbox-net 198.19.1.0/24

D = None
NET = None


def _have_tools():
    return (os.geteuid() == 0 and os.access(IP, os.X_OK) and os.access("/bin/busybox", os.X_OK)
            and os.access(DNSMASQ, os.X_OK))


def _sh(*argv):
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")


class Internet:
    """The netns, its veth (the node's uplink) and its servers; close()
    removes them all (the servers are this process's children, killed by pid)."""

    def __init__(self):
        self.tag = str(os.getpid())
        self.ns = "dsec-pyinet-" + self.tag
        self.uplink = "dtp" + self.tag  # never a dsecd prefix (dx....)
        self.procs = []
        self.www = tempfile.mkdtemp(prefix="dsec-pyinet-www-")
        self._sweep()
        try:
            with open(os.path.join(self.www, "index.html"), "w") as f:
                f.write("hello from the test internet\n")
            _sh(IP, "netns", "add", self.ns)
            _sh(IP, "link", "add", self.uplink, "type", "veth", "peer", "name", "inet0",
                "netns", self.ns)
            _sh(IP, "addr", "add", "198.18.0.1/24", "dev", self.uplink)
            _sh(IP, "link", "set", self.uplink, "up")
            for a in ("198.18.0.2/24", "198.18.0.3/24"):
                _sh(IP, "-n", self.ns, "addr", "add", a, "dev", "inet0")
            _sh(IP, "-n", self.ns, "link", "set", "inet0", "up")
            _sh(IP, "-n", self.ns, "link", "set", "lo", "up")
            for at in ("198.18.0.2:8000", "198.18.0.3:8000"):
                self._spawn("/bin/busybox", "httpd", "-f", "-p", at, "-h", self.www)
            self._spawn(DNSMASQ, "--keep-in-foreground", "--no-resolv", "--no-hosts",
                        "--bind-interfaces", "--listen-address=198.18.0.2", "--port=53",
                        "--local-ttl=60", "--pid-file=", "--user=root",
                        "--address=/allowed.test/198.18.0.3",
                        "--address=/denied.test/198.18.0.2")
            self._wait_up()
        except BaseException:
            self.close()
            raise

    def _spawn(self, *argv):
        self.procs.append(subprocess.Popen([IP, "netns", "exec", self.ns] + list(argv),
                                           stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL))

    def _wait_up(self):
        deadline = time.time() + 20
        while True:
            dns = subprocess.run(["/bin/busybox", "nslookup", "allowed.test", "198.18.0.2"],
                                 capture_output=True, text=True, timeout=10)
            web = [subprocess.run(["/bin/busybox", "timeout", "3", "/bin/busybox", "wget", "-q",
                                   "-O", "-", f"http://{a}:8000/"], capture_output=True,
                                  timeout=10)
                   for a in ("198.18.0.2", "198.18.0.3")]
            if "198.18.0.3" in dns.stdout and all(w.returncode == 0 for w in web):
                return
            if time.time() > deadline:
                raise RuntimeError(f"the test internet did not come up: {dns.stdout!r}")
            time.sleep(0.1)

    def _sweep(self):
        # What killed runs of this module left (their pid is in the names).
        r = subprocess.run([IP, "netns", "list"], capture_output=True, text=True, timeout=30)
        for line in r.stdout.splitlines():
            name = line.split(" ", 1)[0]
            if not name.startswith("dsec-pyinet-"):
                continue
            pid = name[len("dsec-pyinet-"):]
            if pid != self.tag and pid.isdigit() and os.path.exists(f"/proc/{pid}"):
                continue  # a live run's
            pids = subprocess.run([IP, "netns", "pids", name], capture_output=True, text=True,
                                  timeout=30).stdout.split()
            for p in pids:
                try:
                    os.kill(int(p), 9)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run([IP, "netns", "del", name], capture_output=True, timeout=30)
            subprocess.run([IP, "link", "del", "dtp" + pid], capture_output=True, timeout=30)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
        self.procs = []
        subprocess.run([IP, "netns", "del", self.ns], capture_output=True, timeout=30)
        subprocess.run([IP, "link", "del", self.uplink], capture_output=True, timeout=30)
        shutil.rmtree(self.www, ignore_errors=True)


def setUpModule():
    global D, NET
    if not _have_tools():
        raise unittest.SkipTest("needs root, ip, busybox and dnsmasq")
    NET = Internet()
    try:
        D = Daemon(args=["--uplink", NET.uplink, "--sandbox-net", "198.19.1.0/24",
                         "--dns-upstream", "198.18.0.2:53"])
    except BaseException:
        NET.close()
        NET = None
        raise


def tearDownModule():
    global D, NET
    d, D = D, None
    net, NET = NET, None
    try:
        if d is not None:
            d.stop_clean()
    finally:
        if net is not None:
            net.close()


def fetch(sb, host):
    """What `wget http://HOST:8000/` in the sandbox got: the page, or None
    when the connection was refused by the policy (dropped: wget times out)."""
    # (busybox 1.35's wget -T crashes: timeout(1) bounds a dropped connect.)
    r = sb.exec(["timeout", "3", "wget", "-q", "-O", "-", f"http://{host}:8000/"], timeout=20)
    return r.stdout.decode() if r.exit_code == 0 else None


async def afetch(sb, host):
    r = await sb.exec_async(["timeout", "3", "wget", "-q", "-O", "-", f"http://{host}:8000/"],
                            timeout=20)
    return r.stdout.decode() if r.exit_code == 0 else None


class Egress(unittest.TestCase):
    def setUp(self):
        self.c = dsec.connect(D.address)
        self.s = self.c.session(quota=4, ttl=120)

    def tearDown(self):
        self.s.close()
        self.c.close()

    def test_a_cidr_policy_and_its_live_change(self):
        sb = self.s.create_one("py@1", network=dsec.Egress(allow=["198.18.0.3:8000"]))
        self.assertEqual(fetch(sb, "198.18.0.3"), "hello from the test internet\n")
        self.assertIsNone(fetch(sb, "198.18.0.2"))
        # The new policy holds for new connections at once; the old rule goes.
        sb.set_network(allow=["198.18.0.2/32"])
        self.assertEqual(fetch(sb, "198.18.0.2"), "hello from the test internet\n")
        self.assertIsNone(fetch(sb, "198.18.0.3"))
        # A deny rule wins over an allow rule that covers it.
        sb.set_network(allow=["198.18.0.0/24"], deny=["198.18.0.2"])
        self.assertIsNone(fetch(sb, "198.18.0.2"))
        self.assertEqual(fetch(sb, "198.18.0.3"), "hello from the test internet\n")

    def test_counters_and_denied_events(self):
        sb = self.s.create_one("py@1", network=dsec.Egress(allow=["198.18.0.3:8000"]))
        self.assertEqual(fetch(sb, "198.18.0.3"), "hello from the test internet\n")
        self.assertIsNone(fetch(sb, "198.18.0.2"))
        # The denied destination comes as an event of the session, once.
        seen = []
        for ev in self.s.events(timeout=5):
            if ev.kind == "denied" and ev.sandbox == sb.id:
                seen.append(ev.text)
                break
        self.assertEqual(seen, ["tcp 198.18.0.2:8000"])
        # And the node counts what the sandbox did.
        mine = [t for t in self.c.stats().egress_by_sandbox if t.sandbox == sb.id]
        self.assertEqual(len(mine), 1)
        self.assertIsInstance(mine[0], dsec.EgressTraffic)
        self.assertEqual(mine[0].connections, 1)
        self.assertGreater(mine[0].received_bytes, 0)
        self.assertGreater(mine[0].denied, 0)

    def test_a_call_with_egress(self):
        got = self.s.call(["timeout", "3", "wget", "-q", "-O", "-", "http://198.18.0.3:8000/"],
                          base="py@1", network=dsec.Egress(allow=["198.18.0.3"]), timeout=20)
        self.assertEqual((got.exit_code, got.stdout), (0, b"hello from the test internet\n"))
        denied = self.s.call(["timeout", "3", "wget", "-q", "-O", "-",
                              "http://198.18.0.2:8000/"],
                             base="py@1", network=dsec.Egress(allow=["198.18.0.3"]), timeout=20)
        self.assertNotEqual(denied.exit_code, 0)

    def test_a_warm_pool_of_egress_sandboxes(self):
        policy = dsec.Egress(allow=["198.18.0.3"])
        with self.c.session(quota=2, ttl=120, trajectory=False) as s:
            # (Earlier tests' sandboxes may still be detaching.)
            self.assertTrue(eventually(lambda: self.c.stats().egress_sandboxes == 0))
            self.assertEqual(s.pool("py@1", size=1, network=policy), 1)
            # The pooled sandbox is made, attached to the uplink, before any create.
            self.assertTrue(eventually(lambda: self.c.stats().egress_sandboxes == 1))
            r = s.call(["timeout", "3", "wget", "-q", "-O", "-", "http://198.18.0.3:8000/"],
                       base="py@1", network=policy, timeout=20)
            self.assertEqual((r.exit_code, r.stdout), (0, b"hello from the test internet\n"))
            r = s.call(["timeout", "3", "wget", "-q", "-O", "-", "http://198.18.0.2:8000/"],
                       base="py@1", network=policy, timeout=20)
            self.assertNotEqual(r.exit_code, 0)
            self.assertEqual(s.pool("py@1", size=0, network=policy), 0)
            self.assertTrue(eventually(lambda: self.c.stats().egress_sandboxes == 0))

    def test_domains_through_the_nodes_resolver(self):
        sb = self.s.create_one("py@1", network=dsec.Egress(allow=["allowed.test"]))
        conf = sb.exec(["cat", "/etc/resolv.conf"]).stdout.decode()
        self.assertEqual(conf, f"nameserver {RESOLVER}\n")
        self.assertEqual(fetch(sb, "allowed.test"), "hello from the test internet\n")
        denied = sb.exec(["nslookup", "denied.test"], timeout=20)
        self.assertNotEqual(denied.exit_code, 0)
        self.assertIn(b"REFUSED", denied.stdout + denied.stderr)
        self.assertIsNone(fetch(sb, "198.18.0.2"))

    def test_network_names_and_loopback(self):
        # "egress" with no rule: out through the uplink, everything denied.
        sb = self.s.create_one("py@1", network="egress")
        self.assertIsNone(fetch(sb, "198.18.0.3"))
        ip = sb.exec(["cat", "/proc/net/route"]).stdout.decode()
        self.assertIn("eth0", ip)
        # "loopback" (net=True): no way out at all, not even a route.
        lo = self.s.create_one("py@1", network="loopback")
        self.assertNotIn("eth0", lo.exec(["cat", "/proc/net/route"]).stdout.decode())
        # A sandbox without egress has no policy to change.
        with self.assertRaises(dsec.InvalidArgument):
            lo.set_network(allow=["198.18.0.3"])

    def test_bad_network_arguments_are_named(self):
        with self.assertRaises(dsec.InvalidArgument) as e:
            self.s.create_one("py@1", network=dsec.Egress(allow=["not a rule!"]))
        self.assertIn("not a rule!", str(e.exception))
        with self.assertRaises(TypeError):
            dsec.Egress(allow="198.18.0.3")  # a str, not a list of rules
        with self.assertRaises(ValueError):
            self.s.create_one("py@1", network="wide")
        with self.assertRaises(ValueError):
            self.s.create_one("py@1", net=True, network="none")
        with self.assertRaises(TypeError):
            self.s.create_one("py@1", network=["198.18.0.3"])
        self.assertEqual(dsec.Egress(allow=["a.test"]), dsec.Egress(allow=("a.test",)))


class EgressAsync(unittest.IsolatedAsyncioTestCase):
    async def test_set_network_async(self):
        c = dsec.connect(D.address)
        try:
            s = c.session(quota=1, ttl=120)
            try:
                sb = await s.create_one_async("py@1", network=dsec.Egress(allow=["198.18.0.2"]))
                self.assertIsNone(await afetch(sb, "198.18.0.3"))
                await sb.set_network_async(allow=["198.18.0.3"])
                self.assertEqual(await afetch(sb, "198.18.0.3"), "hello from the test internet\n")
            finally:
                s.close()
        finally:
            c.close()


if __name__ == "__main__":
    unittest.main()

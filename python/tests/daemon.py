"""A real dsecd for the tests, with its own state dir and layers.

    d = Daemon()          # builds the layers, starts dsecd on a free port
    d.address             # "127.0.0.1:PORT"
    d.stop()              # SIGTERM; returns (exit status, stdout); removes the dir

    d.kill()              # SIGKILL (by its pid), as a crash: returns (exit status, stdout);
                          # the state dir stays
    d.restart()           # a new dsecd on the same state dir (a new port: d.address)
    d.restart(same_port=True)  # ... on the port it had (a client reconnects by itself)

    Daemon(tls=True)      # dsecd --tls d.tls (certificates from tools/tls-certs,
                          # $DSEC_TLS_CERTS); d.other_tls: another CA's
    Daemon(layers=False)  # no layers: for tests that create no sandbox
    Daemon(args=[...])    # more dsecd arguments (e.g. --uplink IFACE for egress)

Layers, built with the real `dsec layer build` ($DSEC_BIN) from busybox-static:
  py@1     base     /bin/busybox and its applets (sh, tar, cat, ...), /etc/passwd
  task@1   workdir  /work/README, /work/Makefile
  grader@1 tool     /opt/grader/grade.sh
  bare@1   base     /etc/passwd only: no shell, no tar, no coreutils (Sandbox.files)

Cleanup in every outcome: stop() kills dsecd by its pid with SIGTERM (every
sandbox destroyed) and removes the temporary directory. If the test process
dies without calling it, dsecd gets SIGTERM from the kernel (PR_SET_PDEATHSIG)
and a small janitor process, which notices its pipe closing, waits for dsecd
to exit and removes the directory.
"""

import ctypes
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

APPLETS = ["sh", "tar", "cat", "echo", "sleep", "ls", "mkdir", "rm", "printf", "hostname",
           "true", "false", "kill", "head", "seq", "wc", "id", "env", "pwd", "test", "ln",
           "chmod", "stat", "tr", "yes", "dd", "readlink", "wget", "nslookup", "timeout"]

JANITOR = r"""
import os, shutil, sys, time
root = sys.argv[1]
pids = []
for line in sys.stdin:
    if line.startswith("pid "):
        pids.append(int(line.split()[1]))
deadline = time.time() + 60
while time.time() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
    time.sleep(0.1)
shutil.rmtree(root, ignore_errors=True)
"""


def _env_path(name):
    v = os.environ.get(name)
    if not v or not os.access(v, os.X_OK):
        raise RuntimeError(f"${name} must name an executable (meson test sets it), got {v!r}")
    return v


def eventually(cond, cap=60):
    """Polls `cond` with a generous cap (a safety net, never a measure)."""
    deadline = time.time() + cap
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _die_with_parent():
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _write(path, data, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.chmod(path, mode)


class Daemon:
    def __init__(self, tls=False, layers=True, args=()):
        self.args = list(args)
        self.dsec = _env_path("DSEC_BIN")
        self.dsecd = _env_path("DSECD_BIN")
        self.root = tempfile.mkdtemp(prefix="dsec-pytest-")
        self.proc = None
        self.tls = self.other_tls = None
        self.startup = b""
        self.janitor = subprocess.Popen([sys.executable, "-c", JANITOR, self.root],
                                        stdin=subprocess.PIPE, text=True)
        try:
            self.state = os.path.join(self.root, "state")
            # What its sandboxes may mount read-only (dsecd --allow-host-mount).
            self.host_dir = os.path.join(self.root, "host")
            _write(os.path.join(self.host_dir, "data.txt"), "from the host\n")
            if tls:
                self._make_certs()
            if layers:
                self._build_layers()
            self._start()
        except BaseException:
            self.stop()
            raise

    def _layer(self, kind, ref, src):
        r = subprocess.run([self.dsec, "--state", self.state, "layer", "build", "--kind", kind,
                            ref, src], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"dsec layer build {ref} failed ({r.returncode}): {r.stderr}")

    def _make_certs(self):
        certs = _env_path("DSEC_TLS_CERTS")
        self.tls = os.path.join(self.root, "tls")
        self.other_tls = os.path.join(self.root, "tls-other")
        for d in (self.tls, self.other_tls):
            r = subprocess.run([certs, d], capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                raise RuntimeError(f"tools/tls-certs {d} failed ({r.returncode}): {r.stderr}")

    def _build_layers(self):
        base = os.path.join(self.root, "src", "base")
        os.makedirs(os.path.join(base, "bin"))
        shutil.copy2("/bin/busybox", os.path.join(base, "bin", "busybox"))
        for a in APPLETS:
            os.symlink("busybox", os.path.join(base, "bin", a))
        _write(os.path.join(base, "etc", "passwd"),
               "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n")
        _write(os.path.join(base, "etc", "group"), "root:x:0:\nuser:x:1000:\n")
        os.makedirs(os.path.join(base, "root"))
        os.makedirs(os.path.join(base, "home", "user"))
        os.chown(os.path.join(base, "home", "user"), 1000, 1000)
        self._layer("base", "py@1", base)

        bare = os.path.join(self.root, "src", "bare")
        _write(os.path.join(bare, "etc", "passwd"), "root:x:0:0:root:/root:/nonexistent\n")
        self._layer("base", "bare@1", bare)

        work = os.path.join(self.root, "src", "task")
        _write(os.path.join(work, "work", "README"), "task 17\n")
        _write(os.path.join(work, "work", "Makefile"), "test:\n\techo ok\n")
        self._layer("workdir", "task@1", work)

        tool = os.path.join(self.root, "src", "grader")
        _write(os.path.join(tool, "opt", "grader", "grade.sh"), "#!/bin/sh\necho graded\n", 0o755)
        self._layer("tool", "grader@1", tool)

    def _start(self, port=0):
        self.proc = subprocess.Popen(
            [self.dsecd, "--listen", f"127.0.0.1:{port}", "--state", self.state,
             "--allow-host-mount", self.host_dir]
            + (["--tls", self.tls] if self.tls else []) + self.args,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
        self.janitor.stdin.write(f"pid {self.proc.pid}\n")
        self.janitor.stdin.flush()
        mark = b"listening on 127.0.0.1:"
        out = b""
        deadline = time.time() + 60
        while mark not in out or b" (state " not in out:
            left = deadline - time.time()
            if left <= 0 or self.proc.poll() is not None:
                raise RuntimeError(f"dsecd did not start: {out!r} "
                                   f"{self.proc.stderr.read() if self.proc.poll() is not None else ''}")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    continue
                out += chunk
        self.startup = out
        self.port = int(out.split(mark, 1)[1].split(b" ", 1)[0])
        self.address = f"127.0.0.1:{self.port}"

    def kill(self, sig=signal.SIGKILL):
        """Kills dsecd by its pid (SIGKILL by default, as a crash) and waits for
        it; returns (exit status, what it printed on stdout). The state dir
        stays, for restart()."""
        status, out = None, b""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
            rest, err = self.proc.communicate(timeout=60)
            status, out = self.proc.returncode, self.startup + rest
            self.stderr = err
            self.proc = None
        return status, out.decode(errors="replace")

    def restart(self, same_port=False):
        """Starts a new dsecd on the same state dir (after kill() or a crash);
        it listens on a new port (read d.address again), or with `same_port`
        on the one it had."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"dsecd (pid {self.proc.pid}) is still running")
        self.proc = None
        self._start(self.port if same_port else 0)

    def stop(self):
        """Stops dsecd (SIGTERM, by its pid) and removes the directory;
        returns (exit status, everything it printed on stdout)."""
        status, out = None, b""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                rest, err = self.proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rest, err = self.proc.communicate()
            status, out = self.proc.returncode, self.startup + rest
            self.stderr = err
            self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)
        if self.janitor is not None:
            self.janitor.stdin.close()
            self.janitor.wait(timeout=120)
            self.janitor = None
        return status, out.decode(errors="replace")

    def stop_clean(self):
        """stop(), and fails unless dsecd exited 0 having no sandbox left to
        destroy: every test cleaned up after itself."""
        status, out = self.stop()
        if status != 0 or "dsecd: 0 sandboxes destroyed" not in out:
            raise AssertionError(f"dsecd ended with {status}, left sandboxes behind?\n{out}\n"
                                 f"{getattr(self, 'stderr', b'').decode(errors='replace')}")

"""`pip install ./python` into a fresh venv, then one create + exec from it
against a real dsecd (meson test python-pip; python/README.md, "Install with
pip").

    python3 -m venv --system-site-packages --without-pip VENV
    VENV/bin/python -m pip install --no-build-isolation --no-index ./python

--system-site-packages gives the venv Debian's meson-python, pip and pybind11
(--no-build-isolation: nothing is downloaded); the package itself goes into
the venv. The build runs in python/ (meson-python's working dir
python/.mesonpy-*, removed when it ends) from $DSEC_SOURCE_ROOT. Exit 0 if it
all worked, 77 (skipped) without python3-venv or meson-python, 1 otherwise.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("DSEC_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))

CHECK = r"""
import os, sys
import dsec
here = os.path.dirname(dsec.__file__)
assert here.startswith(sys.prefix), f"dsec came from {here}, not the venv {sys.prefix}"
for f in ("py.typed", "_dsec.pyi"):
    assert os.path.exists(os.path.join(here, f)), f"{f} is not installed"
with dsec.connect(sys.argv[1]) as c, c.session(quota=1, ttl=60, trajectory=False) as s:
    sb = s.create_one("py@1")
    r = sb.exec("echo hello from the venv", check=True)
    assert r.stdout == b"hello from the venv\n", r
    sb.close()
print("venv ok:", dsec.__file__)
"""


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(77)


def run(argv, **kw):
    print("+", " ".join(argv), flush=True)
    return subprocess.run(argv, **kw)


def debug_sections(path):
    """The ELF's .debug_* section names (readelf, from binutils)."""
    if not shutil.which("readelf"):
        return None
    out = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True,
                         check=True).stdout
    return sorted({w for w in out.split() if w.startswith(".debug_")})


def main():
    if importlib.util.find_spec("venv") is None:
        skip("no venv module (Debian: python3-venv)")
    if importlib.util.find_spec("mesonpy") is None:
        skip("no meson-python (Debian: python3-mesonpy)")
    if importlib.util.find_spec("pip") is None:
        skip("no pip (Debian: python3-pip)")
    sys.path.insert(0, HERE)
    from daemon import Daemon

    with tempfile.TemporaryDirectory(prefix="dsec-venv-") as tmp:
        venv = os.path.join(tmp, "venv")
        if run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                venv]).returncode != 0:
            skip("python3 -m venv failed")
        vpy = os.path.join(venv, "bin", "python")
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # the build tree's dsec must not be what is found
        p = run([vpy, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                 "--disable-pip-version-check", "./python"], cwd=ROOT, env=env)
        if p.returncode != 0:
            print(f"FAIL: pip install ./python exited with {p.returncode}")
            return 1
        sos = subprocess.run([vpy, "-c", "import dsec._dsec as m; print(m.__file__)"],
                             cwd=tmp, env=env, capture_output=True, text=True)
        if sos.returncode != 0:
            print(f"FAIL: the venv cannot import dsec._dsec:\n{sos.stderr}")
            return 1
        so = sos.stdout.strip()
        dbg = debug_sections(so)
        print(f"{so}: {os.path.getsize(so)} bytes, debug sections: {dbg}")
        if dbg:
            print("FAIL: the wheel's extension carries debug info")
            return 1
        d = Daemon()
        try:
            p = run([vpy, "-c", CHECK, d.address], cwd=tmp, env=env)
        finally:
            d.stop_clean()
        if p.returncode != 0:
            print("FAIL: create + exec from the venv")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The package's types: `mypy --strict` over the dsec package as built (its
.py files, dsec/_dsec.pyi, py.typed) and python/examples; the stub against the
built extension; and that the types are real (mypy refuses a misuse).

Needs Debian's `mypy` (tools/setup); without it these tests are skipped."""

import ast
import os
import shutil
import subprocess
import tempfile
import unittest

import dsec

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
PKG = os.path.dirname(os.path.abspath(dsec.__file__))
MYPY = shutil.which("mypy")


def mypy(*args, files=None):
    """Runs mypy --strict on the built package's parent dir; (exit code, output)."""
    with tempfile.TemporaryDirectory(prefix="dsec-mypy-") as tmp:
        paths = []
        for i, text in enumerate(files or ()):
            p = os.path.join(tmp, f"snippet_{i}.py")
            with open(p, "w") as f:
                f.write(text)
            paths.append(p)
        env = dict(os.environ, MYPYPATH=os.path.dirname(PKG))
        env.pop("PYTHONPATH", None)  # mypy finds dsec through MYPYPATH only
        p = subprocess.run([MYPY, "--strict", "--no-error-summary", "--cache-dir",
                            os.path.join(tmp, "cache"), *args, *paths],
                           cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
        return p.returncode, p.stdout + p.stderr


@unittest.skipUnless(MYPY, "mypy is not installed (Debian's mypy; tools/setup installs it)")
class Mypy(unittest.TestCase):
    def test_package_and_examples_pass_strict(self):
        examples = sorted(os.path.join(EXAMPLES, f) for f in os.listdir(EXAMPLES)
                          if f.endswith(".py"))
        self.assertGreaterEqual(len(examples), 2)
        for f in ("py.typed", "_dsec.pyi"):
            self.assertTrue(os.path.exists(os.path.join(PKG, f)), f"{f} is not in {PKG}")
        rc, out = mypy(PKG, *examples)
        self.assertEqual(rc, 0, out)

    def test_misuse_is_refused(self):
        # If a type were Any (a missing stub, a missing py.typed), each of these
        # would pass.
        rc, out = mypy(files=["""
import dsec

def f(c: dsec.Client, s: dsec.Session, sb: dsec.Sandbox) -> None:
    live: str = c.stats().live
    code: str = sb.exec("true").exit_code
    sb.exec(["ls"], timeout="5")
    s.create("py@1", count="3")
    data: str = sb.get("/etc/hostname")
    n: str = s.close()
"""])
        self.assertNotEqual(rc, 0, out)
        lines = [ln for ln in out.splitlines() if ": error:" in ln]
        self.assertEqual(len(lines), 6, out)
        for ln, what in zip(lines, ['"int", variable has type "str"',
                                    '"int", variable has type "str"',
                                    # (exec has overloads: background=True gives a Process)
                                    'No overload variant of "exec"', 'Argument "count"',
                                    '"bytes", variable has type "str"',
                                    '"int", variable has type "str"']):
            self.assertIn(what, ln)


class Stub(unittest.TestCase):
    """dsec/_dsec.pyi names what the built extension has, and all of it."""

    def test_stub_matches_the_extension(self):
        with open(os.path.join(PKG, "_dsec.pyi")) as f:
            tree = ast.parse(f.read())
        ext = dsec._dsec
        stubbed = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                stubbed.add(node.name)
                self.assertTrue(hasattr(ext, node.name), f"_dsec has no {node.name}")
            if isinstance(node, ast.ClassDef):
                cls = getattr(ext, node.name)
                members = set()
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        members.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        members.add(item.target.id)
                for m in members:
                    self.assertTrue(hasattr(cls, m), f"_dsec.{node.name} has no {m}")
                bound = {m for m in vars(cls) if not m.startswith("_")}
                self.assertEqual(bound - members, set(),
                                 f"_dsec.{node.name}: bound but not in the stub")
        bound = {n for n in vars(ext) if not n.startswith("__")}
        self.assertEqual(bound - stubbed, set(), "_dsec: bound but not in the stub")

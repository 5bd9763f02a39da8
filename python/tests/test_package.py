"""The package as files: what its import says when the extension is missing
or was built for another Python (no dsecd needed)."""

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest

import dsec

PKG = os.path.dirname(os.path.abspath(dsec.__file__))


class ImportErrors(unittest.TestCase):
    def import_from(self, make_ext):
        """Imports dsec in a fresh interpreter from a copy of the package whose
        extension make_ext(dir) provides; returns (exit code, stderr)."""
        with tempfile.TemporaryDirectory(prefix="dsec-import-") as tmp:
            pkg = os.path.join(tmp, "dsec")
            os.mkdir(pkg)
            for f in ("__init__.py", "errors.py", "_files.py", "_fs.py"):
                shutil.copy(os.path.join(PKG, f), pkg)
            make_ext(pkg)
            p = subprocess.run([sys.executable, "-c", "import dsec"], cwd=tmp,
                               env=dict(os.environ, PYTHONPATH=tmp), capture_output=True,
                               text=True, timeout=60)
            return p.returncode, p.stderr

    def built(self):
        so = glob.glob(os.path.join(PKG, "_dsec*.so"))
        self.assertEqual(len(so), 1, so)
        return so[0]

    def test_an_extension_for_another_python_says_which(self):
        other = "_dsec.cpython-39-x86_64-linux-gnu.so"
        rc, err = self.import_from(lambda pkg: os.symlink(self.built(),
                                                          os.path.join(pkg, other)))
        self.assertNotEqual(rc, 0)
        self.assertIn("ImportError", err)
        self.assertIn("built for another Python", err)
        self.assertIn(other, err)
        self.assertIn(sys.version.split()[0], err)
        self.assertIn("_dsec" + sysconfig.get_config_var("EXT_SUFFIX"), err)

    def test_a_missing_extension_is_named(self):
        rc, err = self.import_from(lambda pkg: None)
        self.assertNotEqual(rc, 0)
        self.assertIn("extension _dsec is not in", err)

    def test_the_right_extension_imports(self):
        so = self.built()
        rc, err = self.import_from(lambda pkg: os.symlink(
            so, os.path.join(pkg, os.path.basename(so))))
        self.assertEqual(rc, 0, err)

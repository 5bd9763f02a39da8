"""Runs python/tests (unittest) for `meson test --suite python`.

meson runs it with its own interpreter and PYTHONPATH=BUILD/python, so the
dsec package under test is the one just built. Exit status 0 only if every
test passed.
"""
import os
import sys
import unittest

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
suite = unittest.defaultTestLoader.discover(here, pattern="test_*.py", top_level_dir=here)
result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
sys.exit(0 if result.wasSuccessful() and result.testsRun > 0 else 1)

"""dsec.connect(address, tls=DIR) against a dsecd --tls (tests/daemon.py):
the daemon's CA gets a client in; a plain client and another CA's are refused
before the daemon sees a request; a bad directory is named."""

import os
import unittest

import dsec

from daemon import Daemon


class Tls(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon(tls=True, layers=False)

    @classmethod
    def tearDownClass(cls):
        cls.d.stop_clean()

    def test_only_a_certificate_of_the_daemons_ca_gets_in(self):
        with dsec.connect(self.d.address, tls=self.d.tls) as c:
            before = c.stats().sessions
            for kwargs, names in [({}, "it may require TLS"),
                                  ({"tls": self.d.other_tls}, "the TLS handshake failed")]:
                with self.assertRaises(dsec.Disconnected) as cm:
                    dsec.connect(self.d.address, **kwargs)
                self.assertIn(names, str(cm.exception))
                self.assertIn(self.d.address, str(cm.exception))
            self.assertEqual(c.stats().sessions, before)  # nobody else got in

    def test_a_bad_directory_is_named_before_connecting(self):
        missing = os.path.join(self.d.root, "nosuch")
        with self.assertRaises(dsec.NotFound) as cm:
            dsec.connect(self.d.address, tls=missing)
        self.assertIn(missing + " does not exist", str(cm.exception))
        with self.assertRaises(ValueError):
            dsec.connect(self.d.address, tls="")


if __name__ == "__main__":
    unittest.main()

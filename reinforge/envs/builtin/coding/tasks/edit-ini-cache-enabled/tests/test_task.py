import configparser
import unittest

EXPECTED = {
    "cache": {"enabled": "yes", "size": "128"},
    "metrics": {"enabled": "no", "interval": "10"},
}


class AppCfg(unittest.TestCase):
    def setUp(self):
        # Only read here, never executed: the file is parsed by this process's configparser.
        self.config = configparser.ConfigParser(interpolation=None)
        with open("/app/app.cfg") as f:
            self.config.read_file(f)

    def test_changed(self):
        self.assertEqual(self.config.get("cache", "enabled"), "yes")
        self.assertEqual(self.config.get("metrics", "enabled"), "no")

    def test_everything_else_kept(self):
        got = {s: dict(self.config.items(s)) for s in self.config.sections()}
        self.assertEqual(got, EXPECTED)
        self.assertEqual(dict(self.config.defaults()), {})


if __name__ == "__main__":
    unittest.main()

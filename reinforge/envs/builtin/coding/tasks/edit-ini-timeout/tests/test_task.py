import configparser
import unittest

EXPECTED = {
    "server": {"host": "0.0.0.0", "port": "8000"},
    "database": {"name": "inventory", "user": "app", "timeout": "60"},
    "logging": {"level": "DEBUG"},
}


class Settings(unittest.TestCase):
    def setUp(self):
        # Only read here, never executed: the file is parsed by this process's configparser.
        self.config = configparser.ConfigParser(interpolation=None)
        with open("/app/settings.ini") as f:
            self.config.read_file(f)

    def test_changed(self):
        self.assertEqual(self.config.get("database", "timeout"), "60")
        self.assertEqual(self.config.get("logging", "level"), "DEBUG")

    def test_everything_else_kept(self):
        got = {s: dict(self.config.items(s)) for s in self.config.sections()}
        self.assertEqual(got, EXPECTED)


if __name__ == "__main__":
    unittest.main()

import configparser
import unittest


class ServerIni(unittest.TestCase):
    def test_content(self):
        # Only read here, never executed: the file is parsed by this process's configparser.
        config = configparser.ConfigParser(interpolation=None)
        with open("/app/server.ini") as f:
            config.read_file(f)
        self.assertEqual(config.sections(), ["server"])
        self.assertEqual(dict(config.defaults()), {})
        self.assertEqual(dict(config.items("server")), {"host": "localhost", "port": "9000"})


if __name__ == "__main__":
    unittest.main()

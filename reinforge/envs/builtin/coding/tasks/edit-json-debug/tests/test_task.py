import json
import unittest


class Config(unittest.TestCase):
    def setUp(self):
        with open("/app/config.json") as f:
            self.config = json.load(f)

    def test_changed(self):
        self.assertIs(self.config["debug"], True)

    def test_kept(self):
        self.assertEqual(
            self.config, {"name": "billing", "debug": True, "port": 9000, "log_level": "info"}
        )
        self.assertIs(type(self.config["port"]), int)


if __name__ == "__main__":
    unittest.main()

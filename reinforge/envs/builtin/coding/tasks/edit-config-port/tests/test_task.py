import sys
import unittest

sys.path.append("/app")

import json


class Config(unittest.TestCase):
    def setUp(self):
        with open("/app/config.json") as f:
            self.config = json.load(f)

    def test_changed(self):
        self.assertIs(type(self.config["port"]), int)
        self.assertEqual(self.config["port"], 8080)
        self.assertIs(self.config["debug"], False)

    def test_kept(self):
        self.assertEqual(self.config["name"], "orders")
        self.assertEqual(self.config["workers"], 4)
        self.assertEqual(self.config["allowed_hosts"], ["localhost", "orders.internal"])
        self.assertEqual(len(self.config), 5)


if __name__ == "__main__":
    unittest.main()

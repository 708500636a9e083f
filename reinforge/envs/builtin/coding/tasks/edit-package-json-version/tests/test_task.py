import json
import unittest

EXPECTED = {
    "name": "todo-app",
    "version": "1.1.0",
    "private": True,
    "scripts": {"start": "node index.js", "test": "jest"},
}


class Package(unittest.TestCase):
    def setUp(self):
        # Only parsed here, never executed.
        with open("/app/package.json") as f:
            self.data = json.load(f)

    def test_changed(self):
        self.assertIs(type(self.data["version"]), str)
        self.assertEqual(self.data["version"], "1.1.0")

    def test_everything_else_kept(self):
        self.assertEqual(self.data, EXPECTED)
        self.assertIs(self.data["private"], True)


if __name__ == "__main__":
    unittest.main()

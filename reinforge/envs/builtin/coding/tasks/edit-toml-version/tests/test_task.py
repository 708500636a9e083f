import tomllib
import unittest

EXPECTED = {
    "project": {
        "name": "widgets",
        "version": "0.2.0",
        "description": "Small widgets",
        "requires-python": ">=3.11",
        "dependencies": [],
    },
    "tool": {"widgets": {"color": "blue", "size": 3}},
}


class PyProject(unittest.TestCase):
    def setUp(self):
        # Only parsed here, never executed.
        with open("/app/pyproject.toml", "rb") as f:
            self.data = tomllib.load(f)

    def test_changed(self):
        self.assertEqual(self.data["project"]["version"], "0.2.0")

    def test_everything_else_kept(self):
        self.assertEqual(self.data, EXPECTED)


if __name__ == "__main__":
    unittest.main()

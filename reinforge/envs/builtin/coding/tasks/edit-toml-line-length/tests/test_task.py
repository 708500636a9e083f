import tomllib
import unittest

EXPECTED = {
    "format": {"line-length": 100, "indent": 4, "quote-style": "double"},
    "check": {"select": ["E", "F"]},
}


class FormatToml(unittest.TestCase):
    def setUp(self):
        # Only parsed here, never executed.
        with open("/app/format.toml", "rb") as f:
            self.data = tomllib.load(f)

    def test_changed(self):
        self.assertIs(type(self.data["format"]["line-length"]), int)
        self.assertEqual(self.data["format"]["line-length"], 100)

    def test_everything_else_kept(self):
        self.assertEqual(self.data, EXPECTED)


if __name__ == "__main__":
    unittest.main()

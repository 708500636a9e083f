import tomllib
import unittest


class LintToml(unittest.TestCase):
    def test_content(self):
        # Only parsed here, never executed.
        with open("/app/lint.toml", "rb") as f:
            data = tomllib.load(f)
        self.assertEqual(data, {"lint": {"name": "checker", "strict": True}})
        self.assertIs(data["lint"]["strict"], True)


if __name__ == "__main__":
    unittest.main()

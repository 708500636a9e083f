import json
import unittest


class Preferences(unittest.TestCase):
    def test_content(self):
        # Only parsed here, never executed.
        with open("/app/preferences.json") as f:
            data = json.load(f)
        self.assertNotIn("legacy_mode", data)
        self.assertEqual(data, {"theme": "light", "language": "en", "autosave": 30})
        self.assertIs(type(data["autosave"]), int)


if __name__ == "__main__":
    unittest.main()

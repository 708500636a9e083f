import json
import os
import unittest


class ConfigFolder(unittest.TestCase):
    def test_directory(self):
        self.assertTrue(os.path.isdir("/app/config"))
        self.assertFalse(os.path.islink("/app/config"))

    def test_settings(self):
        # Only parsed here, never executed.
        with open("/app/config/settings.json") as f:
            data = json.load(f)
        self.assertEqual(data, {"theme": "dark", "font_size": 14})
        self.assertIs(type(data["font_size"]), int)


if __name__ == "__main__":
    unittest.main()

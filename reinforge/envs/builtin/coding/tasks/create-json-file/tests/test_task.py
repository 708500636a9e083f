import json
import unittest


class DataFile(unittest.TestCase):
    def test_content(self):
        # Only parsed here, never executed.
        with open("/app/data.json") as f:
            data = json.load(f)
        self.assertEqual(data, {"name": "reinforge", "version": 1})
        self.assertIs(type(data["version"]), int)


if __name__ == "__main__":
    unittest.main()

import sys
import unittest

sys.path.append("/app")


class GreetingFile(unittest.TestCase):
    def test_content(self):
        with open("/app/greeting.txt", "rb") as f:
            self.assertEqual(f.read(), b"Hello, sandbox!\n")


if __name__ == "__main__":
    unittest.main()

import os
import unittest


class Renamed(unittest.TestCase):
    def test_new_name_has_the_content(self):
        with open("/app/report.md", "rb") as f:
            self.assertEqual(f.read(), b"# Quarterly report\n\nSales went up by 4%.\n")

    def test_old_name_is_gone(self):
        self.assertFalse(os.path.lexists("/app/report.txt"))


if __name__ == "__main__":
    unittest.main()

import unittest

from roman import to_roman


class Roman(unittest.TestCase):
    def test_subtractive(self):
        self.assertEqual(to_roman(4), "IV")
        self.assertEqual(to_roman(1994), "MCMXCIV")


if __name__ == "__main__":
    unittest.main()

import unittest

EXPECTED = [
    "requests==2.31.0",
    "flask==3.0.0",
    "pytest==8.0.0",
]


class Requirements(unittest.TestCase):
    def test_lines(self):
        # Compared line by line (trailing spaces and blank lines at the end do not count).
        with open("/app/requirements.txt") as f:
            lines = [line.rstrip() for line in f.read().splitlines()]
        while lines and not lines[-1]:
            lines.pop()
        self.assertEqual(lines, EXPECTED)


if __name__ == "__main__":
    unittest.main()

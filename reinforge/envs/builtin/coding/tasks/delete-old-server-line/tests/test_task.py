import unittest

EXPECTED = [
    "web-1",
    "web-2",
    "web-3",
]


class Servers(unittest.TestCase):
    def test_lines(self):
        # Compared line by line (trailing spaces and blank lines at the end do not count).
        with open("/app/servers.txt") as f:
            lines = [line.rstrip() for line in f.read().splitlines()]
        while lines and not lines[-1]:
            lines.pop()
        self.assertEqual(lines, EXPECTED)


if __name__ == "__main__":
    unittest.main()

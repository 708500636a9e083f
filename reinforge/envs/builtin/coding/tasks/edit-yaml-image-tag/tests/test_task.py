import unittest

EXPECTED = [
    "services:",
    "  cache:",
    "    image: redis:7",
    "    ports:",
    '      - "6379:6379"',
    "  web:",
    "    image: nginx:1.25",
]


class Compose(unittest.TestCase):
    def test_lines(self):
        # Compared line by line (trailing spaces and blank lines at the end do not count).
        with open("/app/compose.yaml") as f:
            lines = [line.rstrip() for line in f.read().splitlines()]
        while lines and not lines[-1]:
            lines.pop()
        self.assertEqual(lines, EXPECTED)


if __name__ == "__main__":
    unittest.main()

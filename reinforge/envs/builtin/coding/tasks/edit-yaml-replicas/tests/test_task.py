import unittest

EXPECTED = [
    "name: web",
    "image: nginx:1.25",
    "replicas: 3",
    "ports:",
    "  - 80",
    "  - 443",
    "env:",
    "  LOG_LEVEL: info",
]


class Deploy(unittest.TestCase):
    def test_lines(self):
        # Compared line by line (trailing spaces and blank lines at the end do not count).
        with open("/app/deploy.yaml") as f:
            lines = [line.rstrip() for line in f.read().splitlines()]
        while lines and not lines[-1]:
            lines.pop()
        self.assertEqual(lines, EXPECTED)


if __name__ == "__main__":
    unittest.main()

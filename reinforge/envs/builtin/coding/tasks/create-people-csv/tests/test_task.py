import csv
import unittest


class PeopleCsv(unittest.TestCase):
    def test_rows(self):
        # Only parsed here, never executed.
        with open("/app/people.csv", newline="") as f:
            rows = [row for row in csv.reader(f) if row]
        self.assertEqual(rows, [["name", "age"], ["ana", "31"], ["ben", "27"]])

    def test_lines(self):
        with open("/app/people.csv") as f:
            lines = [line for line in f.read().splitlines() if line]
        self.assertEqual(lines, ["name,age", "ana,31", "ben,27"])


if __name__ == "__main__":
    unittest.main()

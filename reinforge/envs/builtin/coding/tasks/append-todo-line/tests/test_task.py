import unittest


class Todo(unittest.TestCase):
    def test_lines(self):
        with open("/app/todo.txt") as f:
            lines = [line.rstrip() for line in f.read().splitlines()]
        while lines and not lines[-1]:
            lines.pop()
        self.assertEqual(lines, ["write tests", "fix bugs", "ship it"])


if __name__ == "__main__":
    unittest.main()

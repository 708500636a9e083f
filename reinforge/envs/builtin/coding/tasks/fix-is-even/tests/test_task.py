import ast
import subprocess
import sys
import unittest


def evaluate(module, expression):
    """The repr of `expression`, computed in a fresh process that imports the candidate
    `module` from /app (after the standard library). The candidate's code never runs in
    this process, so it cannot end it early or change how the results are judged."""
    script = f'import sys\nsys.path.append("/app")\nimport {module}\nprint(repr({expression}))'
    result = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=30, cwd="/tmp"
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise AssertionError(f"exit code {result.returncode}: {result.stderr[-500:]}")
    return lines[-1]


CASES = {4: True, 7: False, 0: True, -2: True, -3: False, 1: False, 100: True}


class IsEven(unittest.TestCase):
    def test_cases(self):
        got = ast.literal_eval(evaluate("parity", f"[parity.is_even(n) for n in {list(CASES)!r}]"))
        self.assertIs(type(got), list)
        self.assertEqual(got, list(CASES.values()))
        self.assertTrue(all(type(g) is bool for g in got))


if __name__ == "__main__":
    unittest.main()

import ast
import subprocess
import sys
import unittest


def unprivileged():
    """Run the candidate as nobody where the sandbox maps that uid (the local backend on a
    root host, Docker): its code then can neither write the reward file nor signal, trace
    or limit the processes that grade it. A sandbox that maps root alone runs it as root."""
    with open("/proc/self/uid_map") as f:
        ranges = [line.split() for line in f]
    if any(int(inside) <= 65534 < int(inside) + int(n) for inside, _, n in ranges):
        return {"user": 65534, "group": 65534, "extra_groups": []}
    return {}


def evaluate(module, expression):
    """The repr of `expression`, computed in a fresh process that imports the candidate
    `module` from /app (after the standard library). The candidate's code never runs in
    this process, so it cannot end it early or change how the results are judged."""
    script = f'import sys\nsys.path.append("/app")\nimport {module}\nprint(repr({expression}))'
    result = subprocess.run(
        [sys.executable, "-I", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/tmp",
        **unprivileged(),
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise AssertionError(f"exit code {result.returncode}: {result.stderr[-500:]}")
    return lines[-1]


CASES = {
    1: "I",
    4: "IV",
    9: "IX",
    14: "XIV",
    40: "XL",
    90: "XC",
    400: "CD",
    944: "CMXLIV",
    1994: "MCMXCIV",
    2026: "MMXXVI",
    3999: "MMMCMXCIX",
}
VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def value_of(text):
    total = 0
    for i, ch in enumerate(text):
        value = VALUES[ch]
        following = VALUES[text[i + 1]] if i + 1 < len(text) else 0
        total += -value if value < following else value
    return total


class Roman(unittest.TestCase):
    def setUp(self):
        got = ast.literal_eval(evaluate("roman", "[roman.to_roman(n) for n in range(1, 4000)]"))
        self.assertIs(type(got), list)
        self.assertTrue(all(type(g) is str for g in got))
        self.numerals = dict(zip(range(1, 4000), got, strict=True))

    def test_cases(self):
        for n, expected in CASES.items():
            self.assertEqual(self.numerals[n], expected, n)

    def test_every_numeral_reads_back(self):
        for n, text in self.numerals.items():
            self.assertEqual(value_of(text), n, text)


if __name__ == "__main__":
    unittest.main()

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


ENCODED = {
    "aaabccdddd": "3a1b2c4d",
    "": "",
    "x" * 12: "12x",
    "a": "1a",
    "abc": "1a1b1c",
    "  !!  ": "2 2!2 ",
    "aabbaa": "2a2b2a",
    "z" * 105 + "Zz": "105z1Z1z",
    "line\nbreak\n\n": "1l1i1n1e1\n1b1r1e1a1k2\n",
}


class RunLength(unittest.TestCase):
    def test_encode(self):
        expression = f"[rle.encode(t) for t in {list(ENCODED)!r}]"
        got = ast.literal_eval(evaluate("rle", expression))
        self.assertIs(type(got), list)
        self.assertTrue(all(type(g) is str for g in got))
        self.assertEqual(got, list(ENCODED.values()))

    def test_decode(self):
        expression = f"[rle.decode(c) for c in {list(ENCODED.values())!r}]"
        got = ast.literal_eval(evaluate("rle", expression))
        self.assertIs(type(got), list)
        self.assertTrue(all(type(g) is str for g in got))
        self.assertEqual(got, list(ENCODED))


if __name__ == "__main__":
    unittest.main()

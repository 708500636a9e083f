import os
import subprocess
import sys
import tempfile
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


def run(script, text):
    """Run the candidate script in its own process on a temporary file holding `text`."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
        os.chmod(f.name, 0o644)  # readable by the candidate
    try:
        result = subprocess.run(
            [sys.executable, "-I", script, f.name],
            capture_output=True,
            text=True,
            timeout=20,
            cwd="/tmp",
            **unprivileged(),
        )
    finally:
        os.unlink(f.name)
    return result.returncode, result.stdout


class Total(unittest.TestCase):
    def check(self, text, expected):
        self.assertEqual(run("/app/total.py", text), (0, expected))

    def test_sample(self):
        self.check("10\n20\n\n-3\n15\n", "42\n")

    def test_negative_and_no_final_newline(self):
        self.check("-5\n-7\n2", "-10\n")

    def test_blank_lines_and_spaces(self):
        self.check("\n  4 \n\n\n 6\n\n", "10\n")

    def test_empty(self):
        self.check("", "0\n")


if __name__ == "__main__":
    unittest.main()

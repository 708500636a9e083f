import sys
import unittest

sys.path.append("/app")

import os
import subprocess
import tempfile


def unprivileged():
    """Run the candidate as nobody where the sandbox maps that uid (the local backend on a
    root host, Docker): its code then can neither write the reward file nor signal, trace
    or limit the processes that grade it. A sandbox that maps root alone runs it as root."""
    with open("/proc/self/uid_map") as f:
        ranges = [line.split() for line in f]
    if any(int(inside) <= 65534 < int(inside) + int(n) for inside, _, n in ranges):
        return {"user": 65534, "group": 65534, "extra_groups": []}
    return {}


def run(text, n):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
        os.chmod(f.name, 0o644)  # readable by the candidate
    try:
        result = subprocess.run(
            [sys.executable, "-I", "/app/wordfreq.py", f.name, str(n)],
            capture_output=True,
            text=True,
            timeout=20,
            **unprivileged(),
        )
    finally:
        os.unlink(f.name)
    return result.returncode, result.stdout


class WordFreq(unittest.TestCase):
    def test_ties_alphabetical(self):
        code, out = run("b a c b a d", 3)
        self.assertEqual(code, 0)
        self.assertEqual(out, "a 2\nb 2\nc 1\n")

    def test_case_and_punctuation(self):
        code, out = run("It's IT, it; x-ray X", 2)
        self.assertEqual(code, 0)
        self.assertEqual(out, "it 3\nx 2\n")

    def test_fewer_words_than_n(self):
        code, out = run("one", 5)
        self.assertEqual((code, out), (0, "one 1\n"))


if __name__ == "__main__":
    unittest.main()

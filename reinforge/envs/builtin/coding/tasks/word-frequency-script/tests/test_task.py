import sys
import unittest

sys.path.append("/app")

import os
import subprocess
import tempfile


def run(text, n):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    try:
        result = subprocess.run(
            [sys.executable, "-I", "/app/wordfreq.py", f.name, str(n)],
            capture_output=True,
            text=True,
            timeout=20,
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

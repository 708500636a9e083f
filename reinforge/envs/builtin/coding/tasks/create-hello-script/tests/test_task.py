import subprocess
import sys
import unittest


class HelloScript(unittest.TestCase):
    def test_output(self):
        # The script runs in its own process: what it does cannot change this one.
        result = subprocess.run(
            [sys.executable, "-I", "/app/hello.py"],
            capture_output=True,
            text=True,
            timeout=20,
            cwd="/tmp",
        )
        self.assertEqual(result.returncode, 0, result.stderr[-500:])
        self.assertEqual(result.stdout, "Hello, world!\n")


if __name__ == "__main__":
    unittest.main()

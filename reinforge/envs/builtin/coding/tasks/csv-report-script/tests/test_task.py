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
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
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


class Report(unittest.TestCase):
    def check(self, text, expected):
        self.assertEqual(run("/app/report.py", text), (0, expected))

    def test_sample(self):
        self.check(
            'region,product,amount\nwest,widget,60\neast,"bolt, small",2.5\nnorth,nut,7.25\n'
            'east,gear,10\nwest,"cog, large",40.00\n',
            "east 12.50\nnorth 7.25\nwest 100.00\n",
        )

    def test_quoted_commas_and_sorting(self):
        self.check(
            'region,product,amount\n"south","a, b, c",1.10\nalpha,x,0.2\nsouth,"y,",2.20\n'
            'beta,"""quoted""",3\n',
            "alpha 0.20\nbeta 3.00\nsouth 3.30\n",
        )

    def test_header_only(self):
        self.check("region,product,amount\n", "")


if __name__ == "__main__":
    unittest.main()

import subprocess
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


class CountdownScript(unittest.TestCase):
    def test_output(self):
        # The script runs in its own process, as nobody: what it does cannot change this one.
        result = subprocess.run(
            ["/bin/bash", "/app/countdown.sh"],
            capture_output=True,
            text=True,
            timeout=20,
            cwd="/tmp",
            **unprivileged(),
        )
        self.assertEqual(result.returncode, 0, result.stderr[-500:])
        self.assertEqual(result.stdout, "3\n2\n1\n")


if __name__ == "__main__":
    unittest.main()

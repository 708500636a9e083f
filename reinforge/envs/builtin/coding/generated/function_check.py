"""The half of a hidden test that runs the candidate's function, word for word as every
written task that grades a function has it. A generated function task's test is this file
followed by its calls and their expected values: one verifier to audit and keep safe."""

import subprocess
import sys


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

#!/bin/bash
set -e
cd /app
cat > fizzbuzz.py <<'PY'
def fizzbuzz(n):
    """The FizzBuzz strings for 1 to n."""
    out = []
    for i in range(1, n + 1):
        if i % 15 == 0:
            out.append("FizzBuzz")
        elif i % 3 == 0:
            out.append("Fizz")
        elif i % 5 == 0:
            out.append("Buzz")
        else:
            out.append(str(i))
    return out
PY

#!/bin/bash
set -e
cat > /app/calc.py <<'PY'
def add(a, b):
    """The sum of a and b."""
    return a + b
PY

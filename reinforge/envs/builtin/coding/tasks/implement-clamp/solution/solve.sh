#!/bin/bash
set -e
cd /app
cat > mathutils.py <<'PY'
def clamp(value, low, high):
    """`value` limited to the range [low, high]."""
    if value < low:
        return low
    if value > high:
        return high
    return value
PY

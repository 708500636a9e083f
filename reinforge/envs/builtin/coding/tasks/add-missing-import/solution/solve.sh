#!/bin/bash
set -e
cd /app
cat > geometry2d.py <<'PY'
import math


def distance(p, q):
    """The Euclidean distance between the points p = (x1, y1) and q = (x2, y2)."""
    return math.sqrt((q[0] - p[0]) ** 2 + (q[1] - p[1]) ** 2)
PY

#!/bin/bash
set -e
cd /app
cat > total.py <<'PY'
import sys

with open(sys.argv[1]) as f:
    print(sum(int(line) for line in f if line.strip()))
PY

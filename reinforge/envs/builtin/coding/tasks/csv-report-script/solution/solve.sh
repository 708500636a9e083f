#!/bin/bash
set -e
cd /app
cat > report.py <<'PY'
import collections
import csv
import sys
from decimal import Decimal

totals = collections.defaultdict(Decimal)
with open(sys.argv[1], newline="") as f:
    for row in csv.DictReader(f):
        totals[row["region"]] += Decimal(row["amount"])
for region in sorted(totals):
    print(f"{region} {totals[region]:.2f}")
PY

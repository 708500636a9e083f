#!/bin/bash
set -e
cd /app
python3 - <<'EOF'
from pathlib import Path

path = Path("vowels.py")
code = path.read_text().replace(
    "raise NotImplementedError",
    'return sum(1 for ch in text if ch in "aeiouAEIOU")',
)
path.write_text(code)
EOF

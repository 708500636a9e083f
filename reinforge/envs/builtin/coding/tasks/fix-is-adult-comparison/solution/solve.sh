#!/bin/bash
set -e
cd /app
python3 - <<'EOF'
from pathlib import Path

path = Path("age.py")
path.write_text(path.read_text().replace("age > 18", "age >= 18"))
EOF

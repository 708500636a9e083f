#!/bin/bash
set -e
cd /app
python3 - <<'EOF'
from pathlib import Path

path = Path("db.properties")
path.write_text(path.read_text().replace("db.port=3306", "db.port=3307"))
EOF

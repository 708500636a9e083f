#!/bin/bash
set -e
cd /app
cat >> requirements.txt <<'EOF'
pytest==8.0.0
EOF

#!/bin/bash
set -e
cd /app
cat > data.json <<'EOF'
{"name": "reinforge", "version": 1}
EOF

#!/bin/bash
set -e
cd /app
cat > shopping.txt <<'EOF'
milk
eggs
bread
EOF

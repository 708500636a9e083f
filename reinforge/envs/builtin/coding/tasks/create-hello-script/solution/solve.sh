#!/bin/bash
set -e
cd /app
cat > hello.py <<'EOF'
print("Hello, world!")
EOF

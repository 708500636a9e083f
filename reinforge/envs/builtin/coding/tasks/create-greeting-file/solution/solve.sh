#!/bin/bash
set -e
cd /app
cat > greeting.txt <<'EOF'
Hello, sandbox!
EOF

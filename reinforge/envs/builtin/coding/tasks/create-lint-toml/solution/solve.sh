#!/bin/bash
set -e
cd /app
cat > lint.toml <<'EOF'
[lint]
name = "checker"
strict = true
EOF

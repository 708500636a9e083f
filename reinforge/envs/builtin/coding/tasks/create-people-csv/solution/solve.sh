#!/bin/bash
set -e
cd /app
cat > people.csv <<'EOF'
name,age
ana,31
ben,27
EOF

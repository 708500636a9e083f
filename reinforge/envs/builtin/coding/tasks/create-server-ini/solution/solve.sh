#!/bin/bash
set -e
cd /app
cat > server.ini <<'EOF'
[server]
host = localhost
port = 9000
EOF

#!/bin/bash
set -e
cd /app
cat > service.yaml <<'EOF'
name: api
port: 8443
EOF

#!/bin/bash
set -e
cd /app
cat > morning.sh <<'EOF'
#!/bin/bash
echo "Good morning"
EOF

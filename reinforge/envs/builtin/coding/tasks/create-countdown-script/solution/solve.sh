#!/bin/bash
set -e
cd /app
cat > countdown.sh <<'EOF'
#!/bin/bash
for n in 3 2 1; do
  echo "$n"
done
EOF

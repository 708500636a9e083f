#!/bin/bash
set -e
cd /app
cat > greeter.py <<'EOF'
def greet(name):
    """The greeting "Hi, <name>!"."""
    return "Hi, " + name + "!"
EOF

#!/bin/bash
set -e
cd /app
cat > temperature.py <<'EOF'
def c_to_f(celsius):
    """Degrees Fahrenheit for `celsius` degrees Celsius, as a float."""
    return celsius * 9 / 5 + 32
EOF

#!/bin/bash
set -e
cd /app
cat > timeunits.py <<'EOF'
def minutes_to_seconds(minutes):
    """The number of seconds in `minutes` minutes."""
    return minutes * 60
EOF

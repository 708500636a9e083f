#!/bin/bash
set -e
cd /app
cat > stats.py <<'EOF'
def median(values):
    """The median of a non-empty list of numbers."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
EOF

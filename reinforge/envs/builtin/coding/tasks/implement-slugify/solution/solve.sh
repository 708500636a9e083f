#!/bin/bash
set -e
cd /app
cat > text_utils.py <<'EOF'
import re


def slugify(text):
    """The URL slug of a title."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
EOF

#!/bin/bash
set -e
cd /app
cat > palindrome.py <<'PY'
def is_palindrome(text):
    """Whether `text` reads the same forwards and backwards."""
    kept = [c.lower() for c in text if c.isalnum()]
    return kept == kept[::-1]
PY

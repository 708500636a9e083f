#!/bin/bash
set -e
cd /app
cat > words.py <<'PY'
def reverse_words(sentence):
    """The words of `sentence` in reverse order, joined by single spaces."""
    return " ".join(reversed(sentence.split()))
PY

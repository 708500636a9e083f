#!/bin/bash
set -e
cd /app
cat > rle.py <<'PY'
import itertools
import re


def encode(text):
    """Run-length encoding of `text` (which has no digits)."""
    return "".join(f"{len(list(run))}{char}" for char, run in itertools.groupby(text))


def decode(code):
    """The text whose run-length encoding is `code`."""
    return "".join(char * int(count) for count, char in re.findall(r"(\d+)(\D)", code, re.S))
PY

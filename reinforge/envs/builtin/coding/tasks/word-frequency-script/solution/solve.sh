#!/bin/bash
set -e
cd /app
cat > wordfreq.py <<'EOF'
import collections
import re
import sys


def main():
    path, n = sys.argv[1], int(sys.argv[2])
    with open(path) as f:
        words = re.findall(r"[a-z]+", f.read().lower())
    counts = collections.Counter(words)
    for word, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]:
        print(word, count)


if __name__ == "__main__":
    main()
EOF

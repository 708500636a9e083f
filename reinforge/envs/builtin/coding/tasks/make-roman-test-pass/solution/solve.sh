#!/bin/bash
set -e
cd /app
cat > roman.py <<'EOF'
NUMERALS = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]


def to_roman(n):
    """The Roman numeral of 1 <= n <= 3999."""
    out = ""
    for value, letters in NUMERALS:
        while n >= value:
            out += letters
            n -= value
    return out
EOF

#!/bin/bash
set -e
cat > /app/roman.py <<'SCRIPT'
import sys

VALUES = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
          (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
n = int(sys.argv[1])
out = []
for value, symbol in VALUES:
    while n >= value:
        out.append(symbol)
        n -= value
print("".join(out))
SCRIPT

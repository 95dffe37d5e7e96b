#!/bin/bash
set -e
cat > /app/colsum.py <<'SCRIPT'
import csv
import sys

path, column = sys.argv[1], sys.argv[2]
with open(path, newline="") as f:
    total = sum(float(row[column]) for row in csv.DictReader(f))
print(f"{total:.2f}")
SCRIPT

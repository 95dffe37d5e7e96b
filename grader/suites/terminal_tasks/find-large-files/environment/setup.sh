#!/bin/bash
# Creates /app/data: files of chosen sizes (filler text), some just around the 4096-byte limit.
set -e
python3 - <<'PY'
import os
SIZES = {
    "readme.txt": 50,
    "logs/app.log": 6000,
    "logs/old.log": 1200,
    "images/big.bin": 4097,
    "images/icon.bin": 4096,
    "reports/2024/q1.csv": 5000,
    "reports/2024/q2.csv": 300,
    "reports/summary.txt": 8192,
    "reports/big report.txt": 7000,
    ".cache/blob.dat": 4500,
    ".cache/index": 10,
}
line = b"lorem ipsum dolor sit amet 0123456789\n"
for rel, size in SIZES.items():
    path = os.path.join("/app/data", rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write((line * (size // len(line) + 1))[:size])
PY
rm -f /app/.keep

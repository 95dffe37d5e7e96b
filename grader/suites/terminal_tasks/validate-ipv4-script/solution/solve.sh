#!/bin/bash
set -e
cat > /app/check_ip.py <<'SCRIPT'
import sys


def valid(s):
    parts = s.split(".")
    if len(parts) != 4:
        return False
    for p in parts:
        if not (1 <= len(p) <= 3) or not all(c in "0123456789" for c in p):
            return False
        if (len(p) > 1 and p[0] == "0") or int(p) > 255:
            return False
    return True


for line in sys.stdin:
    print("valid" if valid(line.rstrip("\n")) else "invalid")
SCRIPT

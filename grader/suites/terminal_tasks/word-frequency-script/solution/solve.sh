#!/bin/bash
set -e
cat > /app/wordfreq.py <<'SCRIPT'
import re
import sys
from collections import Counter

path, n = sys.argv[1], int(sys.argv[2])
with open(path) as f:
    counts = Counter(w.lower() for w in re.findall(r"[A-Za-z]+", f.read()))
for word, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]:
    print(word, count)
SCRIPT

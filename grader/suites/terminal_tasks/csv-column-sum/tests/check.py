"""Runs /app/colsum.py on CSV files the agent never saw and compares the printed sums.

The script is the agent's: it runs as the unprivileged agent user (/run/crucible/as-agent), never with the root
rights of this check."""
import re
import subprocess
import sys

AS_AGENT = "/run/crucible/as-agent"  # runs its command as the agent user (uid 65534): cannot touch the reward or /tests

CASES = [
    ("/tests/inputs/a.csv", "amount", 4175.50),
    ("/tests/inputs/b.csv", "q1", 108.60),
    ("/tests/inputs/b.csv", "q2", 222.704),
    ("/tests/inputs/b.csv", "q3", 431.29),
    ("/app/sample.csv", "price", 5.85),
]

for path, column, expected in CASES:
    try:
        proc = subprocess.run([AS_AGENT, "python3", "/app/colsum.py", path, column], capture_output=True, text=True,
                              timeout=20, cwd="/tmp")
    except subprocess.TimeoutExpired:
        print(f"FAIL: {path} {column} timed out")
        sys.exit(1)
    out = proc.stdout.strip()
    if proc.returncode != 0 or not re.fullmatch(r"-?\d+\.\d\d", out) or abs(float(out) - expected) > 0.0051:
        print(f"FAIL: {path} {column}: exit {proc.returncode}, printed {out!r}, expected {expected:.2f}")
        sys.exit(1)
print("OK")

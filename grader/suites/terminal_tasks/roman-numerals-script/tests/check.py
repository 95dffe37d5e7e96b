"""Runs /app/roman.py on numbers across 1..3999 and compares with a reference conversion.

The script is the agent's: it runs as the unprivileged agent user (/run/crucible/as-agent), never with the root
rights of this check."""
import subprocess
import sys

AS_AGENT = "/run/crucible/as-agent"  # runs its command as the agent user (uid 65534): cannot touch the reward or /tests

VALUES = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
          (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


def reference(n):
    out = ""
    for value, symbol in VALUES:
        while n >= value:
            out += symbol
            n -= value
    return out


for n in (1, 3, 8, 14, 40, 49, 90, 99, 444, 500, 944, 1666, 2024, 2999, 3888, 3999):
    try:
        proc = subprocess.run([AS_AGENT, "python3", "/app/roman.py", str(n)], capture_output=True, text=True,
                              timeout=20, cwd="/tmp")
    except subprocess.TimeoutExpired:
        print(f"FAIL: {n} timed out")
        sys.exit(1)
    if proc.returncode != 0 or proc.stdout.strip() != reference(n):
        print(f"FAIL: {n}: exit {proc.returncode}, printed {proc.stdout.strip()!r}, expected {reference(n)!r}")
        sys.exit(1)
print("OK")

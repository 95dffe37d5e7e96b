"""active.txt lists the names of the active users, sorted (/tests/expected.txt)."""
import sys

with open("/tests/expected.txt") as f:
    expected = f.read().split()
try:
    with open("/app/active.txt") as f:
        got = [line.strip() for line in f if line.strip()]
except OSError as e:
    print("FAIL: cannot read /app/active.txt:", e)
    sys.exit(1)
if got != expected:
    print(f"FAIL: got {got}, expected {expected}")
    sys.exit(1)
print("OK")

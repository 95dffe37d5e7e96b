"""clean.conf is app.conf without blank and comment lines (/tests/expected.txt); app.conf is untouched."""
import sys

with open("/tests/expected.txt") as f:
    expected = f.read().splitlines()
try:
    with open("/app/clean.conf") as f:
        got = f.read().splitlines()
except OSError as e:
    print("FAIL: cannot read /app/clean.conf:", e)
    sys.exit(1)
if got != expected:
    print(f"FAIL: got {got}, expected {expected}")
    sys.exit(1)
with open("/app/app.conf") as f:
    if len(f.read().splitlines()) != 14:
        print("FAIL: /app/app.conf was modified")
        sys.exit(1)
print("OK")

"""error_count.txt holds the number of lines logged at level ERROR."""
import sys

EXPECTED = 16

try:
    with open("/app/error_count.txt") as f:
        text = f.read().strip()
except OSError as e:
    print("FAIL: cannot read /app/error_count.txt:", e)
    sys.exit(1)
if text != str(EXPECTED):
    print(f"FAIL: got {text!r}, expected {EXPECTED}")
    sys.exit(1)
print("OK")

"""latest.csv holds each sensor's most recent reading, sorted by sensor (/tests/expected.csv)."""
import csv
import sys

with open("/tests/expected.csv", newline="") as f:
    expected = list(csv.reader(f))
try:
    with open("/app/latest.csv", newline="") as f:
        got = [[field.strip() for field in row] for row in csv.reader(f) if row]
except OSError as e:
    print("FAIL: cannot read /app/latest.csv:", e)
    sys.exit(1)
if got != expected:
    print(f"FAIL: got {got}, expected {expected}")
    sys.exit(1)
print("OK")

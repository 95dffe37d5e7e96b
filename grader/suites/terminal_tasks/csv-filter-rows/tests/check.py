"""engineering.csv is the header plus exactly the Engineering rows, in order (/tests/expected.csv)."""
import csv
import sys

with open("/tests/expected.csv", newline="") as f:
    expected = list(csv.reader(f))
try:
    with open("/app/engineering.csv", newline="") as f:
        got = [row for row in csv.reader(f) if row]
except OSError as e:
    print("FAIL: cannot read /app/engineering.csv:", e)
    sys.exit(1)
if got != expected:
    print(f"FAIL: got {len(got)} rows, expected {len(expected)}; got {got[:3]}...")
    sys.exit(1)
print("OK")

"""users.csv holds id,name,email for every user, sorted by id (/tests/expected.csv), as parsed CSV."""
import csv
import sys

with open("/tests/expected.csv", newline="") as f:
    expected = list(csv.reader(f))
try:
    with open("/app/users.csv", newline="") as f:
        got = [[field.strip() for field in row] for row in csv.reader(f) if row]
except OSError as e:
    print("FAIL: cannot read /app/users.csv:", e)
    sys.exit(1)
if got != expected:
    print(f"FAIL: got {got}, expected {expected}")
    sys.exit(1)
print("OK")

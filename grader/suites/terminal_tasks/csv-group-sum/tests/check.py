"""region_totals.csv has one row per region, alphabetical, with the right totals to the cent (/tests/expected.csv)."""
import csv
import re
import sys

with open("/tests/expected.csv", newline="") as f:
    expected = list(csv.reader(f))
try:
    with open("/app/region_totals.csv", newline="") as f:
        got = [[field.strip() for field in row] for row in csv.reader(f) if row]
except OSError as e:
    print("FAIL: cannot read /app/region_totals.csv:", e)
    sys.exit(1)
if not got or got[0] != expected[0]:
    print(f"FAIL: header is {got[:1]}, expected {expected[0]}")
    sys.exit(1)
if [row[0] for row in got[1:]] != [row[0] for row in expected[1:]] or any(len(row) != 2 for row in got):
    print(f"FAIL: rows {got[1:]}, expected regions {[row[0] for row in expected[1:]]}")
    sys.exit(1)
for (region, total), (_, want) in zip(got[1:], expected[1:]):
    if not re.fullmatch(r"-?\d+\.\d\d", total) or abs(float(total) - float(want)) > 0.001:
        print(f"FAIL: {region}: total {total!r}, expected {want}")
        sys.exit(1)
print("OK")

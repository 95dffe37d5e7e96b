"""order_report.csv is the inner join of orders and customers, sorted by order id (/tests/expected.csv)."""
import csv
import sys

with open("/tests/expected.csv", newline="") as f:
    expected = list(csv.reader(f))
try:
    with open("/app/order_report.csv", newline="") as f:
        got = [[field.strip() for field in row] for row in csv.reader(f) if row]
except OSError as e:
    print("FAIL: cannot read /app/order_report.csv:", e)
    sys.exit(1)
if got != expected:
    diff = next(((g, e) for g, e in zip(got, expected) if g != e), None)
    print(f"FAIL: {len(got)} rows, expected {len(expected)}; first difference: {diff}")
    sys.exit(1)
print("OK")

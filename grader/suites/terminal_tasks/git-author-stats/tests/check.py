"""authors.txt gives each author's commit count on main, highest first."""
import sys

EXPECTED = [("6", "alice"), ("3", "bob"), ("2", "Carol Diaz"), ("1", "dan")]

try:
    with open("/app/authors.txt") as f:
        rows = [line.split() for line in f if line.strip()]
except OSError as e:
    print("FAIL: cannot read /app/authors.txt:", e)
    sys.exit(1)
got = [(row[0], " ".join(row[1:])) for row in rows]
if got != EXPECTED:
    print(f"FAIL: got {got}, expected {EXPECTED}")
    sys.exit(1)
print("OK")

"""region_totals.csv has one row per region, alphabetical, with the right totals to the cent (/tests/expected.csv)."""
import csv
import os
import re
import stat
import sys


def open_app(path, mode="r", **kwargs):
    """open() for a file the agent left in /app. This check runs as root: it accepts only a regular file that really
    lies in /app (not a link to a file of /tests, which would read as the expected answer; not a FIFO that blocks)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or not os.readlink(f"/proc/self/fd/{fd}").startswith("/app/"):
            raise OSError(f"{path} is not a regular file in /app")
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


with open("/tests/expected.csv", newline="") as f:
    expected = list(csv.reader(f))
try:
    with open_app("/app/region_totals.csv", newline="") as f:
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

"""users.csv holds id,name,email for every user, sorted by id (/tests/expected.csv), as parsed CSV."""
import csv
import os
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
    with open_app("/app/users.csv", newline="") as f:
        got = [[field.strip() for field in row] for row in csv.reader(f) if row]
except OSError as e:
    print("FAIL: cannot read /app/users.csv:", e)
    sys.exit(1)
if got != expected:
    print(f"FAIL: got {got}, expected {expected}")
    sys.exit(1)
print("OK")

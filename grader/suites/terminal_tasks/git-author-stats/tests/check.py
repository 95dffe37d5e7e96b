"""authors.txt gives each author's commit count on main, highest first."""
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


EXPECTED = [("6", "alice"), ("3", "bob"), ("2", "Carol Diaz"), ("1", "dan")]

try:
    with open_app("/app/authors.txt") as f:
        rows = [line.split() for line in f if line.strip()]
except OSError as e:
    print("FAIL: cannot read /app/authors.txt:", e)
    sys.exit(1)
got = [(row[0], " ".join(row[1:])) for row in rows]
if got != EXPECTED:
    print(f"FAIL: got {got}, expected {EXPECTED}")
    sys.exit(1)
print("OK")

"""active.txt lists the names of the active users, sorted (/tests/expected.txt)."""
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


with open("/tests/expected.txt") as f:
    expected = f.read().split()
try:
    with open_app("/app/active.txt") as f:
        got = [line.strip() for line in f if line.strip()]
except OSError as e:
    print("FAIL: cannot read /app/active.txt:", e)
    sys.exit(1)
if got != expected:
    print(f"FAIL: got {got}, expected {expected}")
    sys.exit(1)
print("OK")

"""error_count.txt holds the number of lines logged at level ERROR."""
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


EXPECTED = 16

try:
    with open_app("/app/error_count.txt") as f:
        text = f.read().strip()
except OSError as e:
    print("FAIL: cannot read /app/error_count.txt:", e)
    sys.exit(1)
if text != str(EXPECTED):
    print(f"FAIL: got {text!r}, expected {EXPECTED}")
    sys.exit(1)
print("OK")

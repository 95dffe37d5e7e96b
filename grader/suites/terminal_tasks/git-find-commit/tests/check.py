"""answer.txt holds the full hash of the commit that added DEBUG_MODE = True (fixed: the setup's history is deterministic)."""
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


EXPECTED = "25aa8ad198317a6f3fa2bc2a2bf35e515ac79292"

try:
    with open_app("/app/answer.txt") as f:
        got = f.read().strip().lower()
except OSError as e:
    print("FAIL: cannot read /app/answer.txt:", e)
    sys.exit(1)
if got != EXPECTED:
    print(f"FAIL: answer is {got!r}")
    sys.exit(1)
print("OK")

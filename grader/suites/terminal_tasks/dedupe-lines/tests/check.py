"""unique_urls.txt equals the first-occurrence deduplication of urls.txt (/tests/expected.txt)."""
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
    expected = f.read().splitlines()
try:
    with open_app("/app/unique_urls.txt") as f:
        got = f.read().splitlines()
except OSError as e:
    print("FAIL: cannot read /app/unique_urls.txt:", e)
    sys.exit(1)
while got and not got[-1]:
    got.pop()
if got != expected:
    print(f"FAIL: got {len(got)} lines, expected {len(expected)}; first difference:",
          next(((i, g, e) for i, (g, e) in enumerate(zip(got, expected)) if g != e), "length"))
    sys.exit(1)
print("OK")

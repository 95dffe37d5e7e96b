"""todos.txt names every line under src/ containing TODO, as path:line."""
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


EXPECTED = {"src/main.py:3", "src/main.py:7", "src/api/handlers.py:7", "src/api/handlers.py:8",
            "src/web/app.js:3", "src/web/app.js:4"}

try:
    with open_app("/app/todos.txt") as f:
        got = [line.strip() for line in f if line.strip()]
except OSError as e:
    print("FAIL: cannot read /app/todos.txt:", e)
    sys.exit(1)
got = [g[2:] if g.startswith("./") else g for g in got]
if len(got) != len(set(got)) or set(got) != EXPECTED:
    print(f"FAIL: got {sorted(got)}, expected {sorted(EXPECTED)}")
    sys.exit(1)
print("OK")

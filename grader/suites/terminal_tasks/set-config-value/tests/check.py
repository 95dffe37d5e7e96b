"""Only the [server] port line changed, to 8080 (spacing around '=' is free)."""
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


ORIGINAL = """; Service configuration
[server]
host = 0.0.0.0
port = 8000
workers = 4

[database]
host = db.internal
port = 5432
name = shop

[cache]
host = cache.internal
port = 6379
; port = 8000 was the old cache port
""".splitlines()
SERVER_PORT_LINE = 3

try:
    with open_app("/app/settings.ini") as f:
        got = f.read().splitlines()
except OSError as e:
    print("FAIL: cannot read /app/settings.ini:", e)
    sys.exit(1)
while got and not got[-1].strip():
    got.pop()
if len(got) != len(ORIGINAL):
    print(f"FAIL: the file has {len(got)} lines, expected {len(ORIGINAL)}")
    sys.exit(1)
for i, (line, orig) in enumerate(zip(got, ORIGINAL)):
    if i == SERVER_PORT_LINE:
        if not re.fullmatch(r"port\s*=\s*8080\s*", line):
            print(f"FAIL: [server] port line is {line!r}")
            sys.exit(1)
    elif line != orig:
        print(f"FAIL: line {i + 1} changed: {line!r} (was {orig!r})")
        sys.exit(1)
print("OK")

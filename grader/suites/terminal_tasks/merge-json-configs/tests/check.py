"""merged.json equals the deep merge of overrides into defaults (/tests/expected.json)."""
import json
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


with open("/tests/expected.json") as f:
    expected = json.load(f)
try:
    with open_app("/app/merged.json") as f:
        got = json.load(f)
except (OSError, ValueError) as e:
    print("FAIL: cannot read /app/merged.json as JSON:", e)
    sys.exit(1)
if got != expected:
    print(f"FAIL: got {json.dumps(got, sort_keys=True)}\n expected {json.dumps(expected, sort_keys=True)}")
    sys.exit(1)
print("OK")

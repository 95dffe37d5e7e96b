"""The .py files under /app/lib equal /tests/expected/ (only the identifier renamed); CHANGELOG.md is untouched."""
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


EXPECTED_DIR = "/tests/expected"


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


for root, _dirs, files in os.walk(EXPECTED_DIR):
    for name in files:
        rel = os.path.relpath(os.path.join(root, name), EXPECTED_DIR)
        with open(os.path.join(root, name)) as f:
            expected = f.read()
        try:
            with open_app(os.path.join("/app/lib", rel)) as f:
                got = f.read()
        except OSError as e:
            fail(f"cannot read lib/{rel}: {e}")
        if got.rstrip("\n") != expected.rstrip("\n"):
            fail(f"lib/{rel} is not as expected")
with open_app("/app/lib/CHANGELOG.md") as f:
    if f.read() != "- 1.2: old_fetch gained a retries argument\n":
        fail("lib/CHANGELOG.md was modified")
print("OK")

"""broken.txt names exactly the broken links; they are deleted; the working links and files are untouched."""
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


ROOT = "/app/links"
BROKEN = {"old-config", "sub/gone", "abs-broken", "loop1", "loop2"}
WORKING = {
    "current": "real/config.yml",
    "data": "real/data.txt",
    "sub/up": "../real/data.txt",
    "abs-ok": "/app/links/real/data.txt",
    "dirlink": "real",
}
FILES = {"real/config.yml": "mode: production\n", "real/data.txt": "42\n"}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


try:
    with open_app("/app/broken.txt") as f:
        listed = [line.strip() for line in f if line.strip()]
except OSError as e:
    fail(f"cannot read /app/broken.txt: {e}")
listed = [p[2:] if p.startswith("./") else p for p in listed]
if len(listed) != len(set(listed)) or set(listed) != BROKEN:
    fail(f"broken.txt lists {sorted(listed)}, expected {sorted(BROKEN)}")
for rel in BROKEN:
    if os.path.lexists(os.path.join(ROOT, rel)):
        fail(f"broken link {rel} still exists")
for rel, target in WORKING.items():
    path = os.path.join(ROOT, rel)
    if not os.path.islink(path) or os.readlink(path) != target:
        fail(f"working link {rel} was changed or removed")
for rel, content in FILES.items():
    path = os.path.join(ROOT, rel)
    if os.path.islink(path) or not os.path.isfile(path):
        fail(f"{rel} is no longer a regular file")
    with open_app(path) as f:
        if f.read() != content:
            fail(f"{rel}: contents changed")
print("OK")

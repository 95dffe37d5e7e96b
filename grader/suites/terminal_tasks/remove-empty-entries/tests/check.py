"""No empty file or directory remains under /app/project; the non-empty files are untouched."""
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


ROOT = "/app/project"
KEEP = {
    "src/main.py": 'print("hi")\n',
    "docs/index.md": "# Docs\n",
    "docs/tiny.txt": "x",
    "setup.cfg": 'name = "demo"\n',
    "src/utils/tools.py": "def f():\n    return 1\n",
}
DIRS = {"src", "docs", "src/utils"}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


if not os.path.isdir(ROOT):
    fail("/app/project is gone")
files, dirs = set(), set()
for root, dnames, fnames in os.walk(ROOT):
    for d in dnames:
        dirs.add(os.path.relpath(os.path.join(root, d), ROOT))
    for f in fnames:
        files.add(os.path.relpath(os.path.join(root, f), ROOT))
if files != set(KEEP):
    fail(f"files left: {sorted(files)}, expected {sorted(KEEP)}")
if dirs != DIRS:
    fail(f"directories left: {sorted(dirs)}, expected {sorted(DIRS)}")
for rel, content in KEEP.items():
    with open_app(os.path.join(ROOT, rel)) as f:
        if f.read() != content:
            fail(f"{rel}: contents changed")
print("OK")

"""Every inbox file sits in the subdirectory named after its extension, unchanged; none is left at the top."""
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


INBOX = "/app/inbox"
EXPECTED = {
    "md/report.md": "Quarterly report (draft)\n",
    "txt/todo.txt": "buy milk\ncall bob\n",
    "txt/notes.txt": "meeting at 10\n",
    "csv/data.csv": "id,value\n1,10\n2,20\n",
    "csv/people.csv": "id,name\n1,ann\n",
    "jpg/beach.jpg": "fake jpeg bytes 1\n",
    "jpg/cat.jpg": "fake jpeg bytes 2\n",
    "log/server.log": "2024-01-01 started\n",
    "md/changelog.md": "# Changelog\n- first\n",
    "txt/reminder.txt": "remember the keys\n",
}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


left = [n for n in os.listdir(INBOX) if os.path.isfile(os.path.join(INBOX, n))]
if left:
    fail(f"files still directly in inbox: {sorted(left)}")
found = set()
for root, _dirs, files in os.walk(INBOX):
    for name in files:
        found.add(os.path.relpath(os.path.join(root, name), INBOX))
if found != set(EXPECTED):
    fail(f"files under inbox: {sorted(found)}, expected {sorted(EXPECTED)}")
for rel, content in EXPECTED.items():
    with open_app(os.path.join(INBOX, rel)) as f:
        if f.read() != content:
            fail(f"{rel}: contents changed")
print("OK")

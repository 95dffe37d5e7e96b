"""Old .log files (by mtime) are in /app/archive, everything else is still in /app/logs, contents intact."""
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


OLD = {"web-2023-10.log", "web-2023-11.log", "web-2023-12.log", "db.log", "web-2024-legacy.log"}
KEEP = {"web-2024-01.log", "web-2024-02.log", "worker.log", "notes.txt", "old-2022.log"}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def check_dir(path, expected):
    if not os.path.isdir(path):
        fail(f"{path} is not a directory")
    names = set(os.listdir(path))
    if names != expected:
        fail(f"{path} contains {sorted(names)}, expected {sorted(expected)}")
    for name in names:
        with open_app(os.path.join(path, name)) as f:
            if f.read() != f"log file {name}\nline two\n":
                fail(f"{path}/{name}: contents changed")


check_dir("/app/archive", OLD)
check_dir("/app/logs", KEEP)
print("OK")

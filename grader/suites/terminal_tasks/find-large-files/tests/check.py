"""large_files.txt lists exactly the files under /app/data bigger than 4096 bytes."""
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


EXPECTED = {
    "logs/app.log",
    "images/big.bin",
    "reports/2024/q1.csv",
    "reports/summary.txt",
    "reports/big report.txt",
    ".cache/blob.dat",
}

try:
    with open_app("/app/large_files.txt") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
except OSError as e:
    print("FAIL: cannot read /app/large_files.txt:", e)
    sys.exit(1)
got = [line[2:] if line.startswith("./") else line for line in lines]
if len(got) != len(set(got)):
    print("FAIL: duplicate lines")
    sys.exit(1)
if set(got) != EXPECTED:
    print(f"FAIL: got {sorted(got)}, expected {sorted(EXPECTED)}")
    sys.exit(1)
print("OK")

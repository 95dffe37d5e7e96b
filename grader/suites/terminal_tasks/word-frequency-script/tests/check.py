"""Runs /app/wordfreq.py on texts the agent never saw and compares with a reference count.

The script is the agent's: it runs as the unprivileged agent user (/run/crucible/as-agent), never with the root
rights of this check."""
import os
import re
import stat
import subprocess
import sys
from collections import Counter

AS_AGENT = "/run/crucible/as-agent"  # runs its command as the agent user (uid 65534): cannot touch the reward or /tests


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


def reference(path, n):
    with (open_app(path) if path.startswith("/app/") else open(path)) as f:
        counts = Counter(w.lower() for w in re.findall(r"[A-Za-z]+", f.read()))
    return [f"{w} {c}" for w, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


CASES = [("/tests/inputs/one.txt", 5), ("/tests/inputs/one.txt", 40), ("/tests/inputs/two.txt", 6),
         ("/tests/inputs/three.txt", 3), ("/app/sample.txt", 3)]
for path, n in CASES:
    try:
        proc = subprocess.run([AS_AGENT, "python3", "/app/wordfreq.py", path, str(n)], capture_output=True, text=True,
                              timeout=20, cwd="/tmp")
    except subprocess.TimeoutExpired:
        print(f"FAIL: {path} {n} timed out")
        sys.exit(1)
    got = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    expected = reference(path, n)
    if proc.returncode != 0 or got != expected:
        print(f"FAIL: {path} {n}: exit {proc.returncode}, got {got}, expected {expected}")
        sys.exit(1)
print("OK")

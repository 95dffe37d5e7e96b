"""Every .sh file under /app/tools is 755, every other file 644; the set of files and their contents are unchanged."""
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


TOOLS = "/app/tools"
EXPECTED = {
    "build.sh": (0o755, "#!/bin/bash\necho building\n"),
    "deploy.sh": (0o755, "#!/bin/bash\necho deploying\n"),
    "README.txt": (0o644, "Run build.sh first.\n"),
    "lib/helpers.sh": (0o755, "#!/bin/bash\necho helper\n"),
    "lib/settings.conf": (0o644, "level=debug\n"),
    "ci/lint.sh": (0o755, "#!/bin/bash\necho lint\n"),
    "ci/pipeline.yml": (0o644, "stages: [build, test]\n"),
    "ci/sh.notes": (0o644, "not a script, only named like one\n"),
}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


found = set()
for root, _dirs, files in os.walk(TOOLS):
    for name in files:
        found.add(os.path.relpath(os.path.join(root, name), TOOLS))
if found != set(EXPECTED):
    fail(f"files under tools: {sorted(found)}")
for rel, (mode, content) in EXPECTED.items():
    path = os.path.join(TOOLS, rel)
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        fail(f"{rel} is not a regular file")
    if stat.S_IMODE(st.st_mode) != mode:
        fail(f"{rel}: mode {oct(stat.S_IMODE(st.st_mode))}, expected {oct(mode)}")
    with open_app(path) as f:
        if f.read() != content:
            fail(f"{rel}: contents changed")
print("OK")

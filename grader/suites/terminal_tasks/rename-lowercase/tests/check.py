"""photos holds exactly the lowercased, underscored names, each with its original contents."""
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


ORIGINAL = ["Beach Day.JPG", "My Cat.jpeg", "IMG 001.PNG", "Notes FINAL.txt", "already_fine.png",
            "Trip To Rome 2023.Jpg", "SUNSET.jpg"]
EXPECTED = {name.lower().replace(" ", "_"): f"original name: {name}\n" for name in ORIGINAL}

names = set(os.listdir("/app/photos"))
if names != set(EXPECTED):
    print(f"FAIL: photos contains {sorted(names)}, expected {sorted(EXPECTED)}")
    sys.exit(1)
for name, content in EXPECTED.items():
    with open_app(os.path.join("/app/photos", name)) as f:
        if f.read() != content:
            print(f"FAIL: {name} does not hold the contents of the original file")
            sys.exit(1)
print("OK")

"""docs-backup.tar.gz is a gzip tar holding exactly the .md files under docs/, with their contents."""
import io
import os
import stat
import sys
import tarfile


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
    "docs/guide.md": b"# Guide\nStart here.\n",
    "docs/api/endpoints.md": b"# Endpoints\nGET /items\n",
    "docs/api/auth.md": b"# Auth\nUse tokens.\n",
    "docs/drafts/idea.md": b"# Idea\nMaybe later.\n",
}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


try:
    with open_app("/app/docs-backup.tar.gz", "rb") as f:
        archive = tarfile.open(fileobj=io.BytesIO(f.read()), mode="r:gz")
except (OSError, tarfile.TarError) as e:
    fail(f"not a readable gzip tar archive: {e}")
with archive:
    found = {}
    for member in archive.getmembers():
        if member.isdir():
            continue
        name = member.name[2:] if member.name.startswith("./") else member.name
        if not member.isfile():
            fail(f"{name} is not a regular file in the archive")
        if name in found:
            fail(f"{name} stored twice")
        found[name] = archive.extractfile(member).read()
if set(found) != set(EXPECTED):
    fail(f"archive holds {sorted(found)}, expected {sorted(EXPECTED)}")
for name, content in EXPECTED.items():
    if found[name] != content:
        fail(f"{name}: contents differ")
print("OK")

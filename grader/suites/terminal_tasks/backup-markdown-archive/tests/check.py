"""docs-backup.tar.gz is a gzip tar holding exactly the .md files under docs/, with their contents."""
import sys
import tarfile

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
    archive = tarfile.open("/app/docs-backup.tar.gz", "r:gz")
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

"""No empty file or directory remains under /app/project; the non-empty files are untouched."""
import os
import sys

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
    with open(os.path.join(ROOT, rel)) as f:
        if f.read() != content:
            fail(f"{rel}: contents changed")
print("OK")

"""Runs /app/chext.sh on fresh directories the agent never saw and checks the renamed tree."""
import os
import shutil
import subprocess
import sys
import tempfile

LAYOUT = ["notes.txt", "my file.txt", "a.txt.bak", "x.txt2", "README", "txt", "report.TXT", "sub/inner.txt",
          "data.csv", ".hidden.txt", "two.words.txt"]
DIRS = ["folder.txt", "sub"]


def snapshot(root):
    out = {}
    for r, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(r, name)
            with open(p) as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


def run_case(old, new, expected_renames):
    root = tempfile.mkdtemp(prefix="chext-")
    for d in DIRS:
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for rel in LAYOUT:
        with open(os.path.join(root, rel), "w") as f:
            f.write(f"content of {rel}\n")
    try:
        proc = subprocess.run(["bash", "/app/chext.sh", root, old, new], capture_output=True, text=True,
                              timeout=20, cwd="/tmp")
    except subprocess.TimeoutExpired:
        return f"{old}->{new}: timed out"
    expected = {expected_renames.get(rel, rel): f"content of {rel}\n" for rel in LAYOUT}
    got = snapshot(root)
    dirs_ok = all(os.path.isdir(os.path.join(root, d)) for d in DIRS)
    shutil.rmtree(root, ignore_errors=True)
    if proc.returncode != 0:
        return f"{old}->{new}: exit status {proc.returncode}"
    if got != expected or not dirs_ok:
        return f"{old}->{new}: files {sorted(got)}, expected {sorted(expected)}"
    return None


CASES = [
    ("txt", "md", {"notes.txt": "notes.md", "my file.txt": "my file.md", ".hidden.txt": ".hidden.md",
                   "two.words.txt": "two.words.md"}),
    ("csv", "tsv", {"data.csv": "data.tsv"}),
    ("bak", "old", {"a.txt.bak": "a.txt.old"}),
    ("json", "yaml", {}),
]
for old, new, renames in CASES:
    error = run_case(old, new, renames)
    if error:
        print("FAIL:", error)
        sys.exit(1)
print("OK")

"""Runs /app/chext.sh on fresh directories the agent never saw and checks the renamed tree.

The script is the agent's: it runs as the unprivileged agent user (/run/crucible/as-agent), in a directory this check
made under /tmp and left writable to that user, never with the root rights of this check."""
import os
import shutil
import stat
import subprocess
import sys
import tempfile

AS_AGENT = "/run/crucible/as-agent"  # runs its command as the agent user (uid 65534): cannot touch the reward or /tests
LAYOUT = ["notes.txt", "my file.txt", "a.txt.bak", "x.txt2", "README", "txt", "report.TXT", "sub/inner.txt",
          "data.csv", ".hidden.txt", "two.words.txt"]
DIRS = ["folder.txt", "sub"]


def read_plain(path):
    """The text of a regular file the script left (a link, FIFO or unreadable entry reads as None)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read().decode(errors="replace")


def snapshot(root):
    out = {}
    for r, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(r, name)
            out[os.path.relpath(p, root)] = read_plain(p)
    return out


def run_case(old, new, expected_renames):
    root = tempfile.mkdtemp(prefix="chext-")
    os.chmod(root, 0o777)  # the agent user renames in it
    for d in DIRS:
        os.makedirs(os.path.join(root, d), exist_ok=True)
        os.chmod(os.path.join(root, d), 0o777)
    for rel in LAYOUT:
        with open(os.path.join(root, rel), "w") as f:
            f.write(f"content of {rel}\n")
        os.chmod(os.path.join(root, rel), 0o666)
    try:
        proc = subprocess.run([AS_AGENT, "bash", "/app/chext.sh", root, old, new], capture_output=True, text=True,
                              timeout=20, cwd="/tmp")
    except subprocess.TimeoutExpired:
        return f"{old}->{new}: timed out"
    expected = {expected_renames.get(rel, rel): f"content of {rel}\n" for rel in LAYOUT}
    got = snapshot(root)
    dirs_ok = all(os.path.isdir(os.path.join(root, d)) and not os.path.islink(os.path.join(root, d)) for d in DIRS)
    shutil.rmtree(root, ignore_errors=True)
    if proc.returncode != 0:
        return f"{old}->{new}: exit status {proc.returncode}: {proc.stderr.strip()[-300:]}"
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

"""Runs /app/rotate.sh on fresh directories with chosen mtimes and checks which files survive.

The script is the agent's: it runs as the unprivileged agent user (/run/crucible/as-agent), never with the root
rights of this check, in a directory this check made under /tmp and left writable to that user."""
import os
import shutil
import subprocess
import sys
import tempfile

AS_AGENT = "/run/crucible/as-agent"  # runs its command as the agent user (uid 65534): cannot touch the reward or /tests

# name -> mtime (seconds since the epoch); names deliberately do not sort like the times.
BACKUPS = {
    "backup-zeta.tar.gz": 1_700_000_000,
    "backup-alpha.tar.gz": 1_700_500_000,
    "backup-2020.tar.gz": 1_710_000_000,
    "backup-mid.tar.gz": 1_705_000_000,
    "backup-old one.tar.gz": 1_600_000_000,
    "backup-9.tar.gz": 1_720_000_000,
}
BY_AGE = sorted(BACKUPS, key=BACKUPS.get, reverse=True)  # newest first
OTHERS = {"notes.txt": 1_500_000_000, "backup-x.tar": 1_400_000_000, "mybackup-1.tar.gz": 1_400_000_000,
          "sub/backup-deep.tar.gz": 1_300_000_000}


def run_case(keep):
    root = tempfile.mkdtemp(prefix="rotate-")
    os.makedirs(os.path.join(root, "sub"))
    for d in (root, os.path.join(root, "sub")):
        os.chmod(d, 0o777)  # the agent user deletes in it (and could, wrongly, in sub/ too, as root could)
    for rel, mtime in {**BACKUPS, **OTHERS}.items():
        path = os.path.join(root, rel)
        with open(path, "w") as f:
            f.write(rel)
        os.chmod(path, 0o666)
        os.utime(path, (mtime, mtime))
    try:
        proc = subprocess.run([AS_AGENT, "bash", "/app/rotate.sh", root, str(keep)], capture_output=True, text=True,
                              timeout=20, cwd="/tmp")
    except subprocess.TimeoutExpired:
        return f"K={keep}: timed out"
    left = set()
    for r, _dirs, files in os.walk(root):
        left.update(os.path.relpath(os.path.join(r, f), root) for f in files)
    shutil.rmtree(root, ignore_errors=True)
    expected = set(BY_AGE[:keep]) | set(OTHERS)
    if proc.returncode != 0:
        return f"K={keep}: exit status {proc.returncode}: {proc.stderr.strip()[-300:]}"
    if left != expected:
        return f"K={keep}: left {sorted(left)}, expected {sorted(expected)}"
    return None


for keep in (3, 1, 0, 6, 10):
    error = run_case(keep)
    if error:
        print("FAIL:", error)
        sys.exit(1)
print("OK")

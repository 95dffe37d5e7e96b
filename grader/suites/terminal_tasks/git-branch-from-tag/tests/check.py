"""HEAD is on a new branch hotfix-1.0 at the v1.0 commit, with its files checked out; main and the tags are unchanged."""
import os
import subprocess
import sys

ENV = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
ENV.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", GIT_NO_REPLACE_OBJECTS="1", GIT_TERMINAL_PROMPT="0")


def git(*args):
    """Runs git in /app, ignoring any global config or replace refs; returns stdout, or raises."""
    proc = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd="/app", env=ENV, capture_output=True,
                          text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


V10 = "f529574343652a1a611e03db79e93d71f433483e"
MAIN = "b1f3e3e9b10384580418a4aba62cc4d1fb2e168c"
TAGS = {"v1.0": "ad1496673b935e1b43522bb3ae6eba0d7d8598e5", "v1.1": "60a80a007dde7c8571007c87b0a6f9ab637e3008"}

if git("symbolic-ref", "HEAD").strip() != "refs/heads/hotfix-1.0":
    fail("HEAD is not on branch hotfix-1.0")
if git("rev-parse", "hotfix-1.0").strip() != V10:
    fail("hotfix-1.0 does not point at the commit tagged v1.0")
if git("rev-parse", "refs/heads/main").strip() != MAIN:
    fail("main was changed")
for tag, obj in TAGS.items():
    if git("rev-parse", f"refs/tags/{tag}").strip() != obj:
        fail(f"tag {tag} was changed")
if git("status", "--porcelain").strip():
    fail("the working tree does not match hotfix-1.0")
with open("/app/version.py") as f:
    if f.read() != 'VERSION = "1.0"\n':
        fail("version.py in the working tree is not the v1.0 file")
print("OK")

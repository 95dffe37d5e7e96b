"""The three changes are one new commit "Add retry helper" on main, on top of the old history; nothing is left over."""
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


BASE = "8d2b6e5c43ccfa2d612ffc5e7119a938e9ce67a5"

if git("symbolic-ref", "HEAD").strip() != "refs/heads/main":
    fail("HEAD is not on branch main")
if git("log", "-1", "--format=%s", "main").strip() != "Add retry helper":
    fail("the last commit's message is not 'Add retry helper'")
if git("rev-parse", "main~1").strip() != BASE or git("rev-list", "--count", "main").strip() != "3":
    fail("main is not exactly one new commit on top of the original history")
files = set(git("ls-tree", "-r", "--name-only", "main").split())
if files != {"app.py", "config.ini", "utils.py"}:
    fail(f"the last commit holds {sorted(files)}")
if "from utils import retry" not in git("show", "main:app.py") or "def retry" not in git("show", "main:utils.py"):
    fail("the committed app.py/utils.py are not the modified versions")
if git("status", "--porcelain").strip():
    fail("the working tree is not clean")
print("OK")

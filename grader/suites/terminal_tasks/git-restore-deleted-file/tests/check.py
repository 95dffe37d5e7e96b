"""main gains a commit restoring docs/DEPLOY.md as it was before its deletion; the history and other files are untouched."""
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


OLD_MAIN = "a6527ad31ef604a700d264c835f5905410786e10"
FILES = {
    "README.md": "# App\nSee docs/.\n",
    "docs/USAGE.md": "# Usage\nRun app --help.\n",
    "docs/DEPLOY.md": "# Deploy\n1. build\n2. upload\n3. restart the service\n",
}

if git("symbolic-ref", "HEAD").strip() != "refs/heads/main":
    fail("HEAD is not on branch main")
head = git("rev-parse", "main").strip()
if head == OLD_MAIN:
    fail("main has no new commit")
ancestor = subprocess.run(["git", "-c", "safe.directory=*", "merge-base", "--is-ancestor", OLD_MAIN, head],
                          cwd="/app", env=ENV, capture_output=True)
if ancestor.returncode != 0:
    fail("the old history is no longer part of main (history was rewritten)")
files = set(git("ls-tree", "-r", "--name-only", "main").split())
if files != set(FILES):
    fail(f"main holds {sorted(files)}")
for name, content in FILES.items():
    if git("show", f"main:{name}") != content:
        fail(f"{name} on main does not have the expected contents")
if git("status", "--porcelain").strip():
    fail("the working tree is not clean")
print("OK")

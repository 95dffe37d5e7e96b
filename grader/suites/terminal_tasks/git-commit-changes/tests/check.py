"""The three changes are one new commit "Add retry helper" on main, on top of the old history; nothing is left over.

git runs as the unprivileged agent user (/run/crucible/as-agent), never with the root rights of this check."""
import os
import subprocess
import sys

AS_AGENT = "/run/crucible/as-agent"  # runs its command as the agent user (uid 65534): cannot touch the reward or /tests
ENV = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
ENV.update(HOME="/tmp", GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", GIT_NO_REPLACE_OBJECTS="1",
           GIT_GRAFT_FILE="/dev/null", GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0")
# Over the repository's own config (the agent's): run none of its commands, trust no cache it may have forged.
OVERRIDES = ["safe.directory=*", "core.fsmonitor=false", "core.hooksPath=/dev/null", "core.commitGraph=false",
             "core.untrackedCache=false", "core.ignoreStat=false", "status.showUntrackedFiles=normal",
             "log.showSignature=false", "advice.graftFileDeprecated=false"]


def run_git(*args):
    """Runs git on the agent's repository in /app as the agent user (its config, hooks and filters are the agent's:
    never run with this check's root rights), ignoring global config, replace refs and grafts."""
    return subprocess.run([AS_AGENT, "git", *(a for o in OVERRIDES for a in ("-c", o)), *args], cwd="/app", env=ENV,
                          capture_output=True, text=True, timeout=30)


def git(*args):
    """git's stdout, or raises."""
    proc = run_git(*args)
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
if ("from utils import retry" not in git("cat-file", "blob", "main:app.py")
        or "def retry" not in git("cat-file", "blob", "main:utils.py")):
    fail("the committed app.py/utils.py are not the modified versions")
if git("status", "--porcelain").strip():
    fail("the working tree is not clean")
print("OK")

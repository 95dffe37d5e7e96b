"""main gains a commit restoring docs/DEPLOY.md as it was before its deletion; the history and other files are untouched.

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
if run_git("merge-base", "--is-ancestor", OLD_MAIN, head).returncode != 0:
    fail("the old history is no longer part of main (history was rewritten)")
files = set(git("ls-tree", "-r", "--name-only", "main").split())
if files != set(FILES):
    fail(f"main holds {sorted(files)}")
for name, content in FILES.items():
    if git("cat-file", "blob", f"main:{name}") != content:
        fail(f"{name} on main does not have the expected contents")
if git("status", "--porcelain").strip():
    fail("the working tree is not clean")
print("OK")

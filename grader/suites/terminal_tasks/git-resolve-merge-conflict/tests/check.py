"""main ends with a merge commit of the old main and feature; config.py holds the agreed settings; both sides' other changes are kept.

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


OLD_MAIN = "c97711b06e9c774b7a0098814d71b6de16599887"
FEATURE = "01d79f0e8376ebd412f565df63cba6fff3e1badf"
CONFIG = ['HOST = "localhost"', "PORT = 9000", "TIMEOUT = 45", "RETRIES = 3"]

if git("symbolic-ref", "HEAD").strip() != "refs/heads/main":
    fail("HEAD is not on branch main")
parents = git("log", "-1", "--format=%P", "main").split()
if parents != [OLD_MAIN, FEATURE]:
    fail(f"the last commit on main has parents {parents}, expected the old main and feature")
config = [line.strip() for line in git("cat-file", "blob", "main:config.py").splitlines() if line.strip()]
if sorted(config) != sorted(CONFIG):
    fail(f"committed config.py is {config}")
if git("cat-file", "blob", "main:feature.py") != 'def run():\n    return "feature"\n':
    fail("feature.py from the feature branch is missing or changed")
if git("cat-file", "blob", "main:README.md") != "# Service\nRuns on port 9000.\n":
    fail("README.md from main is missing or changed")
if git("status", "--porcelain").strip():
    fail("the working tree is not clean")
print("OK")

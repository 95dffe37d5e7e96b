"""HEAD is on a new branch hotfix-1.0 at the v1.0 commit, with its files checked out; main and the tags are unchanged.

git runs as the unprivileged agent user (/run/crucible/as-agent), never with the root rights of this check."""
import os
import stat
import subprocess
import sys


def open_app(path, mode="r", **kwargs):
    """open() for a file the agent left in /app. This check runs as root: it accepts only a regular file that really
    lies in /app (not a link to a file of /tests, which would read as the expected answer; not a FIFO that blocks)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or not os.readlink(f"/proc/self/fd/{fd}").startswith("/app/"):
            raise OSError(f"{path} is not a regular file in /app")
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


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
with open_app("/app/version.py") as f:
    if f.read() != 'VERSION = "1.0"\n':
        fail("version.py in the working tree is not the v1.0 file")
print("OK")

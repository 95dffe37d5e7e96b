"""v2.0 is an annotated tag with message 'Version 2.0' on the 'Release 2.0' commit; main is unchanged.

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


RELEASE = "9b8e9e031391e63f30673e7a6c5c32dae7441302"
MAIN = "98b645dfed54ab2be85c8edeb63b36a3b99b22ec"

try:
    kind = git("cat-file", "-t", "refs/tags/v2.0").strip()
except RuntimeError:
    fail("there is no tag v2.0")
if kind != "tag":
    fail("v2.0 is a lightweight tag, not an annotated one")
if git("rev-parse", "refs/tags/v2.0^{commit}").strip() != RELEASE:
    fail("v2.0 does not point at the 'Release 2.0' commit")
message = git("tag", "-l", "--format=%(contents:subject)", "v2.0").strip()
if message != "Version 2.0":
    fail(f"the tag message is {message!r}")
if git("rev-parse", "refs/heads/main").strip() != MAIN:
    fail("main was changed")
print("OK")

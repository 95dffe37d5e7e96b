"""v2.0 is an annotated tag with message 'Version 2.0' on the 'Release 2.0' commit; main is unchanged."""
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

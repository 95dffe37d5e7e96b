"""main ends with a merge commit of the old main and feature; config.py holds the agreed settings; both sides' other changes are kept."""
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


OLD_MAIN = "c97711b06e9c774b7a0098814d71b6de16599887"
FEATURE = "01d79f0e8376ebd412f565df63cba6fff3e1badf"
CONFIG = ['HOST = "localhost"', "PORT = 9000", "TIMEOUT = 45", "RETRIES = 3"]

if git("symbolic-ref", "HEAD").strip() != "refs/heads/main":
    fail("HEAD is not on branch main")
parents = git("log", "-1", "--format=%P", "main").split()
if parents != [OLD_MAIN, FEATURE]:
    fail(f"the last commit on main has parents {parents}, expected the old main and feature")
config = [line.strip() for line in git("show", "main:config.py").splitlines() if line.strip()]
if sorted(config) != sorted(CONFIG):
    fail(f"committed config.py is {config}")
if git("show", "main:feature.py") != 'def run():\n    return "feature"\n':
    fail("feature.py from the feature branch is missing or changed")
if git("show", "main:README.md") != "# Service\nRuns on port 9000.\n":
    fail("README.md from main is missing or changed")
if git("status", "--porcelain").strip():
    fail("the working tree is not clean")
print("OK")

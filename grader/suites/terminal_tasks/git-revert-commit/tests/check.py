"""main keeps its whole old history and gains commits that undo 'Break the parser' only; the tree is clean."""
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


OLD_MAIN = "1bbfc85e69a9ffc49ca789be136576388615a523"
PARSER = 'def parse(line):\n    key, value = line.split("=", 1)\n    return key.strip(), value.strip()\n'
KEPT = {
    "main.py": 'from parser import parse\n\nprint(parse("a = 1"))\n',
    "README.md": "# Parser\nSplits key = value lines.\n",
    "sample.txt": "a = 1\nb = 2\n",
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
if git("show", "main:parser.py") != PARSER:
    fail("parser.py on main is not the version from before 'Break the parser'")
files = set(git("ls-tree", "-r", "--name-only", "main").split())
if files != {"parser.py", *KEPT}:
    fail(f"main holds {sorted(files)}")
for name, content in KEPT.items():
    if git("show", f"main:{name}") != content:
        fail(f"{name} lost the changes of later commits")
if git("status", "--porcelain").strip():
    fail("the working tree is not clean")
print("OK")

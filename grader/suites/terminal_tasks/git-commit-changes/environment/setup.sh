#!/bin/bash
# Builds the git repository in /app with fixed identities and dates, so every run gives the same hashes.
set -e
rm -f .keep
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
T=1704103200  # 2024-01-01 10:00:00 UTC; each commit is one hour later
commit() {  # commit [AUTHOR_NAME AUTHOR_EMAIL] -m MESSAGE ...
    local name=dev email=dev@example.com
    if [ "$1" != -m ]; then name=$1 email=$2; shift 2; fi
    T=$((T + 3600))
    GIT_AUTHOR_DATE="@$T +0000" GIT_COMMITTER_DATE="@$T +0000" \
        git -c user.name="$name" -c user.email="$email" commit -q "$@"
}
git init -q -b main
git config user.name dev
git config user.email dev@example.com

cat > app.py <<'PY'
def main():
    print("hello")
PY
printf 'Old notes, no longer needed.\n' > old.txt
git add -A && commit -m "Initial commit"
printf 'retries = 3\n' > config.ini
git add -A && commit -m "Add config"

# Uncommitted work the agent must commit: a modification, a new file, a deletion.
cat > app.py <<'PY'
from utils import retry


def main():
    retry(lambda: print("hello"))
PY
cat > utils.py <<'PY'
def retry(fn, times=3):
    for _ in range(times):
        try:
            return fn()
        except Exception:
            pass
PY
rm old.txt

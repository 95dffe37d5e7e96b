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

printf 'HOST = "localhost"\nPORT = 8000\nTIMEOUT = 30\n' > config.py
printf '# Service\n' > README.md
git add -A && commit -m "Initial config"
git checkout -q -b feature
printf 'HOST = "localhost"\nPORT = 8000\nTIMEOUT = 45\nRETRIES = 3\n' > config.py
printf 'def run():\n    return "feature"\n' > feature.py
git add -A && commit -m "Longer timeout, retries, feature module"
git checkout -q main
printf 'HOST = "localhost"\nPORT = 9000\nTIMEOUT = 60\n' > config.py
printf '# Service\nRuns on port 9000.\n' > README.md
git add -A && commit -m "Move to port 9000"
# Leave the repository in the middle of a conflicted merge.
git -c user.name=dev -c user.email=dev@example.com merge feature >/dev/null 2>&1 || true

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

printf '1.9\n' > VERSION
git add -A && commit -m "Release 1.9"
printf '2.0\n' > VERSION
printf 'print("v2")\n' > app.py
git add -A && commit -m "Release 2.0"
printf 'print("v2, faster")\n' > app.py
git add -A && commit -m "Speed up startup"
printf '2.1-dev\n' > VERSION
git add -A && commit -m "Start 2.1 development"

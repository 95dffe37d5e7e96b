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

printf 'VERSION = "0.9"\n' > version.py
git add -A && commit -m "Start project"
printf 'VERSION = "1.0"\n' > version.py
git add -A && commit -m "Release 1.0"
GIT_COMMITTER_DATE="@$T +0000" git -c user.name=dev -c user.email=dev@example.com tag -a v1.0 -m "Version 1.0"
printf 'def feature():\n    return 1\n' > feature.py
git add -A && commit -m "Add feature"
printf 'VERSION = "1.1"\n' > version.py
git add -A && commit -m "Release 1.1"
GIT_COMMITTER_DATE="@$T +0000" git -c user.name=dev -c user.email=dev@example.com tag -a v1.1 -m "Version 1.1"
printf 'def feature():\n    return 2\n' > feature.py
git add -A && commit -m "Work in progress"

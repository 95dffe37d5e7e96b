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

mkdir -p docs
printf '# App\n' > README.md
printf '# Deploy\n1. build\n' > docs/DEPLOY.md
git add -A && commit -m "Add docs"
printf '# Deploy\n1. build\n2. upload\n3. restart the service\n' > docs/DEPLOY.md
git add -A && commit -m "Document the deploy steps"
printf '# Usage\nRun app.\n' > docs/USAGE.md
git add -A && commit -m "Add usage"
git rm -q docs/DEPLOY.md
printf '# App\nSee docs/.\n' > README.md
git add -A && commit -m "Clean up docs"
printf '# Usage\nRun app --help.\n' > docs/USAGE.md
git add -A && commit -m "Improve usage"

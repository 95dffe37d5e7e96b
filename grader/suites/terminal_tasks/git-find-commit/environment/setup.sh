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

printf 'NAME = "shop"\n' > settings.py
git add -A && commit -m "Initial settings"
printf 'def handler():\n    pass\n' > views.py
git add -A && commit alice alice@example.com -m "Add views"
printf 'NAME = "shop"\nLOG_LEVEL = "info"\n' > settings.py
git add -A && commit bob bob@example.com -m "Prepare debug mode switch"
printf 'NAME = "shop"\nLOG_LEVEL = "info"\nCACHE = "redis"\n' > settings.py
git add -A && commit alice alice@example.com -m "Configure cache"
printf 'NAME = "shop"\nLOG_LEVEL = "info"\nDEBUG_MODE = True\nCACHE = "redis"\n' > settings.py
printf 'def handler():\n    return 200\n' > views.py
git add -A && commit carol carol@example.com -m "Tweak handler and settings"
printf '# Shop\n' > README.md
git add -A && commit bob bob@example.com -m "Add README"
printf 'NAME = "shop"\nLOG_LEVEL = "debug"\nDEBUG_MODE = True\nCACHE = "redis"\n' > settings.py
git add -A && commit alice alice@example.com -m "Enable debug mode logging"
printf 'NAME = "shop"\nLOG_LEVEL = "debug"\nDEBUG_MODE = True\nCACHE = "memcached"\n' > settings.py
git add -A && commit carol carol@example.com -m "Switch cache"

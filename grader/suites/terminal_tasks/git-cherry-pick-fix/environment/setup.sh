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

cat > pagination.py <<'PY'
def page(items, number, size=10):
    start = number * size + 1
    return items[start:start + size]
PY
printf 'PAGE_SIZE = 10\n' > config.py
git add -A && commit -m "Add pagination"
git checkout -q -b dev
printf 'def search(items, text):\n    return [i for i in items if text in i]\n' > search.py
git add -A && commit -m "Add experimental search"
cat > pagination.py <<'PY'
def page(items, number, size=10):
    start = number * size
    return items[start:start + size]
PY
git add -A && commit -m "Fix off-by-one in pagination"
printf 'ITEMS_PER_PAGE = 10\n' > config.py
git add -A && commit -m "Rename config keys"
git checkout -q main
printf '# Pager\n' > README.md
git add -A && commit -m "Add README"

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

cat > parser.py <<'PY'
def parse(line):
    key, value = line.split("=", 1)
    return key.strip(), value.strip()
PY
printf 'from parser import parse\n' > main.py
git add -A && commit -m "Add parser"
printf 'from parser import parse\n\nprint(parse("a = 1"))\n' > main.py
git add -A && commit -m "Use the parser"
cat > parser.py <<'PY'
def parse(line):
    key, value = line.split(":")
    return key, value
PY
git add -A && commit -m "Break the parser"
printf '# Parser\nSplits key = value lines.\n' > README.md
git add -A && commit -m "Add README"
printf 'a = 1\nb = 2\n' > sample.txt
git add -A && commit -m "Add sample input"

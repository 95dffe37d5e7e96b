#!/bin/bash
# Empty files and directories (git keeps no empty directories, so they are made here).
set -e
cd /app/project
: > src/__init__.py
: > docs/empty.md
mkdir -p build/tmp/cache logs old/nested
: > old/nested/placeholder
: > .gitkeep
mkdir -p src/utils
printf 'def f():\n    return 1\n' > src/utils/tools.py
: > src/utils/notes.txt

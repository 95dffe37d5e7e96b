#!/bin/bash
set -e
cd /app
bad=$(git log --format=%H --grep='^Break the parser$' main)
git revert --no-edit "$bad" >/dev/null

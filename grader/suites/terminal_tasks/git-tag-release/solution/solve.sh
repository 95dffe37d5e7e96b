#!/bin/bash
set -e
cd /app
commit=$(git log --format=%H --grep='^Release 2.0$' main)
git tag -a v2.0 -m "Version 2.0" "$commit"

#!/bin/bash
set -e
cd /app
git log --format=%an main | sort | uniq -c | sort -rn | sed -E 's/^ *([0-9]+) /\1 /' > /app/authors.txt

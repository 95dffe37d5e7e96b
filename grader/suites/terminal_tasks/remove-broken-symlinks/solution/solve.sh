#!/bin/bash
set -e
cd /app/links
# test -e follows the link: false for a missing target and for a loop.
find . -type l ! -exec test -e {} \; -print | sed 's|^\./||' | sort > /app/broken.txt
while IFS= read -r link; do
    rm -f -- "$link"
done < /app/broken.txt

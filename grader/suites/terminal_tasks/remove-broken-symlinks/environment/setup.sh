#!/bin/bash
# Builds /app/links: regular files, working symlinks and broken ones (missing targets, a loop).
set -e
rm -f /app/.keep
mkdir -p /app/links/real /app/links/sub
cd /app/links
printf 'mode: production\n' > real/config.yml
printf '42\n' > real/data.txt
ln -s real/config.yml current
ln -s real/data.txt data
ln -s real/config.old old-config
ln -s ../real/data.txt sub/up
ln -s ../missing/file sub/gone
ln -s /app/links/real/data.txt abs-ok
ln -s /app/nowhere abs-broken
ln -s real dirlink
ln -s loop2 loop1
ln -s loop1 loop2

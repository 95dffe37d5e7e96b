#!/bin/bash
set -e
cd /app/photos
for f in *; do
    new=$(printf '%s' "$f" | tr 'A-Z ' 'a-z_')
    if [ "$f" != "$new" ]; then
        mv -- "$f" "$new"
    fi
done

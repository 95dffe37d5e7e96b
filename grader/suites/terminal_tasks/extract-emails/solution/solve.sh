#!/bin/bash
set -e
cat /app/messages/*.txt \
    | grep -oE '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]+' \
    | tr 'A-Z' 'a-z' | LC_ALL=C sort -u > /app/emails.txt

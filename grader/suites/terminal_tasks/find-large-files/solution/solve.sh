#!/bin/bash
set -e
cd /app/data
find . -type f -size +4096c | sed 's|^\./||' | sort > /app/large_files.txt

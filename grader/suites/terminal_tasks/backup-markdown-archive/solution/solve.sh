#!/bin/bash
set -e
cd /app
find docs -type f -name '*.md' | sort > /tmp/md-files.txt
tar -czf /app/docs-backup.tar.gz -T /tmp/md-files.txt

#!/bin/bash
set -e
mkdir -p /app/archive
find /app/logs -maxdepth 1 -type f -name '*.log' ! -newermt '2024-01-01 00:00:00 UTC' -exec mv {} /app/archive/ \;

#!/bin/bash
set -e
find /app/lib -type f -name '*.py' -exec sed -i -E 's/\bold_fetch\b/fetch_data/g' {} +

#!/bin/bash
set -e
find /app/tools -type f -name '*.sh' -exec chmod 755 {} +
find /app/tools -type f ! -name '*.sh' -exec chmod 644 {} +

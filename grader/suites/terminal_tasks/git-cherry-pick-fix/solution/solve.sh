#!/bin/bash
set -e
cd /app
fix=$(git log --format=%H --grep='^Fix off-by-one in pagination$' dev)
git checkout -q main
git cherry-pick "$fix" >/dev/null

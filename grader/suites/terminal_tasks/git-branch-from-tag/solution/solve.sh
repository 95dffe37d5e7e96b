#!/bin/bash
set -e
cd /app
git checkout -q -b hotfix-1.0 v1.0

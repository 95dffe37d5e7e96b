#!/bin/bash
set -e
cd /app
git log --format=%H -S 'DEBUG_MODE = True' -- settings.py | tail -1 > /app/answer.txt

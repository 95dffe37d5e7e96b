#!/bin/bash
set -e
grep -v -E '^[[:space:]]*(#|$)' /app/app.conf > /app/clean.conf

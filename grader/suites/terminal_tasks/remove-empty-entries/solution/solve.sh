#!/bin/bash
set -e
find /app/project -mindepth 1 -empty -delete

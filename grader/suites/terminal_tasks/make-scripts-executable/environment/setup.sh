#!/bin/bash
# Modes cannot travel as plain files: set a deliberately wrong mix.
set -e
cd /app/tools
chmod 755 lib ci
chmod 644 build.sh ci/lint.sh ci/pipeline.yml lib/settings.conf
chmod 600 deploy.sh
chmod 700 lib/helpers.sh
chmod 755 README.txt ci/sh.notes

#!/bin/bash
# The task's instruction on stdin names the project ("... of the Python project NAME."); its released library files,
# packed under /harness/release/NAME/ at their paths in the sdist, are copied over /app. No model is called.
project=$(grep -o 'the Python project [A-Za-z0-9_.-]*' | head -1 | awk '{print $4}' | sed 's/\.$//')
release=/harness/release/$project
[ -n "$project" ] && [ -d "$release" ] || { echo "no release packed for '$project'"; exit 0; }
cp -r "$release/." /app/
echo "restored $project's released library files over /app"

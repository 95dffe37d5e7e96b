#!/bin/bash
set -e
cat > /app/flatten.py <<'SCRIPT'
import json
import sys


def walk(value, path):
    if isinstance(value, dict) and value:
        for key, child in value.items():
            yield from walk(child, path + [str(key)])
    elif isinstance(value, list) and value:
        for i, child in enumerate(value):
            yield from walk(child, path + [str(i)])
    else:
        yield ".".join(path), json.dumps(value)


for path, value in walk(json.load(sys.stdin), []):
    print(f"{path}={value}")
SCRIPT

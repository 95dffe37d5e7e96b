#!/bin/bash
set -e
python3 - <<'PY'
import json


def merge(base, override):
    out = dict(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


with open("/app/defaults.json") as f:
    defaults = json.load(f)
with open("/app/overrides.json") as f:
    overrides = json.load(f)
with open("/app/merged.json", "w") as f:
    json.dump(merge(defaults, overrides), f, indent=2)
PY

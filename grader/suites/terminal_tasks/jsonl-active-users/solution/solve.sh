#!/bin/bash
set -e
python3 - <<'PY'
import json

with open("/app/users.jsonl") as f:
    users = [json.loads(line) for line in f if line.strip()]
names = sorted(u["name"] for u in users if u.get("active") is True)
with open("/app/active.txt", "w") as f:
    f.write("".join(name + "\n" for name in names))
PY

#!/bin/bash
set -e
python3 - <<'PY'
import json

with open("/app/events.json") as f:
    events = json.load(f)
counts, users = {}, {}
for event in events:
    counts[event["type"]] = counts.get(event["type"], 0) + 1
    users.setdefault(event["type"], set()).add(event["user"])
result = {t: {"events": counts[t], "users": len(users[t])} for t in counts}
with open("/app/event_counts.json", "w") as f:
    json.dump(result, f, indent=2, sort_keys=True)
PY

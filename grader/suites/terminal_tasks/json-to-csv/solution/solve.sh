#!/bin/bash
set -e
python3 - <<'PY'
import csv
import json

with open("/app/users.json") as f:
    users = json.load(f)
with open("/app/users.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["id", "name", "email"])
    for user in sorted(users, key=lambda u: u["id"]):
        writer.writerow([user["id"], user["name"], user["email"]])
PY

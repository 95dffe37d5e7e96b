"""event_counts.json maps every event type to its event count and distinct-user count (/tests/expected.json)."""
import json
import sys

with open("/tests/expected.json") as f:
    expected = json.load(f)
try:
    with open("/app/event_counts.json") as f:
        got = json.load(f)
except (OSError, ValueError) as e:
    print("FAIL: cannot read /app/event_counts.json as JSON:", e)
    sys.exit(1)
if got != expected or any(type(v) is not int for entry in got.values() for v in entry.values()):
    print(f"FAIL: got {got}, expected {expected}")
    sys.exit(1)
print("OK")

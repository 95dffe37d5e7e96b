"""merged.json equals the deep merge of overrides into defaults (/tests/expected.json)."""
import json
import sys

with open("/tests/expected.json") as f:
    expected = json.load(f)
try:
    with open("/app/merged.json") as f:
        got = json.load(f)
except (OSError, ValueError) as e:
    print("FAIL: cannot read /app/merged.json as JSON:", e)
    sys.exit(1)
if got != expected:
    print(f"FAIL: got {json.dumps(got, sort_keys=True)}\n expected {json.dumps(expected, sort_keys=True)}")
    sys.exit(1)
print("OK")

"""Feeds /app/flatten.py JSON documents it never saw and compares the set of PATH=VALUE lines.

The script is the agent's: it runs as the unprivileged agent user (/run/crucible/as-agent), never with the root
rights of this check."""
import json
import subprocess
import sys

AS_AGENT = "/run/crucible/as-agent"  # runs its command as the agent user (uid 65534): cannot touch the reward or /tests


def reference(value, path=()):
    if isinstance(value, dict) and value:
        for key, child in value.items():
            yield from reference(child, path + (str(key),))
    elif isinstance(value, list) and value:
        for i, child in enumerate(value):
            yield from reference(child, path + (str(i),))
    else:
        yield ".".join(path) + "=" + json.dumps(value)


for path in ("/tests/inputs/1.json", "/tests/inputs/2.json", "/tests/inputs/3.json"):
    with open(path) as f:
        text = f.read()
    expected = sorted(reference(json.loads(text)))
    try:
        proc = subprocess.run([AS_AGENT, "python3", "/app/flatten.py"], input=text, capture_output=True, text=True,
                              timeout=20, cwd="/tmp")
    except subprocess.TimeoutExpired:
        print(f"FAIL: {path} timed out")
        sys.exit(1)
    got = sorted(line for line in proc.stdout.splitlines() if line.strip())
    if proc.returncode != 0 or got != expected:
        print(f"FAIL: {path}: exit {proc.returncode}\n got      {got}\n expected {expected}")
        sys.exit(1)
print("OK")

"""Only the [server] port line changed, to 8080 (spacing around '=' is free)."""
import re
import sys

ORIGINAL = """; Service configuration
[server]
host = 0.0.0.0
port = 8000
workers = 4

[database]
host = db.internal
port = 5432
name = shop

[cache]
host = cache.internal
port = 6379
; port = 8000 was the old cache port
""".splitlines()
SERVER_PORT_LINE = 3

try:
    with open("/app/settings.ini") as f:
        got = f.read().splitlines()
except OSError as e:
    print("FAIL: cannot read /app/settings.ini:", e)
    sys.exit(1)
while got and not got[-1].strip():
    got.pop()
if len(got) != len(ORIGINAL):
    print(f"FAIL: the file has {len(got)} lines, expected {len(ORIGINAL)}")
    sys.exit(1)
for i, (line, orig) in enumerate(zip(got, ORIGINAL)):
    if i == SERVER_PORT_LINE:
        if not re.fullmatch(r"port\s*=\s*8080\s*", line):
            print(f"FAIL: [server] port line is {line!r}")
            sys.exit(1)
    elif line != orig:
        print(f"FAIL: line {i + 1} changed: {line!r} (was {orig!r})")
        sys.exit(1)
print("OK")

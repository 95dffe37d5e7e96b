"""todos.txt names every line under src/ containing TODO, as path:line."""
import sys

EXPECTED = {"src/main.py:3", "src/main.py:7", "src/api/handlers.py:7", "src/api/handlers.py:8",
            "src/web/app.js:3", "src/web/app.js:4"}

try:
    with open("/app/todos.txt") as f:
        got = [line.strip() for line in f if line.strip()]
except OSError as e:
    print("FAIL: cannot read /app/todos.txt:", e)
    sys.exit(1)
got = [g[2:] if g.startswith("./") else g for g in got]
if len(got) != len(set(got)) or set(got) != EXPECTED:
    print(f"FAIL: got {sorted(got)}, expected {sorted(EXPECTED)}")
    sys.exit(1)
print("OK")

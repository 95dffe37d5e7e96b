"""answer.txt holds the full hash of the commit that added DEBUG_MODE = True (fixed: the setup's history is deterministic)."""
import sys

EXPECTED = "25aa8ad198317a6f3fa2bc2a2bf35e515ac79292"

try:
    with open("/app/answer.txt") as f:
        got = f.read().strip().lower()
except OSError as e:
    print("FAIL: cannot read /app/answer.txt:", e)
    sys.exit(1)
if got != EXPECTED:
    print(f"FAIL: answer is {got!r}")
    sys.exit(1)
print("OK")

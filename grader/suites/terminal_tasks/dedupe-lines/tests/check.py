"""unique_urls.txt equals the first-occurrence deduplication of urls.txt (/tests/expected.txt)."""
import sys

with open("/tests/expected.txt") as f:
    expected = f.read().splitlines()
try:
    with open("/app/unique_urls.txt") as f:
        got = f.read().splitlines()
except OSError as e:
    print("FAIL: cannot read /app/unique_urls.txt:", e)
    sys.exit(1)
while got and not got[-1]:
    got.pop()
if got != expected:
    print(f"FAIL: got {len(got)} lines, expected {len(expected)}; first difference:",
          next(((i, g, e) for i, (g, e) in enumerate(zip(got, expected)) if g != e), "length"))
    sys.exit(1)
print("OK")

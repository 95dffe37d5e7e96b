"""emails.txt lists each distinct address once, lowercased, sorted."""
import sys

EXPECTED = [
    "alice.smith@example.com",
    "bob_93@mail.test",
    "carol+news@lists.example.net",
    "dave.o-neil@sub.domain.example",
    "feedback@product.example.org",
    "sales@example.com",
    "support@help-desk.example.io",
    "team@example.com",
]

try:
    with open("/app/emails.txt") as f:
        got = [line.strip() for line in f if line.strip()]
except OSError as e:
    print("FAIL: cannot read /app/emails.txt:", e)
    sys.exit(1)
if got != EXPECTED:
    print(f"FAIL: got {got}, expected {EXPECTED}")
    sys.exit(1)
print("OK")

"""Feeds /app/check_ip.py addresses it never saw, one per line, and compares the verdicts.

The script is the agent's: it runs as the unprivileged agent user (/run/crucible/as-agent), never with the root
rights of this check."""
import subprocess
import sys

AS_AGENT = "/run/crucible/as-agent"  # runs its command as the agent user (uid 65534): cannot touch the reward or /tests

CASES = [
    ("1.2.3.4", "valid"), ("255.255.255.255", "valid"), ("0.0.0.0", "valid"), ("10.20.30.40", "valid"),
    ("127.0.0.1", "valid"), ("100.200.249.250", "valid"), ("9.99.199.0", "valid"),
    ("256.0.0.1", "invalid"), ("1.2.3", "invalid"), ("1.2.3.4.5", "invalid"), ("1..3.4", "invalid"),
    ("01.2.3.4", "invalid"), ("1.2.3.00", "invalid"), ("1.2.3.-4", "invalid"), ("+1.2.3.4", "invalid"),
    (" 1.2.3.4", "invalid"), ("1.2.3.4 ", "invalid"), ("a.b.c.d", "invalid"), ("1.2.3.4a", "invalid"),
    ("", "invalid"), ("1234.1.1.1", "invalid"), ("1.2.3.", "invalid"), (".1.2.3", "invalid"),
    ("300.300.300.300", "invalid"), ("1.2.3.4\t", "invalid"), ("0x1.2.3.4", "invalid"), ("1,2,3,4", "invalid"),
    ("192.168.1.1", "valid"), ("\u0661.2.3.4", "invalid"),
]

stdin = "".join(line + "\n" for line, _ in CASES)
try:
    proc = subprocess.run([AS_AGENT, "python3", "/app/check_ip.py"], input=stdin, capture_output=True, text=True,
                          timeout=20, cwd="/tmp")
except subprocess.TimeoutExpired:
    print("FAIL: timed out")
    sys.exit(1)
got = [line.strip() for line in proc.stdout.splitlines()]
if proc.returncode != 0 or len(got) != len(CASES):
    print(f"FAIL: exit {proc.returncode}, {len(got)} output lines for {len(CASES)} input lines")
    sys.exit(1)
for (line, expected), verdict in zip(CASES, got):
    if verdict != expected:
        print(f"FAIL: {line!r}: printed {verdict!r}, expected {expected!r}")
        sys.exit(1)
print("OK")

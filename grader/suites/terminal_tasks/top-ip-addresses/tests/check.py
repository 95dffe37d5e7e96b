"""top_ips.txt lists the three busiest client IPs with their request counts, busiest first."""
import sys

EXPECTED = [["41", "192.168.1.20"], ["30", "10.0.0.5"], ["22", "10.0.0.12"]]

try:
    with open("/app/top_ips.txt") as f:
        got = [line.split() for line in f if line.strip()]
except OSError as e:
    print("FAIL: cannot read /app/top_ips.txt:", e)
    sys.exit(1)
if got != EXPECTED:
    print(f"FAIL: got {got}, expected {EXPECTED}")
    sys.exit(1)
print("OK")

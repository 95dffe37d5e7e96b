"""large_files.txt lists exactly the files under /app/data bigger than 4096 bytes."""
import sys

EXPECTED = {
    "logs/app.log",
    "images/big.bin",
    "reports/2024/q1.csv",
    "reports/summary.txt",
    "reports/big report.txt",
    ".cache/blob.dat",
}

try:
    with open("/app/large_files.txt") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
except OSError as e:
    print("FAIL: cannot read /app/large_files.txt:", e)
    sys.exit(1)
got = [line[2:] if line.startswith("./") else line for line in lines]
if len(got) != len(set(got)):
    print("FAIL: duplicate lines")
    sys.exit(1)
if set(got) != EXPECTED:
    print(f"FAIL: got {sorted(got)}, expected {sorted(EXPECTED)}")
    sys.exit(1)
print("OK")

"""Runs /app/fizzbuzz.sh for several N and compares with a reference FizzBuzz.

The script is the agent's: it runs as the unprivileged agent user (/run/crucible/as-agent), never with the root
rights of this check."""
import subprocess
import sys

AS_AGENT = "/run/crucible/as-agent"  # runs its command as the agent user (uid 65534): cannot touch the reward or /tests


def reference(n):
    out = []
    for i in range(1, n + 1):
        out.append("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i))
    return out


for n in (1, 2, 7, 15, 31, 100):
    try:
        proc = subprocess.run([AS_AGENT, "bash", "/app/fizzbuzz.sh", str(n)], capture_output=True, text=True,
                              timeout=20, cwd="/tmp")
    except subprocess.TimeoutExpired:
        print(f"FAIL: N={n} timed out")
        sys.exit(1)
    got = [line.rstrip() for line in proc.stdout.splitlines()]
    while got and not got[-1]:
        got.pop()
    if proc.returncode != 0 or got != reference(n):
        print(f"FAIL: N={n}: exit {proc.returncode}, output {got[:20]}")
        sys.exit(1)
print("OK")

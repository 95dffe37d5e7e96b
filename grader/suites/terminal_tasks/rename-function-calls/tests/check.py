"""The .py files under /app/lib equal /tests/expected/ (only the identifier renamed); CHANGELOG.md is untouched."""
import os
import sys

EXPECTED_DIR = "/tests/expected"


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


for root, _dirs, files in os.walk(EXPECTED_DIR):
    for name in files:
        rel = os.path.relpath(os.path.join(root, name), EXPECTED_DIR)
        with open(os.path.join(root, name)) as f:
            expected = f.read()
        try:
            with open(os.path.join("/app/lib", rel)) as f:
                got = f.read()
        except OSError as e:
            fail(f"cannot read lib/{rel}: {e}")
        if got.rstrip("\n") != expected.rstrip("\n"):
            fail(f"lib/{rel} is not as expected")
with open("/app/lib/CHANGELOG.md") as f:
    if f.read() != "- 1.2: old_fetch gained a retries argument\n":
        fail("lib/CHANGELOG.md was modified")
print("OK")

"""Every inbox file sits in the subdirectory named after its extension, unchanged; none is left at the top."""
import os
import sys

INBOX = "/app/inbox"
EXPECTED = {
    "md/report.md": "Quarterly report (draft)\n",
    "txt/todo.txt": "buy milk\ncall bob\n",
    "txt/notes.txt": "meeting at 10\n",
    "csv/data.csv": "id,value\n1,10\n2,20\n",
    "csv/people.csv": "id,name\n1,ann\n",
    "jpg/beach.jpg": "fake jpeg bytes 1\n",
    "jpg/cat.jpg": "fake jpeg bytes 2\n",
    "log/server.log": "2024-01-01 started\n",
    "md/changelog.md": "# Changelog\n- first\n",
    "txt/reminder.txt": "remember the keys\n",
}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


left = [n for n in os.listdir(INBOX) if os.path.isfile(os.path.join(INBOX, n))]
if left:
    fail(f"files still directly in inbox: {sorted(left)}")
found = set()
for root, _dirs, files in os.walk(INBOX):
    for name in files:
        found.add(os.path.relpath(os.path.join(root, name), INBOX))
if found != set(EXPECTED):
    fail(f"files under inbox: {sorted(found)}, expected {sorted(EXPECTED)}")
for rel, content in EXPECTED.items():
    with open(os.path.join(INBOX, rel)) as f:
        if f.read() != content:
            fail(f"{rel}: contents changed")
print("OK")

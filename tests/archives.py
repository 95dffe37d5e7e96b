"""Harness archives the tests upload: any files with a ``harness.toml``, a bash script, and the oracle that knows every
shipped terminal task's solution. Shared by the grader's rollout tests and the live compose test."""

from __future__ import annotations

import hashlib
import io
import tarfile
from typing import Any

from grader.suites.terminal import TASKS_DIR, tasks


def archive(files: dict[str, str | bytes], manifest: str | None = None) -> bytes:
    """A .tar.gz of ``files`` (name → content) with ``manifest`` as harness.toml."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, content in ({"harness.toml": manifest} if manifest is not None else {}).items() | files.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def code_harness(script: str, **limits: Any) -> bytes:
    """An archive whose entry runs ``script`` with bash; ``limits`` are its declared ``[limits]``."""
    extra = "".join(f"{k} = {v}\n" for k, v in limits.items())
    return archive({"run.sh": script}, 'name = "test"\nentry = "bash /harness/run.sh"\n' + (f"[limits]\n{extra}" if extra else ""))


FAMILY_SOLVER = r"""
import collections, csv, json, re, sys
text = sys.stdin.read()
source = "/app/" + re.search(r"`/app/([^`]+)`", text).group(1)
def write(name, lines):
    open("/app/" + name, "w").write("\n".join(lines) + "\n")
if "application log" in text:
    level = re.search(r"whose level is `(\w+)`", text).group(1)
    write("count.txt", [str(sum(1 for line in open(source) if line.split()[2] == f"[{level}]"))])
elif "Write the sum of its column" in text:
    column = re.search(r"column `(\w+)`", text).group(1)
    write("sum.txt", [f"{sum(float(r[column]) for r in csv.DictReader(open(source))):.2f}"])
elif "some repeated" in text:
    write("unique.txt", list(dict.fromkeys(open(source).read().splitlines())))
elif "email address" in text:
    write("emails.txt", sorted(set(re.findall(r"[\w.+-]+@[\w-]+\.[\w.]+\w", open(source).read()))))
elif "most frequent" in text:
    top = int(re.search(r"write the (\d+) most frequent", text).group(1))
    counts = collections.Counter(w.strip(".").lower() for w in open(source).read().split())
    write("top.txt", [f"{w} {n}" for w, n in counts.most_common(top)])
elif "array of events" in text:
    json.dump(dict(collections.Counter(e["type"] for e in json.load(open(source)))), open("/app/counts.json", "w"))
elif "access log" in text:
    top = int(re.search(r"Write the (\d+) addresses", text).group(1))
    write("top_ips.txt", [ip for ip, _ in collections.Counter(line.split()[0] for line in open(source)).most_common(top)])
elif "whose city is" in text:
    city, floor = re.search(r"city is `(\w+)` and whose age is at least (\d+)", text).groups()
    rows = list(csv.reader(open(source)))
    write("filtered.csv", [",".join(rows[0])] + [",".join(r) for r in rows[1:] if r[1] == city and int(r[2]) >= int(floor)])
"""


def oracle_archive() -> bytes:
    """A harness that knows every shipped task's solution (it finds the one for the instruction it reads on stdin) and
    solves the generated families' instances (:mod:`grader.suites.terminal_families`) by reading their instructions:
    what a perfect system would do on the public and the hidden splits."""
    files: dict[str, str | bytes] = {f"solutions/{hashlib.sha256(t['instruction'].encode()).hexdigest()}.sh": (TASKS_DIR / name / "solution" / "solve.sh").read_text()
                                     for name, t in tasks().items()}
    files["solver.py"] = FAMILY_SOLVER
    files["oracle.py"] = ("import hashlib, os, subprocess, sys\n"
                          "text = sys.stdin.read()\n"
                          "key = hashlib.sha256(text.encode()).hexdigest()\n"
                          "if os.path.exists(f'/harness/solutions/{key}.sh'):\n"
                          "    sys.exit(subprocess.run(['bash', f'/harness/solutions/{key}.sh'], cwd='/app').returncode)\n"
                          "sys.exit(subprocess.run([sys.executable, '/harness/solver.py'], input=text.encode(), cwd='/app').returncode)\n")
    return archive(files, 'name = "oracle"\nentry = "python3 /harness/oracle.py"\n')
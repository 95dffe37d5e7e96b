"""Archives the tests upload: harness archives (any files with a ``harness.toml``, a bash script, and the oracle that
knows every shipped terminal task's solution and those of the hidden instances it is given) and task uploads (a folder
packed whole). Shared by the grader's rollout and import tests and the live compose test."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from grader.suites import Item
from grader.suites.terminal import TASKS_DIR, tasks
from grader.suites.terminal_families import generate


def pack_upload(folder: Path) -> bytes:
    """``folder`` as an upload: a ``.tar.gz`` whose one top folder is ``folder``'s name."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return buf.getvalue()


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


def oracle_archive(hidden: Iterable[Item] = ()) -> bytes:
    """A harness that knows every shipped task's solution and those of the generated instances in ``hidden`` (test items
    the test read from the grader's store: no program solves a generated instance from its instruction alone); it finds
    the one for the instruction it reads on stdin. What a perfect system would do on the public and the hidden splits."""
    solutions = {t["instruction"]: (TASKS_DIR / name / "solution" / "solve.sh").read_text() for name, t in tasks().items()}
    solutions |= {it.question: generate(it.entry["family"], it.entry["instance"]).oracle() for it in hidden if "family" in it.entry}
    files: dict[str, str | bytes] = {f"solutions/{hashlib.sha256(text.encode()).hexdigest()}.sh": solve for text, solve in solutions.items()}
    files["oracle.py"] = ("import hashlib, subprocess, sys\n"
                          "key = hashlib.sha256(sys.stdin.read().encode()).hexdigest()\n"
                          "sys.exit(subprocess.run(['bash', f'/harness/solutions/{key}.sh'], cwd='/app').returncode)\n")
    return archive(files, 'name = "oracle"\nentry = "python3 /harness/oracle.py"\n')
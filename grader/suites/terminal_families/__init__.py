"""The terminal suite's generated tasks: families whose files, requirements and wording are drawn from a seed, so a
test split exists only in the grader that holds the seed.

A family (:data:`FAMILIES`) is a function ``Prose -> Generated``: the files of ``/app`` (relative path → text), the
instruction, the output the agent must leave (a path under ``/app``) and the expected content, compared as ``lines``
(the lines, trailing whitespace ignored, in order), ``set`` (the lines in any order), ``json`` (equal JSON values) or
``tree`` (the output is a folder whose files must be exactly the expected ones). Each family has several task
structures (input layouts and formats, what is computed, output formats), drawn per instance, and its instruction is
composed by :mod:`.phrasing` (templates per sentence, synonyms, numbers in digits or words, thresholds stated several
ways, the requirements' order, and the requirements moved into a note file under ``/app`` for some instances). So a
program that reads instructions by pattern, written from this code, misreads most instances: what to compute is in
the language, not in a fixed template. Such a program could still be written against the whole grammar; a hidden
split no code can anticipate is imported (``crucible admin import-tasks``), and the grader's null-model ablation
measures what a harness scores alone.

The verifier (:data:`TEST_SH`, :mod:`.check`) reads the output as root and never runs the agent's code, so nothing of
the agent's can change its verdict. The families are kinds of the shipped tasks (``terminal_tasks/``: logs, CSV,
JSON, text, file trees), which stay the public material; an instance is ``<family>-<10 hex digits of its seed>``.
Groups: :mod:`.text` (logs and text), :mod:`.data` (CSV and JSON), :mod:`.files` (file trees).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grader.suites.terminal_families import data, files, text
from grader.suites.terminal_families.phrasing import Prose, Task

Compare = Literal["lines", "set", "json", "tree"]


@dataclass(frozen=True)
class Generated:
    """One generated task: ``files`` (path under ``/app`` → text), ``instruction``, the ``output`` path the agent
    leaves (relative to ``/app``; a folder for ``tree``), its ``expected`` content (for ``tree``: a JSON object, path
    under the folder → text) and how it is compared (``compare``)."""

    files: dict[str, str]
    instruction: str
    output: str
    expected: str
    compare: Compare = "lines"

    def spec(self) -> dict[str, str]:
        """What the verifier reads (``tests/expected.json``): ``{output, expected, compare}``."""
        return {"output": self.output, "expected": self.expected, "compare": self.compare}

    def oracle(self) -> str:
        """A bash script, run in ``/app`` (paths relative to it, as Harbor's ``solve.sh``), that leaves the expected output:
        the task's reference solution."""
        return ("python3 - <<'ORACLE'\nimport json, os, shutil\n"
                f"spec = json.loads({json.dumps(self.spec())!r})\n"
                "path = spec['output']\n"
                "if spec['compare'] == 'tree':\n"
                "    shutil.rmtree(path)\n"
                "    for name, text in json.loads(spec['expected']).items():\n"
                "        os.makedirs(os.path.dirname(os.path.join(path, name)), exist_ok=True)\n"
                "        open(os.path.join(path, name), 'w').write(text)\n"
                "else:\n"
                "    open(path, 'w').write(spec['expected'] + '\\n')\n"
                "ORACLE\n")


FAMILIES: dict[str, tuple[str, Callable[[Prose], Task]]] = {
    **{name: ("text-processing", fn) for name, fn in text.FAMILIES.items()},
    **{name: ("data", fn) for name, fn in data.FAMILIES.items()},
    **{name: ("files", fn) for name, fn in files.FAMILIES.items()},
}
"""Family name → (its ``[metadata] category``, its generator: ``Prose -> (files, instruction, output, expected, compare)``)."""

AGENT_TIMEOUT_S, VERIFIER_TIMEOUT_S = 120.0, 60.0

CHECK = Path(__file__).with_name("check.py").read_text()
"""The verifier's ``tests/check.py``."""

TEST_SH = """#!/bin/bash
# Reward 1 when /tests/check.py accepts what is in /app, else 0 (a crash leaves the 0 written first).
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
if python3 -I -B /tests/check.py; then
    echo 1 > /logs/verifier/reward.txt
fi
exit 0
"""

STAMP = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(Path(__file__).parent.glob("*.py")))).hexdigest()[:16]
"""A digest of this package's code: an instance's folder written by another version is not reused."""


def generate(family: str, seed: int) -> Generated:
    """Instance ``seed`` of ``family`` (the same on every machine: drawn from ``random.Random(f"{family}:{seed}")``).
    Raises ``KeyError`` for an unknown family."""
    return Generated(*FAMILIES[family][1](Prose(random.Random(f"{family}:{seed}"))))

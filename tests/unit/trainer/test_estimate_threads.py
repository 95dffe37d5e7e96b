"""Tokenizers the trainer's request threads load at once (a fresh trainer, several agents' first training jobs)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import prepared_models

SMOL = "smollm2-135m-instruct"

CODE = """
import sys, threading
from pathlib import Path
from trainer_service import estimate
errors = []
def load():
    try:
        estimate.load_tokenizer(Path(sys.argv[1]))
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=load) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(errors)
"""


def test_eight_threads_loading_a_tokenizer_at_once_in_a_fresh_process_all_get_it() -> None:
    """transformers' lazily imported names fail when two threads import them at once (an ``ImportError`` for 6 or 7
    of 8 threads, every time, before the trainer serialized its loads); the trainer's first jobs hit it as a 500."""
    done = subprocess.run([sys.executable, "-c", CODE, str(prepared_models() / SMOL)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr[-2000:])

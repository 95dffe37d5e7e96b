"""The ``swe`` suite's verdicts are a function of the candidate alone: the same split on an idle or a saturated machine,
a run the machine held up is no verdict (it fails the split's build instead), and a recorded verdict is never replaced."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from grader.suites import get_suite, swe
from grader.suites import swe_mutants as sm

PARAMS = {"projects": ["inflection"]}


@contextlib.contextmanager
def saturating() -> Iterator[None]:
    """Every CPU of the machine kept busy by a spinning process."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()


@pytest.fixture
def saturated() -> Iterator[None]:
    with saturating():
        yield


@pytest.fixture
def fresh_verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty record of verdicts (the projects and their runner stay the installed ones)."""
    monkeypatch.setattr(swe, "SWE_DIR", tmp_path)
    return tmp_path / "verified" / sm.STAMP


def split_ids(seed: int = 11, size: int = 1) -> list[tuple[str, tuple[str, ...]]]:
    return [(i.id, tuple(i.entry["FAIL_TO_PASS"])) for i in get_suite("swe").generate(PARAMS, seed, size, split="test")]


def test_a_split_verified_on_a_saturated_machine_is_the_one_verified_on_an_idle_one(fresh_verdicts: Path, tmp_path: Path,
                                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    sm.baseline(sm.PROJECTS["inflection"])  # recorded at installation
    idle = split_ids()
    monkeypatch.setattr(swe, "SWE_DIR", tmp_path / "loaded")
    with saturating():
        assert split_ids() == idle
    assert sorted(p.name for p in fresh_verdicts.iterdir()) == sorted(p.name for p in (tmp_path / "loaded" / "verified" / sm.STAMP).iterdir())


def test_a_run_the_machine_held_up_is_no_verdict_and_fails_the_build(fresh_verdicts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of wall clock, killed, or no report: each is run again, then the split is not drawn (``CouldNotVerify``, a
    503), and nothing is recorded (a later healthy run verifies afresh)."""
    sm.baseline(sm.PROJECTS["inflection"])
    for broken in ({"TEST_WALL_S": 0.0}, {"_python": lambda: "/bin/true"},
                   {"_python": lambda: str(write_script(fresh_verdicts.parent.parent / "killed", "kill -9 $$"))}):
        with monkeypatch.context() as m:
            for name, value in broken.items():
                m.setattr(sm, name, value)
            with pytest.raises(sm.CouldNotVerify) as exc:
                split_ids()
            assert exc.value.status == 503 and "could not be run to a verdict in 3 tries" in exc.value.detail
        assert not fresh_verdicts.exists() or not any(fresh_verdicts.iterdir()), broken


def write_script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_a_recorded_verdict_is_never_overwritten(fresh_verdicts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes verify one candidate at once and disagree: the first verdict recorded is the one both use."""
    candidate = swe._candidates("inflection")[0]
    bug = sm.Mutant(**{**candidate.__dict__, "fail_to_pass": ("test_inflection.py::test_x",)})
    record = fresh_verdicts / f"{candidate.id}.json"

    def verify_while_another_records_first(project: sm.Project, mutants: list[sm.Mutant], workers: int) -> list[sm.Mutant]:
        sm.write_once(record, {})  # the other process: "not a bug", recorded first
        return [bug]

    monkeypatch.setattr(sm, "verify", verify_while_another_records_first)
    assert swe._verified(candidate) is None and record.read_text() == "{}"
    assert sm.write_once(record, {"other": 1}) == {} and record.read_text() == "{}"
    assert [p.name for p in fresh_verdicts.iterdir()] == [record.name]  # no temporary file left


def test_a_loop_and_a_deadlock_are_verdicts_cut_by_cpu_time_and_sleep_not_by_wall_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                                        saturated: None) -> None:
    """On a saturated machine: a test that spins ends at its CPU limit, one that deadlocks once it slept
    :data:`HANG_S`, and one that ends reports, each as on an idle machine."""
    monkeypatch.setattr(sm, "HANG_S", 1.0)
    (tmp_path / "test_x.py").write_text("import threading\n\ndef test_spins():\n    while True:\n        pass\n\n"
                                        "def test_deadlocks():\n    lock = threading.Lock()\n    lock.acquire()\n    lock.acquire()\n\n"
                                        "def test_ends():\n    assert sum(range(10**5)) > 0\n")
    project = sm.Project("fake", "0", ".", tests="test_*.py")
    assert sm._run_tests(tmp_path, project, ["test_x.py::test_spins"], cpu_s=1).ended == "cpu-limit"
    assert sm._run_tests(tmp_path, project, ["test_x.py::test_deadlocks"], cpu_s=1).ended == "hung"
    ends = sm._run_tests(tmp_path, project, ["test_x.py::test_ends"], cpu_s=1)
    assert (ends.ended, ends.outcomes) == ("reported", {"test_x.py::test_ends": "passed"})


def test_tests_that_measure_or_race_the_clock_are_not_read() -> None:
    source = ("import time\nfrom threading import Thread\n\ndef test_fast():\n    start = time.time()\n    assert time.time() - start < 0.01\n\n"
              "def test_plain():\n    def f():\n        time.sleep(0)\n    assert 1\n\n"
              "class TestRace:\n    def _race(self):\n        Thread(target=print).start()\n\n    def test_threads(self):\n        self._race()\n\n"
              "    def test_f(self):\n        assert f\n")
    assert sm.load_sensitive_tests(source) == ["test_fast", "test_plain", "TestRace::test_threads"]  # a nested f is no helper of the file


def test_check_benchmark_answers_in_seconds_without_verifying_a_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checking swe-mini drew its splits and three test-sized probes, verifying hundreds of candidates (about 50 minutes
    on a loaded machine); the file, the params and the item space need none, and loading the benchmark draws the splits."""
    from typer.testing import CliRunner

    from crucible.cli import app
    from tests.conftest import ROOT

    def refuse(mutant: sm.Mutant) -> None:
        raise AssertionError(f"{mutant.id} verified")

    monkeypatch.setattr(swe, "_verified", refuse)
    out = CliRunner().invoke(app, ["admin", "check-benchmark", str(ROOT / "benchmarks" / "swe-mini.yaml")], terminal_width=400)
    assert out.exit_code == 0, out.output
    assert "✓ swe-mini" in out.output and "not drawn" in out.output and "check-benchmark --draw" in out.output


def test_the_module_imports_alone_on_the_standard_library_as_the_grader_image_prepares_the_projects(tmp_path: Path) -> None:
    """deploy/Dockerfile runs ``python3 swe_mutants.py`` before the project's code is in the image: the module must
    import with nothing but the standard library (an import of the platform's own modules broke the image's build)."""
    (tmp_path / "swe_mutants.py").write_bytes(Path(sm.__file__).read_bytes())
    load = "import runpy; print(runpy.run_path('swe_mutants.py', run_name='swe_mutants')['PYTEST'])"
    done = subprocess.run([sys.executable, "-I", "-S", "-c", load], cwd=tmp_path,  # -S: no site-packages, the platform's modules among them
                          capture_output=True, text=True, timeout=60, env={"PATH": os.environ.get("PATH", "")})
    assert done.returncode == 0, done.stderr[-2000:]

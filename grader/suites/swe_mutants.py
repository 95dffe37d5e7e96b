"""The ``swe`` suite's bugs: real projects' source, reverted to wrong variants and verified against their own tests.

**Projects** (:data:`PROJECTS`): pure-Python libraries from the package registry, each pinned, with the test suite its
source distribution ships. :func:`prepare` (``make swe-projects``, at installation: the only time the registry is
reached) downloads each sdist, unpacks it as the project's repository, and installs the tests' runner (pytest, pure
Python) into a folder of its own, which every sandbox mounts read-only at ``/opt/swe-env``; nothing is fetched later.

**Mutants** (:func:`candidates`): a mutation applied at one site of one function of the library: a comparison
flipped at its boundary (``<`` ↔ ``<=``, ``==`` ↔ ``!=``, ``in`` ↔ ``not in``), a slice bound off by one, ``and`` ↔
``or``, a ``not`` dropped, ``+ 1`` ↔ ``- 1``, a ``True`` returned as ``False``, and an ``if`` that returns, raises,
breaks or continues left out (a case the function forgot). A candidate is a bug when :func:`verify` finds that it makes
some of the project's tests fail (``FAIL_TO_PASS``; the tests of the files that name the function are run, all of them
for a function no test file names) while the other tests of those files still pass (``PASS_TO_PASS``), every file still
imports and the run ends within :data:`TEST_CPU_S` of CPU time and without :data:`HANG_S` asleep in a row. The suite
verifies candidates as its seeds draw them (:mod:`grader.suites.swe`).

**A verdict is a function of the candidate alone**, so a split is the same on any machine at any load: a run is cut by
the CPU time it used (a loop) or the time it spent asleep with nothing runnable (a deadlock), never by wall clock; tests
whose outcome depends on the machine's speed are not read (:data:`LOAD_SENSITIVE`); a run that ends for a reason of the
machine's (out of wall clock after :data:`TEST_WALL_S`, killed, no readable report) is no verdict: it is run again, and
after :data:`TRIES` raises :class:`CouldNotVerify`, so the split is not drawn rather than drawn otherwise. A verdict
is recorded once (:func:`write_once`) and never overwritten. A bug's *gold
patch* is its mutation reversed; its *test patch* is the test files holding its ``FAIL_TO_PASS`` tests, taken out of
the repository the agent gets and put back by the verifier: SWE-bench's shape.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

try:
    from services.common.errors import UpstreamUnavailable
except ImportError:  # run alone, stdlib only, as the grader image's build prepares the projects (deploy/Dockerfile)
    UpstreamUnavailable = RuntimeError  # type: ignore[assignment,misc]

SWE_DIR = Path(os.environ.get("CRUCIBLE_SWE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "crucible" / "swe")
"""Where :func:`prepare` writes (``projects/<name>/`` the repositories, ``env/`` the runner, ``baseline/``) and the
suite keeps what it verified and the instances it wrote: the user's cache folder (``~/.cache/crucible/swe``), shared by
the checkouts of one machine as pip's cache is; ``CRUCIBLE_SWE_DIR`` moves it."""
ENV_TARGET = "/opt/swe-env"
"""Where a sandbox sees the tests' runner (read-only)."""
PYTEST = "pytest==8.4.2"
TEST_CPU_S = 8
"""A mutant whose tests use more CPU time than this (a loop that no longer ends) is not kept: CPU time, unlike wall
clock, does not grow on a loaded machine, so the same mutant is kept or not on every machine (a split is the same
everywhere). The tests a mutant runs take about a second on the original source."""
HANG_S = 30.0
"""A mutant whose tests spend this long in a row with every thread asleep and no CPU used (a deadlock) is not kept: time
spent waiting for a CPU, which a loaded machine makes long, is not counted (:func:`_watch`)."""
TEST_WALL_S = 600.0
"""A run of tests still going after this much wall clock was held up by the machine (not a verdict: run again)."""
TRIES = 3
"""Runs of one set of tests before :class:`CouldNotVerify` (each ended for a reason of the machine's)."""
POLL_S = 0.25
LOAD_SENSITIVE = re.compile(r"\b(sleep|time\.time|monotonic|perf_counter|Thread|threading|socket|subprocess|Popen|timeout)\b")
"""What a test's source names when its outcome may depend on the machine's speed (a duration it measures, a wait
with a deadline, another thread or process it races): such tests are run but never read (:func:`load_sensitive_tests`)."""
MAX_FAILING = 12
"""A mutant that breaks more tests than this is too blunt to read as one bug: not kept."""
_BUILTINS = frozenset(dir(builtins)) | {"object"}
_PARSE = threading.Lock()


def parse(source: str, mode: str = "exec") -> Any:
    """``ast.parse`` one call at a time: CPython 3.11 (before 3.11.9) fails parses that run at once in two threads with
    ``SystemError: AST constructor recursion depth mismatch`` (gh-106905), and a split's bugs are verified in threads."""
    with _PARSE:
        return ast.parse(source, mode=mode)


STAMP = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
"""This module's version: what was verified by another version is verified again."""
SITES_PER_FUNCTION = 3
"""At most this many candidate sites of one function are tried (chosen by a hash, so the catalogue is reproducible)."""


@dataclass(frozen=True)
class Project:
    """One project: the sdist ``name==version``, its ``package`` folder (relative to the sdist's root: the library's
    source, where mutants go), ``path`` (put on ``sys.path`` for tests), and ``tests`` (the test files' glob)."""

    name: str
    version: str
    package: str
    path: str = "."
    tests: str = "tests/test_*.py"
    skip_modules: tuple[str, ...] = ()

    @property
    def repo(self) -> Path:
        return SWE_DIR / "projects" / self.name

    def modules(self) -> list[Path]:
        """The library's source files (relative to the repository), tests and private tooling left out."""
        root = self.repo
        return sorted(p.relative_to(root) for p in (root / self.package).rglob("*.py")
                      if "tests" not in p.parts and p.name not in ("conftest.py", "__main__.py") and p.name not in self.skip_modules)

    def test_files(self) -> list[Path]:
        return sorted(p.relative_to(self.repo) for p in self.repo.glob(self.tests))


PROJECTS: dict[str, Project] = {p.name: p for p in (
    Project("cachetools", "8.0.3", "src/cachetools", path="src"),
    Project("toolz", "1.2.0", "toolz", tests="toolz/tests/test_*.py", skip_modules=("_signatures.py", "compatibility.py")),
    Project("inflection", "0.5.1", "inflection", tests="test_inflection.py"),
    Project("semver", "3.2.0", "src/semver", path="src"),
    Project("tabulate", "0.10.0", "tabulate", tests="test/test_*.py"),
    Project("boltons", "26.2.0", "boltons"),
    Project("more-itertools", "11.2.1", "more_itertools"),
)}


@dataclass(frozen=True)
class Mutant:
    """One verified bug. Text positions are 1-based lines and 0-based columns of the original file, as ``ast`` gives."""

    project: str
    path: str
    function: str
    operator: str
    line: int
    col: int
    end_line: int
    end_col: int
    original: str
    replacement: str
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    failure: str = ""  # the first failing test's failure message on the buggy code: what a user would see

    @property
    def id(self) -> str:
        key = f"{self.project}:{self.path}:{self.line}:{self.col}:{self.end_line}:{self.end_col}:{self.replacement}"
        return f"{self.project}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"

    @property
    def test_files(self) -> list[str]:
        """The test patch's files: those holding a ``FAIL_TO_PASS`` test."""
        return sorted({t.split("::")[0] for t in self.fail_to_pass})

    def apply(self, source: str) -> str:
        """``source`` (the original file) with the bug."""
        return _splice(source, self.line, self.col, self.end_line, self.end_col, self.replacement)


# --------------------------------------------------------------------------- mutation operators


class _Source:
    """A file's text with its lines' offsets, for slicing by ``ast`` positions (1-based lines, UTF-8 byte columns)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + len(self.lines[line - 1].encode()[:col].decode(errors="ignore"))

    def segment(self, node: ast.AST) -> str:
        return self.text[self.offset(node.lineno, node.col_offset):self.offset(node.end_lineno, node.end_col_offset)]  # type: ignore[attr-defined, arg-type]


def _splice(source: str, line: int, col: int, end_line: int, end_col: int, text: str) -> str:
    src = _Source(source)
    return source[:src.offset(line, col)] + text + source[src.offset(end_line, end_col):]


def _parses(text: str) -> bool:
    try:
        parse(text, mode="eval" if text != "pass" else "exec")
    except SyntaxError:
        return False
    return True


_FLIP = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">", ast.Eq: "!=", ast.NotEq: "==", ast.In: "not in", ast.NotIn: "in",
         ast.Is: "is not", ast.IsNot: "is"}


def _sites(source: _Source, node: ast.AST) -> Iterator[tuple[str, ast.AST, str]]:
    """Candidate mutations inside a function: ``(operator, node replaced, replacement text)``."""
    seg = source.segment
    for sub in ast.walk(node):
        if isinstance(sub, ast.Compare) and len(sub.ops) == 1 and type(sub.ops[0]) in _FLIP:
            left, right = seg(sub.left), seg(sub.comparators[0])
            if left and right and "\n" not in left + right:
                yield "comparison", sub, f"{left} {_FLIP[type(sub.ops[0])]} {right}"
        elif isinstance(sub, ast.BoolOp) and len(sub.values) == 2:
            a, b = seg(sub.values[0]), seg(sub.values[1])
            if a and b and "\n" not in a + b:
                yield "boolean", sub, f"({a} {'or' if isinstance(sub.op, ast.And) else 'and'} {b})"
        elif isinstance(sub, ast.UnaryOp) and isinstance(sub.op, ast.Not) and (operand := seg(sub.operand)) and "\n" not in operand:
            yield "negation", sub, f"({operand})"
        elif (isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Add | ast.Sub) and isinstance(sub.right, ast.Constant)
              and sub.right.value == 1 and (left := seg(sub.left)) and "\n" not in left):
            yield "off-by-one", sub, f"{left} {'-' if isinstance(sub.op, ast.Add) else '+'} 1"
        elif isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Slice):
            for bound in (sub.slice.lower, sub.slice.upper):
                if isinstance(bound, ast.Constant) and type(bound.value) is int and 0 <= bound.value <= 2:
                    yield "slice-bound", bound, str(bound.value + 1)
        elif isinstance(sub, ast.Return) and isinstance(sub.value, ast.Constant) and isinstance(sub.value.value, bool):
            yield "return-value", sub.value, str(not sub.value.value)
        elif (isinstance(sub, ast.If) and not sub.orelse and len(sub.body) == 1
              and isinstance(sub.body[0], ast.Return | ast.Raise | ast.Break | ast.Continue)):
            yield "missing-case", sub, "pass"


def candidates(project: Project) -> list[Mutant]:
    """Every candidate mutant of ``project`` (unverified), at most :data:`SITES_PER_FUNCTION` per function, chosen by
    a hash of the site so the list is the same on every machine."""
    out: list[Mutant] = []
    for rel in project.modules():
        source = _Source((project.repo / rel).read_text())
        tree = parse(source.text)
        for fn, qualname in _functions(tree):
            if fn.name.startswith("__") and fn.name not in ("__init__", "__call__", "__getitem__", "__contains__"):
                continue
            sites = [Mutant(project.name, str(rel), qualname, operator, node.lineno, node.col_offset, node.end_lineno, node.end_col_offset,  # type: ignore[arg-type]
                            source.segment(node), text)
                     for operator, node, text in _sites(source, fn) if _parses(text)]
            sites.sort(key=lambda m: m.id)
            out += sites[:SITES_PER_FUNCTION]
    return out


def _functions(tree: ast.Module) -> Iterator[tuple[ast.FunctionDef, str]]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node, node.name
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield item, f"{node.name}.{item.name}"


# --------------------------------------------------------------------------- running a project's tests


def pytest_command(python: str, env_dir: str, path: str, tests: list[str], junit: str) -> list[str]:
    """The command that runs ``tests`` (files or ids) of a repository in the current directory: ``python`` isolated
    from the environment (``-E -s -B``: no ``PYTHONPATH``, no user site, no bytecode written), ``sys.path`` set to the
    runner's folder and the project's ``path`` by :file:`swe_runner.py`, pytest with no configuration file of the
    repository's (``-c`` an empty one: a planted ``pytest.ini`` or ``setup.cfg`` is not read) and its results in ``junit``."""
    return [python, "-E", "-s", "-B", f"{env_dir}/swe_runner.py", env_dir, path, "--", "-q", "-p", "no:cacheprovider", "-c", f"{env_dir}/pytest.ini",
            "--rootdir", ".", "--junitxml", junit, "-o", "junit_family=xunit1", *tests]


RUNNER = '''"""Run pytest with sys.path = [the runner's folder, the project's source]: argv = ENV PATH -- PYTEST_ARGS."""
import os, sys
env, path = sys.argv[1], os.path.abspath(sys.argv[2])
sys.path[:0] = [env, path]
sys.argv = ["pytest", *sys.argv[4:]]
import pytest
raise SystemExit(pytest.main(sys.argv[1:]))
'''


def junit_outcomes(xml_text: str, files: list[str]) -> dict[str, str]:
    """``{test id: "passed" | "failed" | "skipped"}`` from pytest's JUnit XML (xunit1) of a run of the test ``files``:
    the id is pytest's, ``file::Class::name``, the file read from the case's ``classname`` (its dotted module, then
    its classes: a test a class inherits is the class's, wherever its body is written)."""
    import xml.etree.ElementTree as ET

    modules = {f[:-3].replace("/", "."): f for f in files}
    out: dict[str, str] = {}
    for case in ET.fromstring(xml_text).iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        cut = next((i for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules), None)
        if cut is None:
            continue
        test_id = "::".join([modules[".".join(parts[:cut])], *parts[cut:], case.get("name") or ""])
        if case.find("failure") is not None or case.find("error") is not None:
            out[test_id] = "failed"
        elif case.find("skipped") is not None:
            out[test_id] = "skipped"
        else:
            out.setdefault(test_id, "passed")
    return out


class CouldNotVerify(UpstreamUnavailable):
    """The project's tests could not be run to a verdict :data:`TRIES` times (the machine's doing: a run that outlasted
    :data:`TEST_WALL_S`, was killed, left no readable report): nothing is recorded, and the split that needed the verdict
    is not drawn (a 503: retry once the machine is healthier) rather than drawn otherwise."""

    code, title = "could_not_verify", "A swe candidate could not be verified; retry later"


@dataclass(frozen=True)
class TestRun:
    """How a run of a project's tests ended, a function of the code it ran: ``ended`` is ``"reported"`` (``outcomes``
    ``{test id: "passed" | "failed" | "skipped"}`` and ``messages`` ``{failed test id: its failure's message}`` read from
    its JUnit report), ``"cpu-limit"`` (it used :data:`TEST_CPU_S` of CPU time: a loop that no longer ends), ``"hung"``
    (:data:`HANG_S` in a row with every thread asleep and no CPU used: a deadlock) or ``"no-start"`` (pytest refused to start,
    exit status 4: a ``conftest.py`` that no longer imports)."""

    ended: str
    outcomes: dict[str, str]
    messages: dict[str, str]


class _Infrastructure(Exception):
    """A run that ended for a reason of the machine's, not of the code it ran."""


def _run_tests(repo: Path, project: Project, tests: list[str], cpu_s: int | None = TEST_CPU_S) -> TestRun:
    """Run ``tests`` of the repository at ``repo`` as a sandbox would (:func:`pytest_command` with this machine's
    ``python3``), under ``cpu_s`` seconds of CPU time (``prlimit``; ``None``: no limit). A run that ends for a reason of
    the machine's (:class:`_Infrastructure`) is run again, :data:`TRIES` times in all; then raises
    :class:`CouldNotVerify`. Nothing that grows with the machine's load decides the result (module docstring)."""
    reasons = []
    for _ in range(TRIES):
        try:
            return _run_once(repo, project, tests, cpu_s)
        except _Infrastructure as exc:
            reasons.append(str(exc))
    raise CouldNotVerify(f"swe: the tests of {project.name} ({' '.join(tests)[:200]}) could not be run to a verdict in {TRIES} tries: "
                         f"{'; '.join(reasons)}; nothing was recorded (the split is not drawn until they can)")


def _run_once(repo: Path, project: Project, tests: list[str], cpu_s: int | None) -> TestRun:
    import xml.etree.ElementTree as ET

    with tempfile.TemporaryDirectory(prefix="crucible-swe-") as tmp:
        junit = f"{tmp}/junit.xml"
        cmd = pytest_command(_python(), str(SWE_DIR / "env"), project.path, tests, junit)
        if cpu_s is not None:  # SIGXCPU at the soft limit (the run's own end), SIGKILL at the hard one if it survives that
            cmd = ["prlimit", f"--cpu={cpu_s}:{cpu_s + 2}", "--core=0", "--", *cmd]
        with open(f"{tmp}/log", "w+b") as log:
            try:
                proc = subprocess.Popen(cmd, cwd=repo, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={"PATH": "/usr/bin:/bin", "HOME": tmp})
            except OSError as exc:
                raise _Infrastructure(f"could not start: {exc}") from None
            stopped = _watch(proc)
            log.seek(0)
            tail = log.read().decode(errors="replace")[-300:].strip()
        if stopped == "hung":
            return TestRun("hung", {}, {})
        if stopped == "wall":
            raise _Infrastructure(f"still running after {TEST_WALL_S:.0f} s of wall clock")
        if proc.returncode == -signal.SIGXCPU:
            return TestRun("cpu-limit", {}, {})
        if proc.returncode < 0:
            raise _Infrastructure(f"killed by {signal.Signals(-proc.returncode).name}")
        if not Path(junit).is_file():
            if proc.returncode == 4:  # pytest's usage error: a conftest.py that no longer imports
                return TestRun("no-start", {}, {})
            raise _Infrastructure(f"exit status {proc.returncode} and no JUnit report: {tail!r}")
        try:
            root = ET.fromstring(Path(junit).read_text())
        except (ET.ParseError, UnicodeDecodeError) as exc:
            raise _Infrastructure(f"an unreadable JUnit report ({exc})") from None
    files = [t.split("::")[0] for t in tests]
    messages: dict[str, str] = {}
    for case in root.iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            [test_id] = junit_outcomes(f"<testsuite>{ET.tostring(case, encoding='unicode')}</testsuite>", files) or [""]
            messages[test_id] = (bad.get("message") or "").strip()
    return TestRun("reported", junit_outcomes(ET.tostring(root, encoding="unicode"), files), messages)


def _watch(proc: subprocess.Popen[bytes]) -> str | None:
    """Wait for ``proc`` (the leader of a session of its own). ``"hung"`` once its processes spent :data:`HANG_S` seconds
    in a row with no thread runnable and no CPU time used (asleep on a lock that nothing will release: waiting for the
    CPU, as a loaded machine makes a process wait, is being runnable), ``"wall"`` after :data:`TEST_WALL_S`; either
    kills the session. ``None`` when it ended by itself."""
    started = last = time.monotonic()
    blocked, last_cpu = 0.0, -1
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(POLL_S)
            return None
        now = time.monotonic()
        runnable, cpu = _session_state(proc.pid)
        blocked = blocked + (now - last) if not runnable and cpu == last_cpu else 0.0
        last, last_cpu = now, cpu
        stopped = "hung" if blocked >= HANG_S else "wall" if now - started >= TEST_WALL_S else None
        if stopped:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return stopped


def _session_state(sid: int) -> tuple[bool, int]:
    """Of the processes of session ``sid`` (``/proc``): whether any thread is runnable or in an uninterruptible wait
    (``R``, ``D``: the machine's to serve), and their CPU time in clock ticks. Runnable when ``/proc`` shows none of them
    (a system that hides them: nothing is taken for a deadlock there)."""
    runnable, ticks, seen = False, 0, False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[3]) != sid:
                continue
            seen = True
            ticks += int(fields[11]) + int(fields[12])
            runnable = runnable or any(t.read_text().rpartition(")")[2].split()[0] in "RD" for t in stat.parent.glob("task/*/stat"))
        except (OSError, IndexError, ValueError):
            continue  # the process ended while it was read
    return runnable or not seen, ticks


def write_once(path: Path, data: Any) -> Any:
    """Record ``data`` (JSON) at ``path`` unless a record is there already, and return the one that is: the first
    writer's stays (created whole and at once: a hard link to a complete temporary file, which fails if ``path``
    exists), so a verdict, once recorded, is the only one any process reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # readable as the files it replaces were (mkstemp's are the owner's alone)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.link(tmp, path)
    except FileExistsError:
        return json.loads(path.read_text())
    finally:
        os.unlink(tmp)
    return data


def baseline(project: Project) -> dict[str, dict[str, str]]:
    """Each test file's outcomes on the original source (kept in ``SWE_DIR/baseline`` per version of this module, as
    verdicts are, written once: :func:`write_once`). Raises :class:`CouldNotVerify` when a file's tests cannot be run to a report (recording
    nothing): a baseline is never a timed-out run's."""
    cached = SWE_DIR / "baseline" / f"{project.name}-{project.version}-{STAMP}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    result = {}
    for f in map(str, project.test_files()):
        ran = _run_tests(project.repo, project, [f], cpu_s=None)
        if ran.ended != "reported":
            raise CouldNotVerify(f"swe: {project.name}'s {f} did not run to a report on the original source ({ran.ended})")
        result[f] = ran.outcomes
    return write_once(cached, result)  # type: ignore[no-any-return]


def _python() -> str:
    return shutil.which("python3", path="/usr/bin:/bin") or sys.executable


# --------------------------------------------------------------------------- preparation


def prepare(log: Any = print) -> None:
    """Download and unpack every project, install the tests' runner, and record each project's tests' outcomes on its
    original source (:func:`baseline`). Idempotent: what is there already is kept."""
    SWE_DIR.mkdir(parents=True, exist_ok=True)
    _install_runner()
    for project in PROJECTS.values():
        _unpack(project, log)
        outcomes = baseline(project)
        log(f"swe: {project.name} {project.version}: {sum(o == 'passed' for f in outcomes.values() for o in f.values())} tests pass")


def _install_runner() -> None:
    env = SWE_DIR / "env"
    marker = env / f".{PYTEST}"
    if not marker.is_file():
        shutil.rmtree(env, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target", str(env), PYTEST], check=True)
        marker.touch()
    (env / "swe_runner.py").write_text(RUNNER)
    (env / "pytest.ini").write_text("[pytest]\n")


def _unpack(project: Project, log: Any) -> None:
    if (project.repo / ".prepared").is_file():
        return
    sdists = SWE_DIR / "sdists"
    sdists.mkdir(exist_ok=True)
    archive = next(sdists.glob(f"{project.name.replace('-', '_')}-{project.version}.tar.gz"), None)
    if archive is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:", "--dest", str(sdists),
                        f"{project.name}=={project.version}"], check=True)
        archive = next(sdists.glob(f"*{project.name.replace('-', '_')}-{project.version}.tar.gz"))
    shutil.rmtree(project.repo, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if (m.isfile() or m.isdir()) and not m.name.startswith("/") and ".." not in Path(m.name).parts]
        tar.extractall(tmp, members=members)  # plain files and folders inside the archive only (3.11.2, Debian's, has no filter=)
        [top] = Path(tmp).iterdir()
        shutil.move(str(top), project.repo)
    (project.repo / ".prepared").touch()
    log(f"swe: {project.name} {project.version} unpacked")


def naming_tests(source: str, name: str) -> list[str] | None:
    """The pytest ids (``Class::test`` or ``test``) of a test file's tests whose body or decorators name ``name`` (as a
    word); ``None`` when they cannot be told from the file alone (a test class inherits from a class of another
    module, which may be a ``TestCase``). Test classes: those :func:`_maybe_tests` tells, with the tests they inherit from
    classes of the same file."""
    return _tests_matching(source, re.compile(rf"\b{re.escape(name)}\b"))


def load_sensitive_tests(source: str) -> list[str] | None:
    """The pytest ids of a test file's tests whose body names :data:`LOAD_SENSITIVE`, or names a helper of the file (a
    module-level function or a method, not a test) whose body does (as :func:`naming_tests`)."""
    tree = parse(source)
    defs = [*tree.body, *(item for node in tree.body if isinstance(node, ast.ClassDef) for item in node.body)]
    helpers = sorted({node.name for node in defs if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                      and not node.name.startswith("test") and LOAD_SENSITIVE.search(ast.get_source_segment(source, node) or "")})
    words = "|".join([LOAD_SENSITIVE.pattern, *(rf"\b{re.escape(h)}\b" for h in helpers)])
    return _tests_matching(source, re.compile(words))


def _tests_matching(source: str, word: re.Pattern[str]) -> list[str] | None:
    tree = parse(source)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

    lines = source.splitlines()

    def names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        return bool(word.search("\n".join(lines[first - 1:node.end_lineno])))

    def tests_of(cls: ast.ClassDef, seen: frozenset[str] = frozenset()) -> dict[str, bool] | None:
        found: dict[str, bool] = {}
        for base in cls.bases:
            base_name = ast.unparse(base)
            if base_name in classes and base_name not in seen:
                inherited = tests_of(classes[base_name], seen | {cls.name})
                if inherited is None:
                    return None
                found |= inherited
            elif not (base_name.endswith(("TestCase", "Protocol")) or base_name in _BUILTINS):
                return None
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                found[node.name] = names(node)
        return found

    selected: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test") and names(node):
            selected.append(node.name)
        elif isinstance(node, ast.ClassDef) and _maybe_tests(node, classes):
            tests = tests_of(node)
            if tests is None:
                return None
            selected += [f"{node.name}::{t}" for t, named in tests.items() if named]
    return selected


def _maybe_tests(node: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> bool:
    """Whether pytest may collect the class: ``Test*``, a ``*TestCase``'s subclass, a subclass of a class of the file, or
    a subclass of an imported class (which may be a ``TestCase``) that has ``Test`` in its name or ``test*`` methods
    (a helper such as ``class _Multiset(Set)`` is not)."""
    bases = [ast.unparse(b) for b in node.bases]
    if node.name.startswith("Test") or any(b.endswith("TestCase") or b in classes for b in bases):
        return True
    has_tests = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test") for n in node.body)
    return any(b not in _BUILTINS for b in bases) and ("Test" in node.name or has_tests)


def verify(project: Project, mutants: list[Mutant], workers: int = 2) -> list[Mutant]:
    """The mutants that are bugs (module docstring), each with its ``FAIL_TO_PASS``, ``PASS_TO_PASS`` and failure
    report. A mutant of function ``f`` runs the tests that name ``f`` (:func:`naming_tests`; a whole file where they
    cannot be told apart; every test file when none names it: a private helper is tested through its callers); the
    load-sensitive ones (:func:`load_sensitive_tests`) are left out of what is read. Raises :class:`CouldNotVerify` when
    a mutant's tests cannot be run to a verdict (the machine's doing)."""
    files = [str(p) for p in project.test_files()]
    texts = {f: (project.repo / f).read_text(errors="replace") for f in files}
    before_all = baseline(project)
    sensitive = {f"{f}::{i}" for f in files for i in load_sensitive_tests(texts[f]) or []}

    @cache
    def tests_of_name(name: str) -> list[str]:
        chosen: list[str] = []
        for f in files:
            if re.search(rf"\b{re.escape(name)}\b", texts[f]):
                ids = naming_tests(texts[f], name)
                chosen += [f] if ids is None else [f"{f}::{i}" for i in ids]
        return chosen or files

    def tests_of(m: Mutant) -> list[str]:
        return tests_of_name(m.function.split(".")[-1])

    def selected(test_id: str, chosen: list[str]) -> bool:
        base = test_id.split("[")[0]
        return any(base == c or test_id.split("::")[0] == c for c in chosen)

    def check(m: Mutant) -> Mutant | None:
        chosen = tests_of(m)
        if not chosen:
            return None
        with tempfile.TemporaryDirectory(prefix="crucible-swe-") as tmp:
            copy = Path(tmp) / "repo"
            shutil.copytree(project.repo, copy, symlinks=True)
            target = copy / m.path
            target.write_text(m.apply(target.read_text()))
            ran = _run_tests(copy, project, chosen)
        if ran.ended != "reported":
            return None  # a loop, a deadlock, a conftest.py that no longer imports: not one bug in one function
        outcomes = {t: o for t, o in ran.outcomes.items() if t.split("[")[0] not in sensitive}
        before = {t: o for f in {c.split("::")[0] for c in chosen} for t, o in before_all[f].items()
                  if selected(t, chosen) and t.split("[")[0] not in sensitive}
        if set(outcomes) != set(before):
            return None  # a test file no longer imports: not one bug in one function
        failing = sorted(t for t, o in outcomes.items() if o == "failed" and before[t] == "passed")
        if not failing or len(failing) > MAX_FAILING or any(o == "failed" and before[t] != "passed" for t, o in outcomes.items() if t not in failing):
            return None
        files_of_failing = {t.split("::")[0] for t in failing}
        passing = sorted(t for t, o in outcomes.items() if o == "passed" and t.split("::")[0] in files_of_failing)
        return Mutant(**{**asdict(m), "fail_to_pass": tuple(failing), "pass_to_pass": tuple(passing), "failure": ran.messages.get(failing[0], "")[:500]})

    with ThreadPoolExecutor(workers) as pool:
        return [m for m in pool.map(check, mutants) if m is not None]


if __name__ == "__main__":  # python -m grader.suites.swe_mutants (make swe-projects)
    prepare()


__all__ = ["ENV_TARGET", "PROJECTS", "STAMP", "SWE_DIR", "CouldNotVerify", "Mutant", "Project", "TestRun", "baseline", "candidates", "load_sensitive_tests",
           "prepare", "pytest_command", "verify", "write_once"]

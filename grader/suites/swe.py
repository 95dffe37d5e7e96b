"""The ``swe`` suite: repository bug-fix tasks in SWE-bench's shape, on real projects, with hidden instances generated
from the grader's secret seed.

A task is a project's repository at a base commit holding one bug (:mod:`grader.suites.swe_mutants`: a function of the
library reverted to a wrong variant and verified on the project's own tests), an issue text a user could have written
(the symptom and a reproduction: the failing test's body and its failure; never the fix), a gold ``patch`` (the
mutation reversed), a ``test_patch`` (the test files holding the ``FAIL_TO_PASS`` tests, taken out of the repository the
agent gets), ``FAIL_TO_PASS`` and ``PASS_TO_PASS``. An item is **resolved** — reward 1 — when, after the harness's
changes and with the test patch put back, every ``FAIL_TO_PASS`` test passes and every ``PASS_TO_PASS`` test still
passes: SWE-bench's criterion; the score is the resolved rate.

**Generation.** Every split is drawn from the same candidates (each project's mutation sites, enumerated from its
source) by its seed: shuffled, taken from the projects in turn, and verified as drawn, until ``size`` bugs are found.
A verdict is a function of the candidate alone and is recorded once (:mod:`grader.suites.swe_mutants`), so a seed
draws the same split on any machine at any load, or none (``CouldNotVerify``) while the machine cannot run the tests.
The public splits' seeds are in the benchmark file; the test split's seed is the grader's secret, so its instances
exist only in the grader (as reasoning-gym's math does), and the candidates number several hundred bugs per benchmark
(``item_space``).

**The rewrite** (:mod:`grader.suites.swe_rewrite`). The projects are public, so their releases would be the answer
key: each split sees each project through a semantics-preserving rewrite drawn from its seed (names, module files,
locals), applied alike to the base repository, the tests, the gold patch, the test ids and the issue; an item's entry
keeps the mutant as found on the published source (``fail_to_pass``…, the canonical form) and the rewrite's ``key``.

**Verification** (the verifier, ``test.sh`` in the task's tests folder, run after the harness with ``/tests`` mounted):
the project's pristine files are copied into a fresh tree, then only the harness's changes to the library's own source
(regular ``.py`` files under the package folder, not in a ``tests`` folder, not named ``test_*.py``, ``conftest.py``,
``sitecustomize.py`` or ``usercustomize.py``) are laid over them, so tests the harness edited or deleted, and a ``conftest.py``, ``pytest.ini``
or ``sitecustomize.py`` it planted, are not what runs. The selected tests run as the unprivileged agent user with
pytest from ``/opt/swe-env`` (prepared at installation, mounted read-only), with no configuration file of the
repository's, and the verifier writes the reward from their JUnit report. What it does not defend against: code in the
library that, once imported by the tests' process, rewrites that process's report (SWE-bench's harness does not either).

Params: ``projects`` (list of names of :data:`~grader.suites.swe_mutants.PROJECTS`; default all). The default harness is
the terminal suite's (one shell command per turn, its output back, ``DONE`` to finish: mini-SWE-agent's loop).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import shutil
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any

from grader.canonical import MIN_TEXT_TOKENS, Canonical, text_tokens
from grader.suites import swe_mutants, swe_rewrite
from grader.suites.base import Item, TaskEnvironment, imported_environment, materialize, register_suite
from grader.suites.swe_mutants import ENV_TARGET, PROJECTS, SWE_DIR, Mutant, Project
from grader.suites.terminal import HARNESS_DIR
from services.common import untrusted
from services.common.contracts import Harness
from services.common.errors import Unprocessable

AGENT_TIMEOUT_S = 600.0
VERIFY_WORKERS = min(8, os.cpu_count() or 1)
"""Candidates verified at once while a split is drawn (each a pytest process)."""
VERIFIER_TIMEOUT_S = 120.0
_INSTANCE_STAMP = hashlib.sha256(Path(__file__).read_bytes() + swe_rewrite.STAMP.encode()).hexdigest()[:16]
"""The version of an instance's folder: one written by another version of this suite (its verifier) is not reused."""

VERIFIER = r'''#!/bin/bash
# The swe suite's verifier (grader/suites/swe.py): the pristine project, the harness's library changes over it, the
# selected tests run as the agent user; reward 1 when every FAIL_TO_PASS and PASS_TO_PASS test passed.
set -u
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
work=$(mktemp -d) && out=$(mktemp -d) || exit 0
cp -a /tests/repo/. "$work/"
package=$(python3 -I -c 'import json; print(json.load(open("/tests/spec.json"))["package"])')
library=(-type f -name '*.py' ! -path '*/tests/*' ! -path '*/test/*' ! -path '*/.git/*' ! -name 'test_*.py' ! -name '*_test.py' ! -name conftest.py)
find "$work/$package" "${library[@]}" -delete
(cd /app && find "$package" "${library[@]}" ! -name sitecustomize.py ! -name usercustomize.py -print0) \
    | (cd /app && xargs -0 -r cp --parents -t "$work") 2>/dev/null
chmod -R a+rX "$work" && chmod a+rwx "$out"
cd "$work" || exit 0
readarray -t tests < <(python3 -I -c 'import json; s = json.load(open("/tests/spec.json")); print("\n".join(s["FAIL_TO_PASS"] + s["PASS_TO_PASS"]))')
readarray -t selection < <(python3 -I -c 'import json; s = json.load(open("/tests/spec.json")); print("\n".join(sorted({t.split("[")[0] for t in s["FAIL_TO_PASS"] + s["PASS_TO_PASS"]})))')
path=$(python3 -I -c 'import json; print(json.load(open("/tests/spec.json"))["path"])')
HOME="$out" /run/crucible/as-agent python3 -E -s -B {env}/swe_runner.py {env} "$path" -- -q -p no:cacheprovider -c {env}/pytest.ini \
    --rootdir . --junitxml "$out/junit.xml" -o junit_family=xunit1 "${{selection[@]}}" > "$out/log" 2>&1
python3 -I /tests/grade.py "$out/junit.xml" /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
exit 0
'''.replace("{env}", ENV_TARGET).replace("{{", "{").replace("}}", "}")

GRADE = '''"""Write 1 to argv[2] when every test of /tests/spec.json passed in the JUnit report argv[1], else 0, and print which
did not pass (nothing that varies from run to run, such as durations)."""
import json, sys
sys.path.insert(0, "/tests")
from junit import junit_outcomes
spec = json.load(open("/tests/spec.json"))
wanted = spec["FAIL_TO_PASS"] + spec["PASS_TO_PASS"]
try:
    outcomes = junit_outcomes(open(sys.argv[1]).read(), sorted({t.split("::")[0] for t in wanted}))
except Exception:
    outcomes = {}
for group in ("FAIL_TO_PASS", "PASS_TO_PASS"):
    bad = [t for t in spec[group] if outcomes.get(t) != "passed"]
    print(f"{group}: {len(spec[group]) - len(bad)} of {len(spec[group])} passed" + "".join(f"\\n  not passed: {t}" for t in bad[:10]))
open(sys.argv[2], "w").write("1" if all(outcomes.get(t) == "passed" for t in wanted) else "0")
'''

TEMPLATES = (
    "{title}\n\n{where}, `{name}` does not behave as it should. {doc}\n\nReproduction:\n\n```python\n{repro}\n```\n\nfails with\n\n```\n{error}\n```\n",
    "{title}\n\nI ran into this with {where}. {doc}\n\nThis fails:\n\n```python\n{repro}\n```\n\n```\n{error}\n```\n\nIs `{name}` broken?\n",
    "{title}\n\n{doc} But with {where}, the following check of `{name}` fails:\n\n```python\n{repro}\n```\n\nError:\n\n```\n{error}\n```\n",
)
TITLES = ("`{name}` gives a wrong result", "Bug in `{name}`", "`{name}` misbehaves", "Unexpected behaviour of `{name}`")
INSTRUCTION = ("You are in /app, a git repository of the Python project {project}. Fix the issue below by changing the library's "
               "source; do not change its tests. Run tests with `PYTHONPATH=/opt/swe-env:{path} python3 -m pytest -p no:cacheprovider "
               "<test files>`.\n\n{issue}")


def _check_projects(params: dict[str, Any]) -> list[Project]:
    names = params.get("projects")
    if names is None:
        return list(PROJECTS.values())
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise Unprocessable("suite.params.projects must be a non-empty list of project names", field="suite.params.projects")
    if unknown := sorted(set(names) - PROJECTS.keys()):
        raise Unprocessable(f"unknown swe projects {unknown}; available: {', '.join(PROJECTS)}", field="suite.params.projects")
    return [PROJECTS[n] for n in names]


@cache
def _candidates(name: str) -> tuple[Mutant, ...]:
    return tuple(swe_mutants.candidates(PROJECTS[name]))


def _verified(mutant: Mutant) -> Mutant | None:
    """``mutant`` verified on its project's tests (:func:`swe_mutants.verify`), its verdict recorded once in
    ``SWE_DIR/verified`` (:func:`swe_mutants.write_once`: a verdict another process recorded first is the one kept and
    returned). Raises :class:`~grader.suites.swe_mutants.CouldNotVerify`, recording nothing, when the tests could not
    be run to a verdict."""
    cached = SWE_DIR / "verified" / swe_mutants.STAMP / f"{mutant.id}.json"
    if cached.is_file():
        data = json.loads(cached.read_text())
    else:
        [kept] = swe_mutants.verify(PROJECTS[mutant.project], [mutant], workers=1) or [None]
        data = swe_mutants.write_once(cached, asdict(kept) if kept else {})
    return _mutant(data) if data else None


def _bugs(pool: list[Mutant], executor: ThreadPoolExecutor) -> Iterator[Mutant]:
    """The bugs of ``pool`` in the order :meth:`list.pop` takes them, verified :data:`VERIFY_WORKERS` at a time (the
    order, so the split, is the same however many verify at once)."""
    while pool:
        chunk = [pool.pop() for _ in range(min(VERIFY_WORKERS, len(pool)))]
        yield from (m for m in executor.map(_verified, chunk) if m is not None)


def _mutant(data: dict[str, Any]) -> Mutant:
    return Mutant(**{**data, "fail_to_pass": tuple(data["fail_to_pass"]), "pass_to_pass": tuple(data["pass_to_pass"])})


def _test_source(repo: Path, test_id: str) -> str:
    """The body of the test ``file::Class::name`` (its class's bases searched too, a parametrized id's base name)."""
    file, *path = test_id.split("::")
    name = path[-1].split("[")[0]
    for candidate in [repo / file, *sorted((repo / file).parent.glob("*.py"))]:
        source = candidate.read_text(errors="replace")
        for node in ast.walk(swe_mutants.parse(source)):
            if isinstance(node, ast.FunctionDef) and node.name == name:
                body = node.body[1:] if ast.get_docstring(node) and len(node.body) > 1 else node.body
                text = "".join(source.splitlines(keepends=True)[body[0].lineno - 1:body[-1].end_lineno])
                lines = textwrap.dedent(text).splitlines()
                return "\n".join(lines[:25] + (["# ..."] if len(lines) > 25 else []))
    return f"# see {name}"


ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")
"""An object's address in a failure message (``<function <lambda> at 0x7f18a8a16020>``), which the issue hides: two
deployments preparing the same seed's items must write the same issue."""


def issue_text(mutant: Mutant, rng: random.Random) -> str:
    """The issue a user could have written about ``mutant``: the function, its documented purpose, a reproduction (the
    first failing test's body) and the failure it gives, object addresses hidden (:data:`ADDRESS`) — never the fix."""
    project = PROJECTS[mutant.project]
    module = mutant.path[:-3].replace("/", ".").removeprefix(f"{project.path}/".replace("/", ".") if project.path != "." else "")
    module = module.removesuffix(".__init__")
    name = f"{module}.{mutant.function}"
    source = (project.repo / mutant.path).read_text()
    doc = ""
    for node in ast.walk(swe_mutants.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.lineno <= mutant.line <= (node.end_lineno or 0):
            first = (ast.get_docstring(node) or "").strip().split("\n\n")[0].replace("\n", " ")
            doc = f"Its documentation says: \"{first[:300]}\"" if first else ""
    error = ADDRESS.sub("0x…", mutant.failure)  # a repr's memory address differs from one run of the tests to the next
    values = {"name": name, "where": f"{project.name} {project.version}", "doc": doc,
              "repro": _test_source(project.repo, mutant.fail_to_pass[0]), "error": error.strip() or "the check fails"}
    title = "# " + rng.choice(TITLES).format(**values)
    return rng.choice(TEMPLATES).format(title=title, **values)


def gold_patch(mutant: Mutant, rewrite: swe_rewrite.Rewrite | None = None) -> str:
    """The fix as a unified diff against the base commit (``git apply``-able in the task's ``/app``): from
    ``R(mutated file)`` to ``R(original file)`` under ``rewrite`` (:mod:`grader.suites.swe_rewrite`; ``None``: the
    published text)."""
    import difflib

    original = (PROJECTS[mutant.project].repo / mutant.path).read_text()
    buggy = mutant.apply(original)
    path = mutant.path
    if rewrite is not None:
        original, buggy, path = rewrite.text(mutant.path, original), rewrite.text(mutant.path, buggy), rewrite.path(mutant.path)
    return "".join(difflib.unified_diff(buggy.splitlines(keepends=True), original.splitlines(keepends=True), f"a/{path}", f"b/{path}"))


@register_suite
class SweSuite:
    """See the module docstring."""

    name = "swe"
    default_harness = Harness()  # never used alone: a swe task is run by a code harness
    default_harness_folder = HARNESS_DIR
    slow_draws = True  # each item is verified on its project's tests as a split draws it: check-benchmark draws only with --draw

    def check_params(self, params: dict[str, Any]) -> None:
        for key in params:
            if key != "projects":
                raise Unprocessable(f"swe takes no parameter {key!r}; allowed: projects", field=f"suite.params.{key}")
        _check_projects(params)

    def generate(self, params: dict[str, Any], seed: int, size: int, *, split: str, exclude: frozenset[str] = frozenset()) -> list[Item]:
        """``size`` verified bugs drawn by ``seed`` (module docstring), each project seen through the seed's rewrite
        (:func:`swe_rewrite.checked`: the projects that will give a bug are checked at once, beside the bugs' verification);
        raises ``Unprocessable`` (field ``suite.splits.<split>.size``) when the candidates run out first."""
        rng = random.Random(seed)
        projects = _check_projects(params)
        pools = []
        for project in projects:
            pool = list(_candidates(project.name))
            rng.shuffle(pool)
            pools.append(pool)
        items: list[Item] = []
        with ThreadPoolExecutor(VERIFY_WORKERS) as executor:
            rewrites = {p.name: executor.submit(swe_rewrite.checked, p, seed) for p in projects[:size]}
            streams = [_bugs(pool, executor) for pool in pools]
            while len(items) < size and streams:
                for stream in list(streams):
                    for mutant in stream:
                        if mutant.id in exclude:
                            continue
                        if mutant.project not in rewrites:
                            rewrites[mutant.project] = executor.submit(swe_rewrite.checked, PROJECTS[mutant.project], seed)
                        item = self._item(mutant, random.Random(f"{seed}:{mutant.id}"), rewrites[mutant.project].result())
                        if item.question not in exclude:
                            items.append(item)
                            break
                    else:
                        streams.remove(stream)
                    if len(items) == size:
                        break
        if len(items) < size:
            raise Unprocessable(f"swe: only {len(items)} {split} bugs are left for these projects; ask for at most that many",
                                field=f"suite.splits.{split}.size")
        return items

    def _item(self, mutant: Mutant, rng: random.Random, rewrite: swe_rewrite.Rewrite) -> Item:
        """The task of ``mutant`` under ``rewrite``: the entry keeps the mutant as found on the published source (its
        ``fail_to_pass``… and the canonical form, the same under every rewrite) and the rewrite's ``key``; the issue,
        gold patch, test patch and SWE-bench's ``FAIL_TO_PASS``/``PASS_TO_PASS`` are the rewritten tree's."""
        project = PROJECTS[mutant.project]
        question = INSTRUCTION.format(project=project.name, path=project.path, issue=rewrite.words(issue_text(mutant, rng)))
        entry = {**asdict(mutant), "rewrite": rewrite.key, "patch": gold_patch(mutant, rewrite), "test_patch": [rewrite.path(f) for f in mutant.test_files],
                 "FAIL_TO_PASS": [rewrite.test_id(t) for t in mutant.fail_to_pass], "PASS_TO_PASS": [rewrite.test_id(t) for t in mutant.pass_to_pass]}
        return Item(id=mutant.id, question=question, answer="", entry=entry)

    def canonical(self, item: Item) -> Canonical | None:
        """The body of the first ``FAIL_TO_PASS`` test in the text view: every wording of the issue quotes it (the
        reproduction), so one bug drawn by two seeds (its issue worded differently), or two bugs of one function that
        one test catches, are one item to the splits (a public bug is never a test item) and to the contamination
        audit. ``None`` for an imported instance (its question is its key)."""
        if "archive" in item.entry:
            return None
        tokens = tuple(text_tokens(_test_source(PROJECTS[item.entry["project"]].repo, item.entry["fail_to_pass"][0])))
        return Canonical("text", tokens) if len(tokens) >= MIN_TEXT_TOKENS else None

    def item_space(self, params: dict[str, Any]) -> tuple[int, bool]:
        """The candidates of the params' projects (an upper bound: about half verify as bugs)."""
        return sum(len(_candidates(p.name)) for p in _check_projects(params)), False

    def score(self, answer: str | None, item: Item) -> float:
        """Not used: a swe task's score is its verifier's reward. 0.0."""
        return 0.0

    def environment(self, item: Item) -> TaskEnvironment:
        """``item``'s repository (the bug in, its test patch out, one commit) and verifier folder, written once per
        version of this suite under ``SWE_DIR/instances``, with the tests' runner mounted at ``/opt/swe-env``; an
        imported instance's Harbor folder (:func:`~grader.suites.base.imported_environment`) with the same mount."""
        mounts = ((SWE_DIR / "env", ENV_TARGET),)
        if "archive" in item.entry:
            return imported_environment(item.entry, mounts)
        mutant = _mutant({k: item.entry[k] for k in Mutant.__dataclass_fields__})
        rewrite = swe_rewrite.from_key(PROJECTS[mutant.project], item.entry["rewrite"]) if "rewrite" in item.entry else None
        name = f"{mutant.id}-{rewrite.key}" if rewrite else mutant.id
        folder = materialize(SWE_DIR / "instances" / _INSTANCE_STAMP / name, lambda tmp: _write_instance(mutant, tmp, rewrite))
        return TaskEnvironment(app=folder / "app", setup=None, tests=folder / "tests", agent_timeout_s=AGENT_TIMEOUT_S,
                               verifier_timeout_s=VERIFIER_TIMEOUT_S, mounts=mounts)


GIT_DATES = {"GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}


def commit_all(folder: Path, message: str) -> None:
    """Make ``folder`` a git repository of one commit holding every file in it (a fixed author and date), with git run
    as :func:`services.common.untrusted.git` runs it on a tree it did not write: every ``.git`` in the folder removed
    first, no configuration of the tree's (a ``.gitconfig``, a filter, hooks) read. Raises
    ``subprocess.CalledProcessError`` if git fails."""
    untrusted.strip_git(folder)
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "--no-verify", "--allow-empty", "-m", message]):
        untrusted.git(cmd, folder, env=GIT_DATES, check=True)


def write_verifier(tests: Path, *, package: str, path: str, fail_to_pass: list[str], pass_to_pass: list[str]) -> None:
    """The verifier's files into ``tests`` (beside ``tests/repo``, the pristine repository with the test patch in):
    ``test.sh``, ``grade.py``, ``junit.py`` and ``spec.json``. ``package``: the folder whose non-test ``.py`` files are
    taken from the harness's ``/app``; ``path``: the folder put on ``PYTHONPATH``."""
    (tests / "test.sh").write_text(VERIFIER)
    (tests / "grade.py").write_text(GRADE)
    (tests / "junit.py").write_text(_junit_module())
    (tests / "spec.json").write_text(json.dumps({"package": package, "path": path, "FAIL_TO_PASS": fail_to_pass, "PASS_TO_PASS": pass_to_pass}))


def _write_instance(mutant: Mutant, tmp: Path, rewrite: swe_rewrite.Rewrite | None) -> None:
    """``mutant``'s task folder: ``app`` (``R(mutated tree)``, its test patch out, one commit) and ``tests`` (the
    verifier, with ``R(original tree)`` as ``tests/repo``); ``rewrite`` ``None``: the published text (a task stored
    before the rewrite)."""
    project = PROJECTS[mutant.project]
    app, tests = tmp / "app", tmp / "tests"
    ignore = shutil.ignore_patterns(".prepared", "__pycache__", "*.pyc")
    source = rewrite.tree() if rewrite else project.repo
    rename = rewrite.path if rewrite else str
    shutil.copytree(source, app, ignore=ignore)
    buggy = mutant.apply((project.repo / mutant.path).read_text())
    (app / rename(mutant.path)).write_text(rewrite.text(mutant.path, buggy) if rewrite else buggy)
    for file in mutant.test_files:
        (app / rename(file)).unlink()
    commit_all(app, f"{project.name} {project.version}")
    tests.mkdir()
    shutil.copytree(source, tests / "repo", ignore=ignore)
    spec = rewrite.spec if rewrite else project
    write_verifier(tests, package=spec.package, path=spec.path, fail_to_pass=[rewrite.test_id(t) if rewrite else t for t in mutant.fail_to_pass],
                   pass_to_pass=[rewrite.test_id(t) if rewrite else t for t in mutant.pass_to_pass])


def _junit_module() -> str:
    """:func:`swe_mutants.junit_outcomes` as a module of its own, for the verifier's ``grade.py``."""
    source = Path(swe_mutants.__file__).read_text()
    node = next(n for n in swe_mutants.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "junit_outcomes")
    return "from __future__ import annotations\n\n\n" + (ast.get_source_segment(source, node) or "") + "\n"

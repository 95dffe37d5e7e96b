"""An operator's own tasks imported (:mod:`grader.imports`): Harbor task folders and SWE-bench instances read from an
upload, stored in a real test store, validated by running their oracles and a no-op harness in a real sandbox
(bubblewrap), refused with a reason when they do not hold, and drawn from for a test split."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from grader import imports, splits
from grader.model_endpoint import ModelEndpoint
from grader.sandboxes import get_sandbox
from grader.settings import GraderSettings
from grader.suites import Item, get_suite
from grader.suites.swe import GIT_DATES, gold_patch
from grader.suites.swe import _mutant as mutant_of
from grader.suites.swe_mutants import PROJECTS, Mutant
from grader.suites.terminal import TASKS_DIR
from grader.teststore import TestStore
from services.common import untrusted
from services.common.contracts import GradingSpec
from services.common.errors import Conflict, NotFound, Unprocessable
from tests.archives import pack_upload
from tests.unit.grader.scripted import run_script


@pytest.fixture()
def grader(tmp_path: Path) -> SimpleNamespace:
    """What the import logic uses of a grader: a real test store, the settings, and a queue that records what it is sent."""
    return SimpleNamespace(store=TestStore(f"sqlite:///{tmp_path / 'teststore.sqlite'}"), sent=[],
                           settings=GraderSettings(grader_test_seed=1, data_dir=tmp_path, rollout_wall_s=60, verifier_wall_s=120),
                           enqueue_import=lambda name: None)


def validate(grader: SimpleNamespace, endpoint: ModelEndpoint, name: str) -> dict[str, tuple[str, str | None]]:
    imports.validate_collection(grader, name, get_sandbox("bwrap"), endpoint)  # type: ignore[arg-type]
    return {t.name: (t.status, t.reason) for t in imports.collection_out(grader, name).tasks}  # type: ignore[arg-type]


def terminal_collection(root: Path) -> Path:
    """Two shipped tasks; one whose oracle is wrong; one without an oracle; one a harness resolves by doing nothing."""
    folder = root / "acme"
    for task in ("fizzbuzz-script", "dedupe-lines"):
        shutil.copytree(TASKS_DIR / task, folder / task)
    shutil.copytree(TASKS_DIR / "csv-column-sum", folder / "wrong-oracle")
    (folder / "wrong-oracle" / "solution" / "solve.sh").write_text("echo 0 > /app/sum.txt\n")
    shutil.copytree(TASKS_DIR / "count-log-errors", folder / "no-oracle")
    shutil.rmtree(folder / "no-oracle" / "solution")
    shutil.copytree(TASKS_DIR / "count-log-errors", folder / "always-passes")
    (folder / "always-passes" / "tests" / "test.sh").write_text("mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n")
    return folder


def test_harbor_task_folders_are_accepted_when_their_oracle_resolves_them_and_refused_with_the_reason_otherwise(
        grader: SimpleNamespace, endpoint: ModelEndpoint, tmp_path: Path) -> None:
    queued: list[str] = []
    grader.enqueue_import = queued.append
    out = imports.import_collection(grader, "acme", "terminal", pack_upload(terminal_collection(tmp_path)))  # type: ignore[arg-type]
    assert (out.status, out.pending, out.refused, queued) == ("validating", 4, 1, ["acme"])
    verdicts = validate(grader, endpoint, "acme")
    assert {k: v[0] for k, v in verdicts.items()} == {"fizzbuzz-script": "accepted", "dedupe-lines": "accepted", "wrong-oracle": "refused",
                                                      "no-oracle": "refused", "always-passes": "refused"}
    assert verdicts["no-oracle"][1] == "the folder lacks solution/solve.sh"
    assert verdicts["wrong-oracle"][1].startswith("its oracle (solution/solve.sh): reward 0, not 1")
    assert verdicts["always-passes"][1].startswith("a harness that does nothing: reward 1, not 0")
    assert imports.collection_out(grader, "acme").status == "done"  # type: ignore[arg-type]
    with pytest.raises(Conflict) as exc:
        imports.import_collection(grader, "acme", "terminal", pack_upload(terminal_collection(tmp_path / "again")))  # type: ignore[arg-type]
    assert exc.value.extra["field"] == "name"

    accepted = imports.collection_items(grader, "acme", "terminal")  # type: ignore[arg-type]
    assert sorted(i.id for i in accepted) == ["dedupe-lines", "fizzbuzz-script"]
    spec = GradingSpec.model_validate({"task_id": "t", "suite": {"name": "terminal", "splits": {"train": {"size": 1}, "validation": {"size": 1},
                                                                                                "test": {"size": 2, "collection": "acme"}}},
                                       "initial_system": {"model": "m"}, "evaluation": {}})
    drawn = splits.collection_split(spec, 5, accepted, [])
    assert sorted(i.id for i in drawn) == ["dedupe-lines", "fizzbuzz-script"] and drawn == splits.collection_split(spec, 5, accepted, [])
    with pytest.raises(Unprocessable) as exc:  # a public item is never a test item
        splits.collection_split(spec, 5, accepted, [Item(id="x", question=accepted[0].question, answer="")])
    assert exc.value.extra["field"] == "suite.splits.test.size"
    fizz = next(i for i in accepted if i.id == "fizzbuzz-script")  # an accepted item runs from its stored folder as the shipped one does
    solution = (TASKS_DIR / "fizzbuzz-script" / "solution" / "solve.sh").read_text()
    assert run_script(endpoint, "bwrap", "terminal", fizz, solution, wall_s=60, verifier_wall_s=60).reward == 1.0


def test_an_upload_that_is_not_a_collection_is_refused_naming_the_field(grader: SimpleNamespace, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for data, suite, field in [(b"not a tarball", "terminal", "file"), (pack_upload(tmp_path / "empty"), "terminal", "file"),
                               (pack_upload(tmp_path / "empty"), "swe", "file"), (pack_upload(tmp_path / "empty"), "math", "suite")]:
        with pytest.raises(Unprocessable) as exc:
            imports.import_collection(grader, "x", suite, data)  # type: ignore[arg-type]
        assert exc.value.extra["field"] == field
    with pytest.raises(NotFound):
        imports.collection_out(grader, "x")  # type: ignore[arg-type]
    with pytest.raises(Unprocessable) as exc:
        imports.collection_items(grader, "x", "terminal")  # type: ignore[arg-type]
    assert exc.value.extra["field"] == "suite.splits.test.collection"


def _git(repo: Path, *args: str) -> str:
    return untrusted.git(list(args), repo, env=GIT_DATES, check=True).stdout


def swe_collection(root: Path) -> Path:
    """SWE-bench instances made of two generated bugs: a git repository at the buggy base commit without the failing
    tests, which ``test_patch`` adds. One more instance whose FAIL_TO_PASS tests pass at the base commit (doing nothing
    resolves it), one whose patch does not apply and one whose repository is missing."""
    folder = root / "swe-acme"
    lines = []
    items = get_suite("swe").generate({"projects": ["inflection", "semver"]}, 11, 2, split="validation")
    for item in items:
        project = PROJECTS[item.entry["project"]]
        repo = folder / "repos" / f"acme__{project.name}"
        shutil.copytree(project.repo, repo, ignore=shutil.ignore_patterns(".prepared", "__pycache__"))
        original = (repo / item.entry["path"]).read_text()
        _git(repo, "init", "-q", "-b", "main")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "pristine")
        tests = {f: (repo / f).read_text() for f in _mutant(item).test_files}  # the published text's (the item's own are rewritten)
        (repo / item.entry["path"]).write_text(_mutant(item).apply(original))
        for f in tests:
            (repo / f).unlink()
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "base")
        base = _git(repo, "rev-parse", "HEAD").strip()
        for f, text in tests.items():
            (repo / f).write_text(text)
        _git(repo, "add", "-A")
        test_patch = _git(repo, "diff", "--cached")
        _git(repo, "reset", "-q", "--hard")
        instance = {"instance_id": f"acme__{project.name}-1", "repo": f"acme/{project.name}", "base_commit": base,
                    "problem_statement": item.question.split("\n\n", 1)[1], "patch": gold_patch(_mutant(item)), "test_patch": test_patch,
                    "FAIL_TO_PASS": json.dumps(item.entry["fail_to_pass"]), "PASS_TO_PASS": list(item.entry["pass_to_pass"]),
                    "python_path": project.path}
        lines.append(instance)
        if project.name == "inflection":
            lines.append({**instance, "instance_id": f"acme__{project.name}-passing", "FAIL_TO_PASS": list(item.entry["pass_to_pass"][:1]),
                          "PASS_TO_PASS": list(item.entry["pass_to_pass"][1:3])})
            lines.append({**instance, "instance_id": f"acme__{project.name}-bad-patch", "patch": "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n"})
            lines.append({**instance, "instance_id": "acme__gone-1", "repo": "acme/gone"})
    (folder / "instances.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def _mutant(item: Item) -> Mutant:
    return mutant_of({k: item.entry[k] for k in Mutant.__dataclass_fields__})


def test_swe_bench_instances_are_built_into_tasks_and_the_gold_patch_validates_them(grader: SimpleNamespace, endpoint: ModelEndpoint,
                                                                                    tmp_path: Path) -> None:
    out = imports.import_collection(grader, "swe-acme", "swe", pack_upload(swe_collection(tmp_path)))  # type: ignore[arg-type]
    assert (out.pending, out.refused) == (3, 2), out.tasks
    verdicts = validate(grader, endpoint, "swe-acme")
    assert {k: v[0] for k, v in verdicts.items()} == {"acme__inflection-1": "accepted", "acme__semver-1": "accepted", "acme__inflection-passing": "refused",
                                                      "acme__inflection-bad-patch": "refused", "acme__gone-1": "refused"}
    assert verdicts["acme__inflection-passing"][1].startswith("a harness that does nothing: reward 1, not 0")
    assert verdicts["acme__inflection-bad-patch"][1].startswith("its patch does not apply to the base commit")
    assert verdicts["acme__gone-1"][1] == "neither repos/acme__gone/ (a git repository) nor repos/acme__gone.tar.gz (an sdist) is in the archive"
    accepted = imports.collection_items(grader, "swe-acme", "swe")  # type: ignore[arg-type]
    item = next(i for i in accepted if i.id == "acme__inflection-1")
    assert "FAIL_TO_PASS" not in item.question and "git apply" not in item.question
    # the suite's cheats fail on an imported instance as on a generated one
    from tests.unit.grader.test_suite_swe import CHEATS

    cheats = [CHEATS[c] for c in ("plants a conftest.py", "deletes the tests", "plants a sitecustomize.py")]
    assert [run_script(endpoint, "bwrap", "swe", item, c, wall_s=60, verifier_wall_s=120).reward for c in cheats] == [0.0] * 3


def test_an_uploaded_repository_runs_nothing_of_its_own_and_bad_fields_are_refused(grader: SimpleNamespace, tmp_path: Path) -> None:
    """A repository whose own git configuration sets a filter driver (which ``git archive`` would run) for every file
    is read without running it; a ``base_commit`` that is an option, or a ``repo`` that climbs out of ``repos/``, is
    refused before git sees it."""
    folder = tmp_path / "evil"
    repo = folder / "repos" / "acme__evil"
    repo.mkdir(parents=True)
    marker = tmp_path / "filter-ran"
    (repo / "lib.py").write_text("def f():\n    return 1\n")
    (repo / "test_lib.py").write_text("from lib import f\n\ndef test_f():\n    assert f() == 1\n")
    (repo / ".gitattributes").write_text("* filter=evil\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "filter.evil.smudge", f"touch {marker}; cat")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    good = {"instance_id": "evil-1", "repo": "acme/evil", "base_commit": base, "problem_statement": "f is wrong", "FAIL_TO_PASS": ["test_lib.py::test_f"],
            "PASS_TO_PASS": [], "patch": "--- a/lib.py\n+++ b/lib.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n",
            "test_patch": "--- a/test_lib.py\n+++ b/test_lib.py\n@@ -3,2 +3,2 @@\n def test_f():\n-    assert f() == 1\n+    assert f() == 2\n"}
    lines = [good, {**good, "instance_id": "evil-2", "base_commit": "--output=/tmp/x"}, {**good, "instance_id": "evil-3", "repo": "../evil"}]
    (folder / "instances.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = imports.import_collection(grader, "evil", "swe", pack_upload(folder))  # type: ignore[arg-type]
    reasons = {t.name: (t.status, t.reason) for t in out.tasks}
    assert reasons["evil-1"] == ("pending", None) and not marker.exists()
    assert reasons["evil-2"] == ("refused", "base_commit '--output=/tmp/x' is not a commit's hexadecimal id")
    assert reasons["evil-3"] == ("refused", "repo '../evil' is not owner/name")

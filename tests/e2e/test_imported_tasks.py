"""``crucible admin import-tasks`` against the running services: the operator's own task folders go to the grader's
test store, are validated by the eval worker in the sandbox, and a benchmark's hidden test split is drawn from the
accepted ones, which no agent route shows."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from crucible.sdk import CrucibleAPIError, CrucibleClient
from grader.suites.terminal import TASKS_DIR
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e


def test_imported_tasks_are_validated_and_become_a_hidden_test_split(stack, admin, tmp_path: Path) -> None:  # noqa: ANN001
    folder = tmp_path / "acme-private"
    for task in ("dedupe-lines", "count-log-errors"):
        shutil.copytree(TASKS_DIR / task, folder / task)
        (folder / task / "instruction.md").write_text((folder / task / "instruction.md").read_text() + "\n(acme's own wording)\n")
    shutil.copytree(TASKS_DIR / "csv-column-sum", folder / "wrong-oracle")
    (folder / "wrong-oracle" / "solution" / "solve.sh").write_text("echo 0 > /app/sum.txt\n")
    cli = [str(Path(sys.executable).with_name("crucible")), "admin", "import-tasks", str(folder), "--suite", "terminal",
           "--gateway", stack.gateway_url, "--data-dir", str(stack.data_dir)]
    done = subprocess.run([*cli, "--name", "acme-private"], capture_output=True, text=True, timeout=600, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    print(done.stdout)
    assert done.returncode == 1, done.stderr  # one task refused
    assert "2 accepted, 1 refused, 0 pending" in done.stdout and "its oracle (solution/solve.sh): reward 0, not 1" in done.stdout
    again = subprocess.run([*cli, "--name", "acme-private", "--no-wait"], capture_output=True, text=True, timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert again.returncode == 1 and "exists" in again.stdout

    doc = yaml.safe_load((ROOT / "benchmarks" / "vibetraining-terminal.yaml").read_text())
    doc["name"] = "acme-terminal"
    doc["suite"]["splits"] = {"train": {"seed": 1, "size": 2}, "validation": {"seed": 2, "size": 1}, "test": {"size": 3, "collection": "acme-private"}}
    doc["evaluation"] |= {"max_turns": 1, "max_tokens": 16}
    with pytest.raises(CrucibleAPIError) as exc:  # only 2 were accepted
        admin.load_benchmark(doc)
    assert exc.value.status == 422 and "suite.splits.test.size" in str(exc.value.problem), exc.value.problem
    for test, field in [({"size": 2, "collection": "nope"}, "suite.splits.test.collection"), ({"size": 2, "collection": "Bad Name"}, "suite.splits.test.collection")]:
        with pytest.raises(CrucibleAPIError) as exc:
            admin.load_benchmark({**doc, "suite": {**doc["suite"], "splits": {**doc["suite"]["splits"], "test": test}}})
        assert exc.value.status == 422 and field in str(exc.value.problem), exc.value.problem
    doc["suite"]["splits"]["test"]["size"] = 2
    admin.load_benchmark(doc)
    baselines = admin.wait_baselines("acme-terminal")
    [task] = baselines["tasks"].values()
    assert (task["test_items"], baselines["initial_status"]) == (2, "succeeded"), baselines

    run = admin.create_run("acme-terminal", "import-test")
    client = CrucibleClient(stack.gateway_url, run["api_key"])
    shown = " ".join(i["question"] for i in client.validation_items() + client.train_sample(limit=100))
    assert "acme's own wording" not in shown
    listed = httpx.get(f"{stack.gateway_url}/admin/task-collections", headers={"Authorization": f"Bearer {admin_key(stack)}"}, timeout=30).json()
    assert [(c["name"], c["accepted"], c["refused"]) for c in listed["data"]] == [("acme-private", 2, 1)]
    assert "instruction" not in str(listed) and "acme's own wording" not in str(listed)


def admin_key(stack) -> str:  # noqa: ANN001
    from crucible.stack import admin_key as key

    return key(stack.data_dir)

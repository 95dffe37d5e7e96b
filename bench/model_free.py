"""How much of each hidden test split a system with no model solves, and what the null-model ablation costs.

    .venv/bin/python bench/model_free.py [--presets swe-mini,vibetraining-terminal] [--suites terminal,swe] [--items N] [--seed S]

For every task of every preset in ``benchmarks/*.yaml`` (``--presets``/``--suites`` select; the evaluator track's tasks
are left out: its submission is an evaluator, with no model to ablate), the grader draws the task's hidden test split
from a secret seed (``--seed``; default a fresh random one, printed), as loading the benchmark does, and grades these
systems on its first ``--items`` items (default all) with its own worker (:func:`grader.worker.run_evaluation`, in
this process, real sandboxes, every model call answered by the null model, :mod:`grader.model_endpoint`):

- **null harness**: a code harness that does nothing (``true``);
- **null model**: the preset's initial system's harness with the null model in place of its model: the ablation final
  grading runs on every submission (``model_free_score``);
- **restore release** (swe only, where ``bench/harnesses/restore_release`` exists): a harness that copies each
  project's publicly released library files over the task's repository, with no model call.

Prints per task the share of items each system solves (score 1) with its mean score, and the ablation's cost: the
null model's sandbox seconds (what a code harness's rollouts, set-ups and verifiers ran) and wall seconds; the last line
is the largest share over everything and whether it meets the goal (at most 5 %). Run ``make swe-projects`` first for
the swe preset.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inference_service.client import InferenceClient  # noqa: E402

from gateway.benchmarks import grading_spec, parse_benchmark  # noqa: E402
from grader import grading_tasks, harness_archives, repository, worker  # noqa: E402
from grader.harness_archives import code_harness_for  # noqa: E402
from grader.model_endpoint import NULL_MODEL  # noqa: E402
from grader.models import PLATFORM_RUN  # noqa: E402
from grader.service import MIGRATIONS_DIR, Grader  # noqa: E402
from grader.settings import GraderSettings  # noqa: E402
from grader.suites import get_suite  # noqa: E402
from grader.teststore import TestStore  # noqa: E402
from services.common.contracts import GradingSpec  # noqa: E402
from services.common.db import Database, migrate  # noqa: E402
from services.ledger.client import LedgerClient  # noqa: E402
from tests.archives import code_harness  # noqa: E402

GOAL = 0.05  # the most of a hidden split a system without a model may solve
SPENT: Counter[str] = Counter()  # evaluation id -> sandbox seconds its rollouts used


def _counting_sandbox_seconds() -> None:
    """Count each rollout's sandbox seconds per evaluation (a test grading charges none, so none is recorded)."""
    charge = worker._EvaluationRun.charge_sandbox

    def counted(self: worker._EvaluationRun, key: str, sandbox_s: int) -> None:
        SPENT[self.eval_id] += sandbox_s
        charge(self, key, sandbox_s)

    worker._EvaluationRun.charge_sandbox = counted  # type: ignore[method-assign]


@dataclass(frozen=True)
class Result:
    """One system's grading of one task's test items: the share solved (score 1), the mean score, sandbox and wall seconds."""

    solved: float
    mean: float
    sandbox_s: int
    wall_s: float

    def __str__(self) -> str:
        return f"{self.solved:6.1%} ({self.mean:.2f})"


def grader_in(tmp: Path, seed: int) -> Grader:
    """A grader on SQLite files in ``tmp`` with test seed ``seed``, its queue a list nobody reads (the baselines it queues
    are not run), its inference and ledger unreachable: the null model never calls inference, and test grading charges
    nothing."""
    settings = GraderSettings(data_dir=tmp, grader_test_seed=seed, inference_url="http://127.0.0.1:9", ledger_url="http://127.0.0.1:9")
    url = f"sqlite:///{tmp / 'grader.sqlite'}"
    migrate(url, MIGRATIONS_DIR)
    return Grader(settings=settings, db=Database(url), store=TestStore(f"sqlite:///{tmp / 'teststore.sqlite'}"),
                  ledger=LedgerClient.connect(settings), inference=InferenceClient.connect(settings), enqueue=lambda _eval_id: None)


def grade(grader: Grader, spec: GradingSpec, items: int, *, archive: str | None) -> Result:
    """Grade ``spec``'s initial system (with ``archive`` as its code harness where given) on the first ``items`` test items
    with the null model, as final grading's ablation does; raises if the grading does not succeed."""
    initial = spec.initial_system
    with grader.db.session() as s:
        eval_id = repository.add_evaluation(s, spec, run_id=None, purpose="ablation", split="test", model=initial.model,
                                            harness=grading_tasks.harness_for(spec, initial.harness), items_total=items,
                                            harness_archive=archive, ablation=NULL_MODEL).id
    started = time.monotonic()
    worker.run_evaluation(grader, eval_id)
    wall = time.monotonic() - started
    with grader.db.session() as s:
        ev = repository.evaluation(s, eval_id)
        if ev.status != "succeeded":
            raise RuntimeError(f"the grading of {spec.task_id} ended {ev.status}: {ev.error}")
    scores = list(grader.store.done(eval_id).values())
    return Result(solved=sum(1 for x in scores if x >= 1.0) / len(scores), mean=sum(scores) / len(scores), sandbox_s=SPENT[eval_id], wall_s=wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="", help="comma-separated preset names (default: every benchmarks/*.yaml)")
    parser.add_argument("--suites", default="", help="comma-separated suites (default: all)")
    parser.add_argument("--items", type=int, default=0, help="grade the first N test items of each task (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="the grader's secret test seed (0: a random one)")
    args = parser.parse_args()
    seed = args.seed or secrets.randbits(31)
    presets, suites = set(filter(None, args.presets.split(","))), set(filter(None, args.suites.split(",")))
    _counting_sandbox_seconds()
    try:
        from bench.harnesses.restore_release.release import archive as restore_release
    except ImportError:
        restore_release = None
    print(f"test seed {seed}; solved share (mean score) of each system with no model; goal: at most {GOAL:.0%} solved")
    print(f"{'preset':<24}{'task':<14}{'suite':<17}{'items':>6}{'null harness':>16}{'null model':>16}{'restore release':>17}"
          f"{'ablation sandbox s':>20}{'wall s':>8}")
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="crucible-model-free-") as tmp:
        grader = grader_in(Path(tmp), seed)
        null_harness = harness_archives.store_archive(grader, PLATFORM_RUN, code_harness("true\n"), name="null-harness").id
        restore = None
        for path in sorted((ROOT / "benchmarks").glob("*.yaml")):
            bm = parse_benchmark(yaml.safe_load(path.read_text(encoding="utf-8")))
            if presets and bm.name not in presets:
                continue
            if bm.track == "evaluator":
                print(f"{bm.name:<24}(the evaluator track: its submission is an evaluator, no model to ablate)")
                continue
            for task in bm.task_list():
                if suites and task.suite.name not in suites:
                    continue
                spec = grading_spec(bm, task, f"bm_{bm.name}_{task.name}".replace("-", "_").replace(".", "_"))
                grading_tasks.register_task(grader, spec)
                items = min(args.items or spec.suite.splits.test.size, len(grader.store.items(spec.task_id)))
                suite = get_suite(spec.suite.name)
                initial = code_harness_for(grader, None, suite, spec.initial_system.harness, spec.initial_system.harness_archive)
                nothing = grade(grader, spec, items, archive=null_harness)
                ablation = grade(grader, spec, items, archive=initial)
                released = None
                if spec.suite.name == "swe" and restore_release is not None:
                    restore = restore or harness_archives.store_archive(grader, PLATFORM_RUN, restore_release(), name="restore-release").id
                    released = grade(grader, spec, items, archive=restore)
                worst = max(worst, nothing.solved, ablation.solved, released.solved if released else 0.0)
                print(f"{bm.name:<24}{task.name:<14}{spec.suite.name:<17}{items:>6}{nothing!s:>16}{ablation!s:>16}"
                      f"{str(released) if released else '–':>17}{ablation.sandbox_s:>20}{ablation.wall_s:>8.0f}", flush=True)
        grader.close()
    print(f"largest solved share: {worst:.1%} ({'meets' if worst <= GOAL else 'misses'} the goal of at most {GOAL:.0%})")


if __name__ == "__main__":
    main()

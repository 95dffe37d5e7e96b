"""One rollout of a scripted harness (no model called) on a suite's task, in a real sandbox."""

from __future__ import annotations

from grader.harness_archives import inspect_archive
from grader.model_endpoint import Binding, ModelEndpoint
from grader.rollouts import RolloutLimits, RolloutOutcome, run_rollout
from grader.sandboxes import get_sandbox
from grader.suites import Item, get_suite
from tests.archives import code_harness


def run_script(endpoint: ModelEndpoint, backend: str, suite: str, item: Item, script: str, *, wall_s: float, verifier_wall_s: float) -> RolloutOutcome:
    """A harness that runs ``script`` with bash, on ``item`` of ``suite``."""
    data = code_harness(script)
    binding = Binding(model="m", ctx=None, hold_id=None, key=f"eval_test:{item.id}:0", context_tokens=None, max_tokens=16, max_calls=1)
    return run_rollout(get_sandbox(backend), endpoint, archive=data, archive_id="har_test", manifest=inspect_archive(data),
                       instruction=item.question, binding=binding, environment=get_suite(suite).environment(item),
                       caps=RolloutLimits(wall_s=wall_s, verifier_wall_s=verifier_wall_s))

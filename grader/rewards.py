"""GRPO's environment: the prompts of the run's task's training pool and the rewards of completions of them.

The trainer, training a policy with GRPO for a run, asks for the training pool's prompts as a declarative harness
renders them (:func:`pool_prompts`), samples a group of completions per prompt, and asks for their rewards
(:func:`score_completions`): the answer the harness extracts from each completion, scored by the suite's own scorer
(:func:`grader.scoring.score_item`), exactly as a validation evaluation scores a sample.

Only the task's public training pool (:func:`grader.grading_tasks.train_pool`, a function of the benchmark file
alone) is rendered or scored here. Validation and test items never are: an id that is not a training-pool item is
refused with the same 422 (field ``completions[i].item_id``) whatever it is, unknown, validation or test id, so the
answer does not reveal whether an id is a test item. Nothing here reads the test store.

Only suites whose items are answered in one completion can be rewarded so: a suite of sandboxed multi-turn tasks
(``environment``), of conversations the grader drives (``converse``), or whose items offer the model tools (the
prompts are chat messages alone) is refused with 422 field ``suite``. Rewards are not charged to the run (the
trainer meters its own generation); the scorers' work is bounded by the suites' own limits (reasoning-gym's scorers
run in child processes with a wall-clock limit, :mod:`grader.suites.isolated`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from grader import repository
from grader.grading_tasks import check_public, harness_for, train_pool
from grader.sandboxes import SandboxUnavailable
from grader.scoring import score_item
from grader.service import Grader
from grader.suites import Item, Suite, get_suite, suite_converse
from services.common.auth import RunContext
from services.common.contracts import GradingSpec, Harness, PoolPrompt, PoolPromptsRequest, Reward, RewardRequest
from services.common.errors import Unprocessable, UpstreamUnavailable
from services.common.harness import check_harness, extract_answer, render_messages


def _spec(grader: Grader, ctx: RunContext) -> GradingSpec:
    """The run's task's grading spec; raises ``NotFound`` unless the task is registered."""
    with grader.db.session() as s:
        return repository.spec(s, ctx.task_id)


def _single_completion_suite(spec: GradingSpec) -> Suite:
    """The task's suite; raises ``Unprocessable`` (field ``suite``) unless its items are answered in one completion
    of chat messages alone (no sandboxed environment, no conversation the grader drives, no tools)."""
    suite = get_suite(spec.suite.name)
    if getattr(suite, "environment", None) is not None or suite_converse(suite) is not None:
        raise Unprocessable(f"the {spec.suite.name} suite's tasks are multi-turn; grpo rewards single completions", field="suite")
    if getattr(suite, "tools", None) is not None:
        raise Unprocessable(f"the {spec.suite.name} suite's items offer the model tools, which grpo's prompts (chat messages alone) "
                            "do not carry", field="suite")
    return suite


def _harness(spec: GradingSpec, harness: Harness | None) -> Harness:
    """``harness`` (checked) or the task's initial system's declarative harness, with the task's evaluation settings
    applied; raises ``Unprocessable`` naming the field (``harness…``)."""
    if harness is not None:
        check_harness(harness)
        return harness_for(spec, harness)
    if spec.initial_system.harness_archive:
        raise Unprocessable("the task's initial system runs a code harness archive, which cannot render grpo's prompts; "
                            "give a declarative harness", field="harness")
    return harness_for(spec, spec.initial_system.harness)


def resolve_harness(grader: Grader, ctx: RunContext, harness: Harness | None) -> Harness:
    """The declarative harness that renders the run's task's prompts and extracts answers for its rewards: ``harness``
    (checked by :func:`services.common.harness.check_harness`) or, when ``None``, the task's initial system's, either with the
    task's evaluation settings applied (:func:`grader.grading_tasks.harness_for`).

    Raises ``Unprocessable``: field ``suite`` for a suite whose items are not answered in one completion, ``harness…``
    for a harness that cannot be used, ``harness`` when none is given and the initial system runs a code harness
    archive. ``NotFound`` if the run's task is not registered.
    """
    spec = _spec(grader, ctx)
    _single_completion_suite(spec)
    return _harness(spec, harness)


def pool_prompts(grader: Grader, ctx: RunContext, req: PoolPromptsRequest) -> list[PoolPrompt]:
    """Every item of the run's task's training pool, in pool order, with the chat ``messages`` the harness renders
    for it (:func:`services.common.harness.render_messages`: the system prompt, if any, then the user message). Raises as
    :func:`resolve_harness`."""
    check_public(grader, ctx)
    harness = resolve_harness(grader, ctx, req.harness)
    return [PoolPrompt(item_id=it.id, messages=render_messages(harness, it.question)) for it in train_pool(grader, ctx.task_id)]


def score_completions(grader: Grader, ctx: RunContext, req: RewardRequest) -> list[Reward]:
    """The reward of each completion, in the request's order: the answer the harness extracts from it
    (:func:`services.common.harness.extract_answer`; ``None`` when none is found) scored by the suite's scorer against the
    training-pool item it names (:func:`grader.scoring.score_item`: a reward in [0, 1], 0.0 with a ``reason`` when the
    scorer could not score the answer). Up to ``grader.settings.scoring_concurrency`` answers are scored at once.

    Raises ``Unprocessable`` field ``completions[i].item_id`` for the first completion whose id is no item of the
    training pool (before anything is scored; the same answer for an unknown, a validation or a test id), as
    :func:`resolve_harness`, and ``UpstreamUnavailable`` (503) when the suite runs answers as programs (HumanEval) and
    this process cannot start a sandbox. Nothing is charged.
    """
    check_public(grader, ctx)
    spec = _spec(grader, ctx)
    suite = _single_completion_suite(spec)
    harness = _harness(spec, req.harness)
    pool = {it.id: it for it in train_pool(grader, ctx.task_id)}
    items: list[Item] = []
    for i, completion in enumerate(req.completions):
        item = pool.get(completion.item_id)
        if item is None:
            raise Unprocessable(f"completions[{i}].item_id is not an item of the run's training pool", field=f"completions[{i}].item_id")
        items.append(item)

    def reward(pair: tuple[str, Item]) -> Reward:
        completion, item = pair
        answer = extract_answer(harness, completion, entry_point=item.entry.get("entry_point"))
        value, reason = score_item(suite, answer, item)
        return Reward(item_id=item.id, reward=value, answer=answer, reason=reason)

    pairs = [(c.completion, item) for c, item in zip(req.completions, items, strict=True)]
    try:
        with ThreadPoolExecutor(max_workers=min(grader.settings.scoring_concurrency, len(pairs))) as pool_of_scorers:
            return list(pool_of_scorers.map(reward, pairs))
    except SandboxUnavailable as exc:  # the suite runs answers as programs and this grader process has no sandbox
        raise UpstreamUnavailable(f"the grader cannot start a sandbox to score {spec.suite.name} answers here: {exc}",
                                  retry_after_s=60) from exc

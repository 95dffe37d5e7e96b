"""Evaluators of the evaluator track: one run of an evaluator archive on one candidate, and a frozen evaluator's grade.

An evaluator is a code archive (the harness-archive format: ``crucible.toml`` with ``entry`` and ``install``, checked
at upload by :func:`grader.harness_archives.inspect_archive`). It runs as a code harness does
(:func:`grader.rollouts.run_rollout`, no task environment): in a fresh sandbox whose one network peer is the rollout
model endpoint, which serves exactly one candidate under its opaque name (``OPENAI_MODEL``), within the benchmark's
:class:`~services.common.contracts.EvaluatorBudget` (calls, tokens, tokens per call, wall seconds). It reads
``{"candidate": "candidate-03"}`` on stdin and prints JSON lines on stdout:

- ``{"item": "<id>", "score": 0.5, "domain": "math", "weight": 1}`` per item it finished (``domain`` and ``weight``
  optional), as it goes;
- ``{"score": 0.62, "domains": {"math": 0.5, "code": 0.74}}`` once, at the end (``domains`` optional).

Scores are numbers in [0, 1]. An evaluator stopped by its budget, or one that prints no final line, is graded on what it
finished: the weighted mean of its item lines (``partial``); with neither, the candidate gets no score and ranks
lowest. Other lines (its own logs) are ignored. The last 16 KiB of stdout are read (a sandbox keeps that much): keep item
lines short, or print only the final line.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from grader import agreement
from grader.harness_archives import HarnessManifest
from grader.model_endpoint import Binding, ModelEndpoint
from grader.rollouts import RolloutLimits, run_rollout
from grader.sandboxes import Sandbox
from services.common.auth import RunContext
from services.common.contracts import CandidateEvaluation, EvaluatorBudget, EvaluatorGrade, SystemSpec, TargetAgreement


@dataclass(frozen=True)
class Output:
    """What an evaluator printed: its final ``score`` and ``domains`` (``None``: no final line) and its ``items`` as
    ``(score, weight, domain)``; ``error``: why a line it meant as a result was refused."""

    score: float | None
    domains: dict[str, float]
    items: list[tuple[float, float, str | None]]
    error: str | None = None


def _unit(value: Any) -> float | None:
    """``value`` as a float in [0, 1], else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value <= 1:
        return None
    return float(value)


def parse_output(stdout: str) -> Output:
    """The results in an evaluator's standard output (see the module docstring). A result line with a score that is
    not a number in [0, 1], or a weight that is not a non-negative number, is left out and named in ``error``."""
    score, domains, items, error = None, {}, [], None
    for n, line in enumerate(stdout.splitlines(), start=1):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict) or "score" not in doc:
            continue
        value = _unit(doc["score"])
        if value is None:
            error = f"line {n}: score {doc['score']!r} is not a number in [0, 1]"
            continue
        if "item" in doc:
            weight = doc.get("weight", 1)
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) or weight < 0:
                error = f"line {n}: weight {weight!r} is not a non-negative number"
                continue
            domain = doc.get("domain")
            items.append((value, float(weight), domain if isinstance(domain, str) else None))
        else:
            score = value
            raw = doc.get("domains")
            domains = {str(k): u for k, v in raw.items() if (u := _unit(v)) is not None} if isinstance(raw, dict) else {}
    return Output(score=score, domains=domains, items=items, error=error)


def candidate_score(stdout: str) -> float | None:
    """The score an evaluator's output gives its candidate: its final score, else the weighted mean of the items it
    finished, else ``None``."""
    out = parse_output(stdout)
    return out.score if out.score is not None else _weighted_mean(out.items)


def _weighted_mean(items: list[tuple[float, float, str | None]]) -> float | None:
    total = sum(w for _, w, _ in items)
    return None if total <= 0 else sum(s * w for s, w, _ in items) / total


def _top_items_share(items: list[tuple[float, float, str | None]]) -> float | None:
    """The largest :func:`grader.agreement.top_items_share` over the score and each of its domains."""
    groups: dict[str | None, list[tuple[float, float]]] = {None: [(s, w) for s, w, _ in items]}
    for s, w, domain in items:
        if domain is not None:
            groups.setdefault(domain, []).append((s, w))
    shares = [share for group in groups.values() if (share := agreement.top_items_share(group)) is not None]
    return max(shares) if shares else None


def run_evaluator(sandbox: Sandbox, endpoint: ModelEndpoint, *, archive: bytes, archive_id: str, manifest: HarnessManifest,
                  candidate: str, system: SystemSpec, budget: EvaluatorBudget, caps: RolloutLimits, ctx: RunContext | None,
                  hold_id: str | None, key: str, context_tokens: int | None = None, check: Callable[[], None] = lambda: None,
                  unbind_wait_s: float = 1800.0) -> tuple[CandidateEvaluation, Any]:
    """Run the evaluator once on ``candidate`` (whose system is ``system``; the evaluator sees only the name):
    ``(its result, the rollout's outcome)``. Its model calls are charged against ``hold_id`` under idempotency keys
    ``<key>:<call>`` (``None``: not charged); ``caps`` bound the sandbox, and ``budget.wall_s`` lowers its wall time;
    ``unbind_wait_s``: how long calls still in flight when it ends are waited for (their charges).
    Raises what :func:`grader.rollouts.run_rollout` raises (``SandboxUnavailable``)."""
    binding = Binding(model=system.model, ctx=ctx, hold_id=hold_id, key=key, context_tokens=context_tokens, max_tokens=budget.max_tokens,
                      max_calls=budget.calls, candidate=(candidate, system), max_total_tokens=budget.tokens)
    outcome = run_rollout(sandbox, endpoint, archive=archive, archive_id=archive_id, manifest=manifest,
                          instruction=json.dumps({"candidate": candidate}) + "\n", binding=binding, environment=None,
                          caps=dataclasses.replace(caps, wall_s=min(caps.wall_s, budget.wall_s)), check=check, unbind_wait_s=unbind_wait_s)
    trajectory = outcome.trajectory
    ran = trajectory.harness_run
    out = parse_output(ran.stdout if ran else "")
    exhausted = [name for name, spent in (("calls", trajectory.model_calls >= budget.calls),
                                          ("tokens", trajectory.prompt_tokens + trajectory.completion_tokens >= budget.tokens),
                                          ("wall", ran is not None and ran.limit == "wall")) if spent]
    score, partial = out.score, False
    if score is None and out.items:
        score, partial = _weighted_mean(out.items), True
    failure = None
    if score is None:
        failure = trajectory.failure or out.error or "it printed no score (a JSON line {\"score\": x} with x in [0, 1])"
    truncated = sum(1 for c in binding.calls if c is not None and c.finish_reason == "length")
    return CandidateEvaluation(candidate=candidate, score=score, domains=out.domains, items=len(out.items), partial=partial, exhausted=exhausted,
                               truncated_calls=truncated, top_items_share=_top_items_share(out.items), model_calls=trajectory.model_calls,
                               prompt_tokens=trajectory.prompt_tokens, completion_tokens=trajectory.completion_tokens,
                               sandbox_s=outcome.sandbox_s, failure=failure), outcome


def grade(results: Mapping[str, CandidateEvaluation], targets: Mapping[str, Mapping[str, float]], sealed: list[str]) -> EvaluatorGrade:
    """The grade of a frozen evaluator whose run on each candidate is ``results`` (candidate → its result), against
    ``targets`` (target → candidate → its score on that target, every candidate scored) of which ``sealed`` are the
    graded ones; the ceiling of each is taken over all ``targets``. A candidate the evaluator gave no score ranks lowest
    (score −1). Means are over the sealed targets where the figure is defined (``None`` where it is for none)."""
    scores = {c: (r.score if r.score is not None else -1.0) for c, r in results.items()}
    rows = []
    for name in sealed:
        target = targets[name]
        low, high = agreement.agreement_interval(scores, target)
        rows.append(TargetAgreement(target=name, pairwise_agreement=agreement.pairwise_agreement(scores, target), ci_low=low, ci_high=high,
                                    kendall_tau=agreement.kendall_tau(scores, target),
                                    concordance=agreement.concordance({c: max(v, 0.0) for c, v in scores.items()}, target),
                                    ceiling=agreement.ceiling(targets, name)))

    def mean(field: str) -> float | None:
        values = [v for r in rows if (v := getattr(r, field)) is not None]
        return sum(values) / len(values) if values else None

    calls = sum(r.model_calls for r in results.values())
    shares = [r.top_items_share for r in results.values() if r.top_items_share is not None]
    return EvaluatorGrade(
        pairwise_agreement=mean("pairwise_agreement"), kendall_tau=mean("kendall_tau"), concordance=mean("concordance"), ceiling=mean("ceiling"),
        targets=rows, candidates=len(results), model_calls=calls, prompt_tokens=sum(r.prompt_tokens for r in results.values()),
        completion_tokens=sum(r.completion_tokens for r in results.values()), sandbox_s=sum(r.sandbox_s for r in results.values()),
        exhausted=sum(1 for r in results.values() if r.exhausted), partial=sum(1 for r in results.values() if r.partial),
        failed=sum(1 for r in results.values() if r.score is None),
        truncated_share=sum(r.truncated_calls for r in results.values()) / calls if calls else None,
        top_items_share=max(shares) if shares else None)

"""Running OpenAI-style graders (:mod:`services.common.graders`: their wire models and what each kind means) on a batch
of samples: a graded GRPO job's rewards (the trainer) and OpenAI's ``graders.run`` (the gateway), one route
(``POST /internal/graders/run``).

:func:`run_grader` gives one :class:`GraderResult` per sample, in order. A sample a grader cannot score gets reward 0.0
and an ``error`` kind, never an exception that fails the batch:

- ``template``: a template of the grader does not render for this sample (a variable it lacks: ``item.answer`` of a row
  without ``answer``, ``sample.output_json.x`` when the answer is not JSON); ``error_details`` names the grader's field
  and the variable. Templates see ``sample`` = ``{"output_text": <the answer>, "output_json": <the answer parsed as
  JSON, or None>}`` and ``item`` = the sample's dataset row.
- ``python_runtime`` / ``python_timeout``: ``grade`` raised (``error_details``: the exception's last traceback line),
  returned something that is not a finite number (``bool`` included), or the sandbox's program ended or ran out of
  time before it reached the sample.
- ``model_parse``: the grading model's answer holds no score (``score_model``) or none of the labels (``label_model``).
- ``model_server``: inference failed on this call itself (a 5xx other than 503).
- ``formula``: a ``multi`` grader's ``calculate_output`` cannot be computed for this sample (a division by zero).

What is the request's or the run's problem, not a sample's, is raised and fails the batch: inference's answers for the
run (402 when its budget cannot pay the grading model, 404 for a model it does not serve, 422, 429, 503) pass through
unchanged (``UpstreamProblem``), ``UpstreamUnavailable`` (503) while inference cannot be reached or when this process
cannot start a sandbox for a ``python`` grader. Model calls go through the run's metered inference with no hold of the
grader's (:meth:`InferenceClient.chat_completions`: inference holds and settles each call on the run's budget; the
tokens are in ``model_tokens``). Up to :data:`MODEL_CONCURRENCY` model calls run at once.

A ``python`` grader's batch runs as one program in one sandbox of the grader's backend (:mod:`grader.sandboxes`, as
HumanEval's programs: no network, no capabilities, read-only userland), not one sandbox per sample: :data:`RUNNER`
reads the samples from its standard input, imports the user's ``source`` as a module and calls ``grade(sample, item)``
on each sample in turn, each call under a CPU timer of :data:`PYTHON_SAMPLE_CPU_S` seconds, and appends each result as a
JSON line to a file whose random name only the runner was told; what the user's code prints is ignored. The user's code
runs in the runner's process, so it could reach the runner's memory (the other samples of the batch, the results file):
a grader a run gives scores only that run's own samples, so this is no isolation matter, and the results file makes the
rewards robust against what ``grade`` prints. The program's limits: :func:`python_limits`.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, TypeVar

import jinja2
from pydantic import ValidationError

from grader.sandboxes import ExecResult, Limits, Mount, SandboxUnavailable, configured_sandbox, workspace
from grader.sandboxes.base import SANDBOX_PYTHON
from grader.service import Grader
from services.common.auth import RunContext
from services.common.errors import Unprocessable, UpstreamProblem, UpstreamUnavailable
from services.common.graders import (
    TEMPLATES,
    FormulaError,
    GraderResult,
    GraderRunRequest,
    LabelModelGrader,
    MultiGrader,
    PythonGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
    evaluate_formula,
    sample_namespace,
)
from services.common.openai_protocol import ChatCompletionRequest

T = TypeVar("T")
R = TypeVar("R")

MODEL_CONCURRENCY = 4
"""Grading-model calls of one batch in flight at once."""
DEFAULT_MAX_TOKENS = 256
"""A model grader's answer length (tokens) when ``sampling_params.max_completions_tokens`` is not set."""
DETAILS_CHARS = 1000
"""``error_details`` are cut to this many characters."""


@dataclass(frozen=True)
class Sample:
    """One sample as graders see it: ``fields`` (templates' ``sample``, ``grade``'s first argument) and ``item``."""

    fields: dict[str, Any]
    item: dict[str, Any]


def sample_view(output_text: str, item: dict[str, Any]) -> Sample:
    """``output_text`` and its row as graders see them (:func:`services.common.graders.sample_namespace`: ``output_json``
    is the text parsed as JSON, any JSON value, ``None`` when it is not JSON)."""
    return Sample(fields=sample_namespace(output_text), item=item)


def run_grader(grader: Grader, ctx: RunContext, req: GraderRunRequest) -> list[GraderResult]:
    """One result per sample of ``req``, in order, by ``req.grader`` (module docstring: rewards, per-sample errors).

    Raises ``UpstreamProblem`` (inference's problem for a model grader's call, passed through: 402, 404, 422, 429, 503),
    ``UpstreamUnavailable`` (inference unreachable; no sandbox for a ``python`` grader here) and ``Unprocessable``
    (field ``grader.input``) when a model grader's rendered messages exceed what a chat request may carry.
    """
    samples = [sample_view(s.output_text, s.item) for s in req.samples]
    return grade_samples(grader, ctx, req.grader, samples)


def grade_samples(grader: Grader, ctx: RunContext, spec: Any, samples: Sequence[Sample]) -> list[GraderResult]:  # noqa: ANN401 - any grader spec
    """``spec`` (any grader of :data:`services.common.graders.Grader`) on ``samples``; raises as :func:`run_grader`."""
    match spec:
        case StringCheckGrader():
            return [_each(lambda s: _string_check(spec, s), s) for s in samples]
        case TextSimilarityGrader():
            return [_each(lambda s: _text_similarity(spec, s), s) for s in samples]
        case PythonGrader():
            return run_python(spec, samples)
        case ScoreModelGrader() | LabelModelGrader():
            return concurrently(lambda s: _each(partial(_model_grade, grader, ctx, spec), s), samples)
        case MultiGrader():
            return _multi(grader, ctx, spec, samples)
    raise TypeError(f"not a grader spec: {type(spec).__name__}")


# --------------------------------------------------------------------------- templates


class TemplateFailed(Exception):
    """A template did not render for a sample; ``result()`` is the sample's result."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")

    def result(self) -> GraderResult:
        return failed("template", str(self))


@lru_cache(maxsize=64)
def _compiled(text: str) -> jinja2.Template:
    return TEMPLATES.from_string(text)


def render(text: str, sample: Sample, field: str) -> str:
    """Template ``text`` (the grader's field ``field``) rendered for ``sample``; raises :class:`TemplateFailed` naming
    the field and the problem (a missing variable: ``'dict object' has no attribute 'answer'``, ``'x' is undefined``;
    an unsafe attribute, a division by zero)."""
    try:
        return _compiled(text).render(sample=sample.fields, item=sample.item)
    except jinja2.UndefinedError as exc:
        raise TemplateFailed(field, str(exc)) from None
    except Exception as exc:  # any other error of the template's own code (SecurityError, TypeError, ZeroDivisionError, …)
        raise TemplateFailed(field, f"{type(exc).__name__}: {exc}") from None


def failed(kind: str, details: str) -> GraderResult:
    """A sample the grader could not score: reward 0.0 and the error ``kind``."""
    return GraderResult(reward=0.0, error=kind, error_details=details[:DETAILS_CHARS])


def _each(score: Callable[[Sample], GraderResult], sample: Sample) -> GraderResult:
    try:
        return score(sample)
    except TemplateFailed as exc:
        return exc.result()


# --------------------------------------------------------------------------- string_check, text_similarity


def string_check(operation: str, text: str, reference: str) -> float:
    """1.0 when ``text`` ``operation`` ``reference`` holds (``eq``, ``ne``; ``like``: ``reference`` occurs in ``text``;
    ``ilike``: the same after Unicode case folding), else 0.0."""
    match operation:
        case "eq":
            return float(text == reference)
        case "ne":
            return float(text != reference)
        case "like":
            return float(reference in text)
        case "ilike":
            return float(reference.casefold() in text.casefold())
    raise ValueError(f"unknown string_check operation {operation!r}")


def _string_check(spec: StringCheckGrader, sample: Sample) -> GraderResult:
    text, reference = render(spec.input, sample, "input"), render(spec.reference, sample, "reference")
    return GraderResult(reward=string_check(spec.operation, text, reference))


def _fuzzy_match(text: str, reference: str) -> float:
    """rapidfuzz's ``fuzz.ratio`` / 100: the normalized Indel similarity, ``1 - (insertions + deletions) / (len(a) +
    len(b))`` (1.0 for two empty texts)."""
    from rapidfuzz import fuzz

    return fuzz.ratio(text, reference) / 100.0


def _bleu(text: str, reference: str) -> float:
    """sacrebleu's ``sentence_bleu(text, [reference]).score`` / 100: BLEU-4 of one sentence with its defaults (13a
    tokenization, exponential smoothing, effective order), Post (2018), "A Call for Clarity in Reporting BLEU Scores"."""
    import sacrebleu

    return sacrebleu.sentence_bleu(text, [reference]).score / 100.0


def _gleu(text: str, reference: str) -> float:
    """NLTK's ``sentence_gleu([reference tokens], text tokens)`` (Google-BLEU, 1- to 4-grams: the smaller of n-gram
    precision and recall; Wu et al. (2016), Google's neural machine translation system), tokens split on whitespace."""
    from nltk.translate.gleu_score import sentence_gleu

    return float(sentence_gleu([reference.split()], text.split()))


@lru_cache(maxsize=8)
def _rouge_scorer(kind: str) -> Any:  # noqa: ANN401 - rouge_score's RougeScorer
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([kind])


def _rouge(kind: str) -> Callable[[str, str], float]:
    def score(text: str, reference: str) -> float:
        """Google's rouge-score F-measure (``RougeScorer([kind]).score(reference, text)``: lower-cased alphanumeric
        tokens, no stemming); Lin (2004), "ROUGE: A Package for Automatic Evaluation of Summaries". ROUGE-n of texts with
        fewer than n tokens is 0."""
        return float(_rouge_scorer(kind).score(reference, text)[kind].fmeasure)

    return score


SIMILARITY: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": _fuzzy_match, "bleu": _bleu, "gleu": _gleu,
    **{f"rouge_{n}": _rouge(f"rouge{n}") for n in range(1, 6)}, "rouge_l": _rouge("rougeL"),
}
"""``evaluation_metric`` → ``metric(text, reference)`` in [0, 1]. The libraries are imported on first use: NLTK's import
alone takes seconds, which a grader that runs no ``gleu`` or ``rouge_*`` grader should not pay."""


def similarity(metric: str, text: str, reference: str) -> float:
    """``metric`` (a key of :data:`SIMILARITY`) of ``text`` against ``reference``, clipped into [0, 1] (sacrebleu's
    100.0 / 100 may come out a hair above 1)."""
    return min(1.0, max(0.0, SIMILARITY[metric](text, reference)))


def _text_similarity(spec: TextSimilarityGrader, sample: Sample) -> GraderResult:
    text, reference = render(spec.input, sample, "input"), render(spec.reference, sample, "reference")
    return GraderResult(reward=similarity(spec.evaluation_metric, text, reference))


# --------------------------------------------------------------------------- python

PROGRAM_DIR = "/program"
"""The batch's directory in its sandbox: ``runner.py``, ``user_grader.py`` (the grader's ``source``), the results file."""
PYTHON_SAMPLE_CPU_S = 1.0
"""CPU seconds one ``grade`` call (and the import of ``source``) may use before it is interrupted (``python_timeout``)."""
PYTHON_BATCH_CPU_S = 60.0
"""The most CPU seconds a batch's program gets, however many samples it has."""
STARTUP_CPU_S = 0.5
"""CPU seconds for the sandbox's init and the interpreter's start-up (about 0.1 s), which the backend counts with the program's."""
PYTHON_MEMORY_MB = 1024

RUNNER = '''"""Crucible's python grader runner: grade(sample, item) of user_grader.py on each sample of the job on stdin."""
import importlib.util, json, math, signal, sys, traceback


class _Timeout(BaseException):
    pass


def _expire(signum, frame):
    raise _Timeout()


def _last_line(exc):
    return traceback.format_exception_only(type(exc), exc)[-1].strip()[:1000]


def main():
    job = json.loads(sys.stdin.buffer.read())
    cpu_s = job["sample_cpu_s"]
    out = open(job["results"], "a", encoding="utf-8")

    def record(i, **fields):
        out.write(json.dumps({"i": i, **fields}) + "\\n")
        out.flush()

    signal.signal(signal.SIGPROF, _expire)
    grade, problem = None, None
    try:
        signal.setitimer(signal.ITIMER_PROF, cpu_s)
        try:
            spec = importlib.util.spec_from_file_location("user_grader", job["source"])
            module = importlib.util.module_from_spec(spec)
            sys.modules["user_grader"] = module
            spec.loader.exec_module(module)
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        grade = getattr(module, "grade", None)
        if not callable(grade):
            problem = ("python_runtime", "the source defines no function grade(sample, item)")
    except _Timeout:
        problem = ("python_timeout", f"importing the source used more than {cpu_s} s of CPU")
    except BaseException as exc:
        problem = ("python_runtime", "importing the source: " + _last_line(exc))
    for i, entry in enumerate(job["samples"]):
        if problem is not None:
            record(i, error=problem[0], details=problem[1])
            continue
        try:
            try:
                signal.setitimer(signal.ITIMER_PROF, cpu_s)
                value = grade(entry["sample"], entry["item"])
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                record(i, error="python_runtime", details=f"grade returned {type(value).__name__} {repr(value)[:200]}, not a finite number")
            else:
                record(i, reward=float(value))
        except _Timeout:
            record(i, error="python_timeout", details=f"grade(sample, item) used more than {cpu_s} s of CPU")
        except BaseException as exc:
            record(i, error="python_runtime", details=_last_line(exc))
    out.close()


main()
'''
"""The batch's program (module docstring): the job on stdin is ``{"source", "results", "sample_cpu_s", "samples":
[{"sample", "item"}, …]}``; each line of the results file ``{"i", "reward"}`` or ``{"i", "error", "details"}``."""


def python_limits(samples: int) -> Limits:
    """The limits of a batch of ``samples`` samples' program: :data:`PYTHON_SAMPLE_CPU_S` CPU seconds per sample and one
    more for the import, at most :data:`PYTHON_BATCH_CPU_S` in all, plus :data:`STARTUP_CPU_S`; a wall-clock backstop of
    ``max(30, 3 × cpu_s)`` seconds for a program that waits without computing (at most 181.5 s); 1 GiB of memory, 16
    processes, 32 MiB of disk, 16 MiB per file."""
    cpu_s = STARTUP_CPU_S + min(PYTHON_BATCH_CPU_S, PYTHON_SAMPLE_CPU_S * (samples + 1))
    return Limits(wall_s=max(30.0, 3.0 * cpu_s), cpu_s=cpu_s, memory_mb=PYTHON_MEMORY_MB, processes=16, disk_mb=32, file_mb=16)


def run_python(spec: PythonGrader, samples: Sequence[Sample]) -> list[GraderResult]:
    """``spec.source``'s ``grade`` on every sample, in one sandboxed program (module docstring); a sample it did not
    reach gets ``python_timeout`` when the program ran out of CPU or wall-clock time, else ``python_runtime``. Raises
    ``UpstreamUnavailable`` (503) when this process cannot start a sandbox: never a 0 reward."""
    limits = python_limits(len(samples))
    results_name = f"results-{secrets.token_hex(16)}.jsonl"
    job = {"source": f"{PROGRAM_DIR}/user_grader.py", "results": f"{PROGRAM_DIR}/{results_name}", "sample_cpu_s": PYTHON_SAMPLE_CPU_S,
           "samples": [{"sample": s.fields, "item": s.item} for s in samples]}
    try:
        with workspace(limits.disk_mb) as folder:
            (folder / "user_grader.py").write_text(spec.source, encoding="utf-8")
            (folder / "runner.py").write_text(RUNNER, encoding="utf-8")
            ran = configured_sandbox().run([SANDBOX_PYTHON, "-I", "-B", "runner.py"], mounts=[Mount(folder, PROGRAM_DIR, writable=True)],
                                           cwd=PROGRAM_DIR, env={}, limits=limits, stdin=json.dumps(job).encode())
            recorded = read_results(folder / results_name, len(samples), limits.file_mb)
    except SandboxUnavailable as exc:
        raise UpstreamUnavailable(f"the grader cannot start a sandbox to run python graders here: {exc}", retry_after_s=60) from exc
    return [recorded.get(i) or _unreached(ran, limits) for i in range(len(samples))]


def read_results(path: Path, samples: int, file_mb: int) -> dict[int, GraderResult]:
    """The results the runner wrote for samples ``0 … samples - 1`` (the first well-formed line of each; a line that is
    not one, or a reward that is not a finite number, is skipped); nothing when the file is missing."""
    try:
        with path.open("rb") as handle:
            lines = handle.read(file_mb * 1024 * 1024).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return {}
    found: dict[int, GraderResult] = {}
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or type(entry.get("i")) is not int or not 0 <= entry["i"] < samples or entry["i"] in found:
            continue
        reward, error = entry.get("reward"), entry.get("error")
        if type(reward) in (int, float) and math.isfinite(reward):
            found[entry["i"]] = GraderResult(reward=float(reward))
        elif error in ("python_runtime", "python_timeout"):
            found[entry["i"]] = failed(error, str(entry.get("details") or ""))
    return found


def _unreached(ran: ExecResult, limits: Limits) -> GraderResult:
    if ran.limit in ("cpu", "wall"):
        budget = f"{limits.cpu_s:g} s of CPU" if ran.limit == "cpu" else f"{limits.wall_s:g} s"
        return failed("python_timeout", f"the batch's program ran out of its {budget} before grading this sample")
    why = f"its {ran.limit} limit" if ran.limit else f"exit code {ran.exit_code}"
    said = ran.stderr.strip().splitlines()[-1:]
    return failed("python_runtime", f"the batch's program ended ({why}) before grading this sample" + (f": {said[0]}" if said else ""))


# --------------------------------------------------------------------------- score_model, label_model

NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def _finite_number(value: Any) -> bool:  # noqa: ANN401 - any JSON value
    return type(value) in (int, float) and math.isfinite(value)


def _json_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects in ``text``: the whole text if it is one, else each ``{…}`` that parses, in order."""
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    for start in (m.start() for m in re.finditer(r"\{", text)):
        try:
            value, _ = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


def parse_score(text: str) -> float | None:
    """The score in a grading model's answer: ``result`` (else ``score``) of the last JSON object in it that has a number
    there, else the last finite number in the text; ``None`` when there is neither."""
    for obj in reversed(_json_objects(text)):
        for key in ("result", "score"):
            if _finite_number(obj.get(key)):
                return float(obj[key])
    numbers = [x for x in (float(m) for m in NUMBER.findall(text)) if math.isfinite(x)]
    return numbers[-1] if numbers else None


def parse_label(text: str, labels: Sequence[str]) -> str | None:
    """The label a grading model answered: the one the stripped answer equals (ignoring case), else the one that occurs
    earliest in it as a whole word (ignoring case; the longer label where two start at the same place: ``very good``
    before ``very``); ``None`` when no label occurs."""
    answer = text.strip()
    for label in labels:
        if answer.casefold() == label.casefold():
            return label
    best: tuple[int, int, str] | None = None
    for label in labels:
        found = re.search(rf"(?<!\w){re.escape(label)}(?!\w)", answer, re.IGNORECASE)
        if found and (best is None or (found.start(), -len(label)) < best[:2]):
            best = (found.start(), -len(label), label)
    return best[2] if best else None


def model_request(spec: ScoreModelGrader | LabelModelGrader, messages: list[dict[str, str]]) -> ChatCompletionRequest:
    """The chat request for a model grader's rendered ``messages``: ``sampling_params`` as set (``max_tokens``:
    ``max_completions_tokens`` or :data:`DEFAULT_MAX_TOKENS`; inference's defaults for the rest). Raises ``Unprocessable``
    (field ``grader.input``, or ``grader.<field>``) for a request the chat model refuses (messages over its characters)."""
    params = getattr(spec, "sampling_params", None)
    options: dict[str, Any] = {"max_tokens": (params and params.max_completions_tokens) or DEFAULT_MAX_TOKENS}
    if params is not None:
        options |= {k: v for k, v in {"temperature": params.temperature, "top_p": params.top_p, "seed": params.seed}.items() if v is not None}
    try:
        return ChatCompletionRequest(model=spec.model, messages=messages, **options)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        where = str(first["loc"][0]) if first["loc"] else "input"
        field = "grader.input" if where == "messages" else f"grader.{where}"
        raise Unprocessable(f"{field}: {first['msg']}", field=field) from None


def _model_grade(grader: Grader, ctx: RunContext, spec: ScoreModelGrader | LabelModelGrader, sample: Sample) -> GraderResult:
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": render(m.template(), sample, f"input[{i}].content")}
                for i, m in enumerate(spec.input)]
    try:
        answer = grader.inference.chat_completions(ctx, model_request(spec, messages))
    except UpstreamProblem as exc:
        if exc.status < 500 or exc.status == 503:  # the run's or the request's problem (budget, model, fields) or retry later
            raise
        return failed("model_server", f"inference answered {exc.status}: {exc}")
    text = answer.choices[0].message.content or ""
    tokens = answer.usage.prompt_tokens + answer.usage.completion_tokens
    if isinstance(spec, ScoreModelGrader):
        score = parse_score(text)
        if score is None:
            return failed("model_parse", f"no score in the model's answer: {text[:200]!r}").model_copy(update={"model_tokens": tokens})
        low, high = spec.bounds()
        return GraderResult(reward=min(high, max(low, score)), model_tokens=tokens)
    label = parse_label(text, spec.labels)
    if label is None:
        return failed("model_parse", f"none of the labels in the model's answer: {text[:200]!r}").model_copy(update={"model_tokens": tokens})
    return GraderResult(reward=float(label in spec.passing_labels), model_tokens=tokens)


def concurrently(work: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``work`` of each item, in order, up to :data:`MODEL_CONCURRENCY` at once; the first exception is raised and the
    calls not yet started are dropped."""
    with ThreadPoolExecutor(max_workers=max(1, min(MODEL_CONCURRENCY, len(items)))) as pool:
        futures = [pool.submit(work, item) for item in items]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise


# --------------------------------------------------------------------------- multi


def _multi(grader: Grader, ctx: RunContext, spec: MultiGrader, samples: Sequence[Sample]) -> list[GraderResult]:
    """Each named grader on the batch, then ``calculate_output`` per sample over their rewards (a failed part counts
    0.0 and its error, the first in the graders' order, is the sample's, its details prefixed with the part's name); a
    formula that cannot be computed gives 0.0 and ``formula``. ``model_tokens``: the parts' sum."""
    parts = {name: grade_samples(grader, ctx, sub, samples) for name, sub in spec.named().items()}
    results = []
    for i in range(len(samples)):
        mine = {name: got[i] for name, got in parts.items()}
        rewards = {name: r.reward for name, r in mine.items()}
        tokens = sum(r.model_tokens for r in mine.values())
        first_error = next(((name, r) for name, r in mine.items() if r.error), None)
        try:
            reward = evaluate_formula(spec.calculate_output, rewards)
        except FormulaError as exc:
            results.append(failed("formula", f"calculate_output: {exc}").model_copy(update={"sub_rewards": rewards, "model_tokens": tokens}))
            continue
        error, details = (first_error[1].error, f"{first_error[0]}: {first_error[1].error_details}") if first_error else (None, None)
        results.append(GraderResult(reward=reward, sub_rewards=rewards, error=error, error_details=details, model_tokens=tokens))
    return results

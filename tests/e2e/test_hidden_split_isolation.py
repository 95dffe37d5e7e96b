"""No public answer depends on the hidden split: a differential test over two deployments.

Every preset in ``benchmarks/`` is loaded into two embedded deployments that differ only in the grader's secret
test seed (so their hidden test splits differ). A run on each makes the same calls an outsider would: every
agent ``GET`` route of the OpenAPI document (once per task where a route takes one), the whole training pool
page by page, a validation evaluation and its trajectories, a chat completion, refused requests, a final
submission, every read-only MCP tool of the gateway's ``/mcp``, and the public leaderboard. Apart from identifiers and timestamps (which differ between any two
deployments) and the final grades themselves, the answers must be byte-identical. The hidden splits are then
read from the two test stores (the test plays the auditor) to show they differed, so the test could fail.

Presets are scaled for test time in what costs inference (test and validation items graded, output caps,
samples); the training pools, where the leak was, keep the sizes the files give. Every system is the test-only model
(``tiny-smollm2``: SmolLM2's architecture, tokenizer and chat template, random weights): what is compared is what
the routes answer, which a model's knowledge does not change, and its rollouts cost a fortieth of the base's.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import yaml

from crucible.sdk import AdminClient, CrucibleClient
from tests.conftest import PORT_BASE, ROOT, STACK_ENV, prepared_models
from tests.mcp_client import read_everything
from tests.models import TINY_MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # in `make test-slow`: two deployments, every preset
PRESETS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.yaml"))
SEEDS = (1111, 2222)
# What a final grade is made of (a submission's score and model-free score; a leaderboard row's scores, intervals, audit result and the rank
# they give), and the run's elapsed hours (a clock)
GRADES = frozenset({"score", "initial_score", "final_score", "reference_score", "gap_closed", "rsi_index", "ci_low", "ci_high", "n",
                    "final_ci", "contaminated", "contaminated_items", "contamination", "rank", "elapsed_hours", "evaluator",
                    "model_free_score", "model_free_above_initial"})
_ID = re.compile(r"\b(?:run|ds|job|ckpt|eval|sub|bm|crk|req|chatcmpl|ent|hold|har)[_-][0-9A-Za-z_-]{6,}")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?")


def scaled(doc: dict) -> dict:
    """The preset with few graded items (4 validation, 6 test; 2 and 3 for a suite of sandboxed rollouts) and short
    outputs, its initial systems on the test-only model; training pools as shipped."""
    doc = copy.deepcopy(doc)
    doc["name"] = f"{doc['name']}-differential"
    for i, candidate in enumerate(doc.get("candidates") or []):  # the evaluator track: greedy candidates, kept distinct
        candidate["model"] = TINY_MODEL
        candidate.setdefault("harness", {}).update(temperature=0.0, system_prompt=f"{candidate['harness'].get('system_prompt', '')} ({i})")
    for task in doc.get("tasks") or [doc]:
        if "initial_system" in task:
            task["initial_system"]["model"] = TINY_MODEL
        splits = task["suite"]["splits"]
        sandboxed = task["suite"]["name"] in ("terminal", "swe")  # each graded item a rollout of a code harness in a sandbox
        splits["test"]["size"] = 3 if sandboxed else 6
        splits["validation"]["size"] = min(splits["validation"]["size"], 2 if sandboxed else 4)
        for settings in filter(None, [task.get("evaluation"), doc.get("evaluation")]):
            settings["max_tokens"] = min(settings["max_tokens"], 6)
            settings["samples"] = 1
            settings["metric"] = "avg@k"
    return doc


@pytest.fixture(scope="module")
def deployments(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Any]]:
    """Two embedded stacks whose graders hold different secret test seeds (and nothing else differs)."""
    from crucible.stack import Stack, ensure_secrets

    stacks = []
    for i, seed in enumerate(SEEDS):
        data_dir = tmp_path_factory.mktemp(f"differential-{i}")
        (data_dir / "models").symlink_to(prepared_models(TINY_MODEL), target_is_directory=True)  # every system's model
        grader_env = ensure_secrets(data_dir)[2]
        (data_dir / "secrets" / "grader.env").write_text(
            f"CRUCIBLE_GRADER_TEST_SEED={seed}\nCRUCIBLE_GRADER_TEST_STORE_URL={grader_env['CRUCIBLE_GRADER_TEST_STORE_URL']}\n")
        stacks.append(Stack(data_dir, PORT_BASE + 60 + 10 * i, extra_env=STACK_ENV))
    errors: list[BaseException] = []

    def start(s: Any) -> None:
        try:
            s.start(timeout_s=300)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(s,)) for s in stacks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        if errors:
            raise errors[0]
        yield stacks
    finally:
        for s in stacks:
            s.stop()


def _mask(value: Any) -> Any:
    """``value`` with its final grades replaced by a placeholder (recursively)."""
    if isinstance(value, dict):
        return {k: ("<grade>" if k in GRADES and v is not None else _mask(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v) for v in value]
    return value


def _without_sandbox_time(value: Any) -> Any:
    """``value`` with what a sandbox's wall-clock time is billed taken out (recursively): sandbox seconds are metered by
    the clock, so two deployments under different load bill a rollout 3 or 4 seconds whatever their hidden splits. A
    budget's ``sandbox_seconds`` (µUSD and seconds) is blanked and its µUSD moved from spent back to remaining, so
    every other charge is still compared to the µUSD."""
    if isinstance(value, list):
        return [_without_sandbox_time(v) for v in value]
    if not isinstance(value, dict):
        return value
    value = {k: _without_sandbox_time(v) for k, v in value.items()}
    sandbox = (value.get("spent_by_kind") or {}).get("sandbox_seconds")
    if isinstance(sandbox, int):
        value["spent_usd_micros"] -= sandbox
        value["remaining_usd_micros"] += sandbox
        value["spent_by_kind"]["sandbox_seconds"] = value["usage_by_kind"]["sandbox_seconds"] = "<time>"
    return value


def _report_without_clocks(report: dict) -> dict:
    """The run report less what the clock decides: its spend series (charges fall into time steps), money (sandbox
    seconds are billed by the clock; the budget route compares the money) and the agent's calls (a polling client
    asks as often as the work takes)."""
    designs = [{k: v for k, v in d.items() if k != "cost_usd_micros"} for d in report["designs"]]
    time = [t | {"count": "<polls>"} if t["activity"] == "agent" else t for t in report["time"]]
    return ({k: v for k, v in report.items() if k not in ("spend", "spent_usd_micros", "designs", "time", "agent_calls")}
            | {"designs": designs, "time": time})


class Transcript:
    """What one deployment answered, normalized: ids numbered by first appearance, timestamps (ISO 8601 and Unix),
    the run's remaining seconds, a rollout's sandbox seconds and their price blanked (:func:`_without_sandbox_time`; a
    leaderboard row's ``spent_usd`` with them), final grades masked."""

    def __init__(self) -> None:
        self.ids: dict[str, str] = {}
        self.lines: list[str] = []

    def add(self, call: str, response: httpx.Response, *, grades: bool = False) -> Any:
        """Record ``response``; ``grades``: it may hold final grades (submissions, the leaderboard), which are masked."""
        try:
            body: Any = _without_sandbox_time(response.json())
            body = _mask(body) if grades else body
            text = json.dumps(body, sort_keys=True)
        except ValueError:
            body, text = None, response.text
        text = _ID.sub(lambda m: self.ids.setdefault(m.group(0), f"<id{len(self.ids)}>"), text)
        text = _TIME.sub("<time>", text)
        text = re.sub(r'"(seconds_left|created)": \d+', r'"\1": "<time>"', text)  # the run's clock; OpenAI's Unix-time stamp
        text = re.sub(r'"elapsed_s": [\d.]+', '"elapsed_s": "<time>"', text)  # how long a rollout's sandbox ran
        text = re.sub(r'(\\"sandbox_s\\": ?)\d+', r'\1<time>', text)  # an evaluator's seconds on a candidate, in its result's JSON
        text = re.sub(r'"(wall_s|busy_s|exclusive_s|waiting_and_grading_s|waiting_and_grading_share)": [\d.e-]+', r'"\1": "<time>"', text)
        self.lines.append(f"{call} -> {response.status_code} {response.headers.get('content-type', '')}\n{text}")
        return body


def _session(stack: Any, doc: dict) -> Transcript:
    """Load ``doc``, make one run and walk every public route as an outsider would."""
    from crucible.stack import admin_key

    admin = AdminClient(stack.gateway_url, admin_key(stack.data_dir))
    bench = admin.load_benchmark(doc)
    admin.wait_baselines(bench["name"], poll_s=0.5)  # the hidden split's baseline grading is done before the run starts
    run = admin.create_run(bench["name"], "differential-agent")
    client = CrucibleClient(stack.gateway_url, run["api_key"])
    log = Transcript()

    class Paced:  # a polite client: a 429 is waited out (Retry-After) and the call made again, unrecorded
        def __getattr__(self, method: str) -> Any:
            def call(*args: Any, **kwargs: Any) -> httpx.Response:
                while (r := getattr(client.http, method)(*args, **kwargs)).status_code == 429:
                    time.sleep(float(r.headers.get("retry-after", "1")))
                return r
            return call

    http = Paced()
    tasks = [t["name"] for t in doc.get("tasks", [])] or [None]
    sealed_targets = {t["name"] for t in doc.get("tasks", []) if t.get("target") == "sealed"}

    spec = httpx.get(f"{stack.gateway_url}/openapi.json", timeout=30).json()
    for path, ops in sorted(spec["paths"].items()):
        if "get" not in ops or path.startswith("/admin") or "{" in path or path in ("/v1/leaderboard", "/leaderboard"):  # graded: below
            continue
        takes_task = any(p["name"] == "task" for p in ops["get"].get("parameters", []))
        for task in ([None, *tasks] if takes_task else [None]):
            log.add(f"GET {path} task={task}", http.get(path, params={"task": task} if task else {}))
    for task in tasks:
        params = {"task": task} if task else {}
        offset = 0
        while True:  # the whole training pool, where hidden items used to be skipped
            page = log.add(f"GET train-sample {task} {offset}", http.get("/v1/suite/train-sample", params={**params, "offset": offset, "limit": 10_000}))
            if sealed := task in sealed_targets:  # none of its items is shown: a 404, recorded
                assert page["status"] == 404, page
                break
            assert "data" in page, page
            if not page["data"]:
                break
            offset += len(page["data"])
        shown = http.get("/v1/suite/validation", params=params).json()
        question = "2 + 3 =" if sealed else shown["data"][0]["question"]
        log.add("POST chat", http.post("/v1/chat/completions", json={"model": TINY_MODEL, "max_tokens": 4, "temperature": 0,
                                                                       "messages": [{"role": "user", "content": question}]}))
        # one item: the transformers engine pads the prompts it batches together, and in fp32 on a CPU a near tie between
        # two tokens can go either way with the padding, so which items share a batch (a matter of timing) must not vary
        ev = log.add(f"POST evaluation {task}", http.post("/v1/evaluations", params=params, json={"model": TINY_MODEL, "limit": 1}))
        if "id" in ev:  # the evaluator track's tasks refuse a model (422, recorded): its evaluator is walked below
            eval_id = ev["id"]
            client.wait_evaluation(eval_id, 0.5)
            log.add(f"GET evaluation {task}", http.get(f"/v1/evaluations/{eval_id}"))
            log.add(f"GET trajectories {task}", http.get(f"/v1/evaluations/{eval_id}/trajectories"))
        log.add(f"POST bad evaluation {task}", http.post("/v1/evaluations", params=params, json={"model": "no-such-model"}))
        log.add(f"GET train-sample past the end {task}", http.get("/v1/suite/train-sample", params={**params, "offset": 10**6}))
        sub = log.add(f"POST submission {task}", http.post("/v1/submissions", params=params, json={"model": TINY_MODEL}), grades=True)
        if "id" in sub:
            client.wait_submission(sub["id"], 0.5)
            log.add(f"POST second submission {task}", http.post("/v1/submissions", params=params, json={"model": TINY_MODEL}), grades=True)
    if doc.get("track") == "evaluator":  # an evaluator piloted on the candidates, then frozen
        eval_id, sub = _evaluator_session(http, log, [t["name"] for t in doc["tasks"] if t.get("target") == "development"], sorted(sealed_targets))
    for path in ("/v1/run", "/v1/budget", "/v1/evaluations"):
        log.add(f"GET {path} at the end", http.get(path))
    ids = {"eval_id": eval_id, "sub_id": sub["id"]}  # the last task's
    for tool, is_error, content in read_everything(stack.gateway_url, run["api_key"], ids):  # a coding agent's MCP tools
        content = _report_without_clocks(content) if tool == "run_report" else content
        log.add(f"MCP {tool}", httpx.Response(400 if is_error else 200, json=content), grades=tool in ("submission", "list_submissions"))
    log.add("GET /v1/submissions at the end", http.get("/v1/submissions"), grades=True)
    rows = httpx.get(f"{stack.gateway_url}/v1/leaderboard", timeout=30).json()["data"]
    row = [r | {"spent_usd": "<money, compared in the budget>"} for r in rows if r["run_id"] == run["id"]]  # it holds sandbox time
    log.add("leaderboard row", httpx.Response(200, json=row), grades=True)
    client.close()
    return log


def _evaluator_session(http: Any, log: Transcript, targets: list[str], sealed: list[str]) -> tuple[str, dict]:
    """The evaluator track's own calls: the development targets' candidate scores, the sealed targets' (404), the reference
    agent's evaluator piloted (its agreement with the development targets and each candidate's run) and frozen."""
    from crucible.evaluator_agent import evaluator_archive

    def until_done(path: str) -> None:  # polled through the paced client: the calls above used up the key's second
        while http.get(path).json()["status"] in ("queued", "running"):
            time.sleep(0.5)

    for target in targets + sealed:
        log.add(f"GET candidate-scores {target}", http.get("/v1/suite/candidate-scores", params={"task": target}))
    items = [{"id": f"{t}/{it['id']}", "question": it["question"], "answer": it["answer"], "domain": t}
             for t in targets for it in http.get("/v1/suite/validation", params={"task": t}).json()["data"][:1]]
    upload = http.post("/v1/harnesses", files={"file": ("evaluator.tar.gz", evaluator_archive(items, max_tokens=4), "application/gzip")})
    archive = log.add("POST evaluator archive", upload)["id"]
    params = {"task": "evaluator"}
    eval_id = log.add("POST evaluator pilot", http.post("/v1/evaluations", params=params, json={"harness_archive": archive}))["id"]
    until_done(f"/v1/evaluations/{eval_id}")
    log.add("GET evaluator pilot", http.get(f"/v1/evaluations/{eval_id}"))
    log.add("GET evaluator pilot trajectories", http.get(f"/v1/evaluations/{eval_id}/trajectories"))
    sub = log.add("POST evaluator submission", http.post("/v1/submissions", params=params, json={"harness_archive": archive}), grades=True)
    until_done(f"/v1/submissions/{sub['id']}")
    log.add("GET evaluator submission", http.get(f"/v1/submissions/{sub['id']}"), grades=True)
    return eval_id, sub


def _hidden_questions(stack: Any, name: str) -> set[str]:
    """The hidden test questions of benchmark ``name`` in ``stack``, read from its test store (the test plays the auditor)."""
    from sqlalchemy import select

    from crucible.stack import admin_key, ensure_secrets
    from grader.teststore import TestItem, TestStore

    ids = [t["task_id"] for t in AdminClient(stack.gateway_url, admin_key(stack.data_dir)).baselines(name)["tasks"].values()]
    store = TestStore(ensure_secrets(stack.data_dir)[2]["CRUCIBLE_GRADER_TEST_STORE_URL"])
    with store.db.session() as s:
        return set(s.scalars(select(TestItem.question).where(TestItem.task_id.in_(ids))))


@pytest.mark.parametrize("preset", PRESETS)
def test_two_deployments_with_different_hidden_seeds_answer_every_agent_route_identically(deployments, preset: str) -> None:  # noqa: ANN001
    doc = scaled(yaml.safe_load((ROOT / "benchmarks" / f"{preset}.yaml").read_text()))
    with ThreadPoolExecutor(len(deployments)) as pool:  # the two deployments share nothing: their sessions run side by side
        logs = list(pool.map(lambda stack: _session(stack, doc), deployments))
    first, second = logs
    assert len(first.lines) == len(second.lines) > 10
    for a, b in zip(first.lines, second.lines, strict=True):
        assert a == b, "\n".join(difflib.unified_diff(a.split(", "), b.split(", "), lineterm="", n=1))
    hidden = [_hidden_questions(stack, doc["name"]) for stack in deployments]
    assert hidden[0] != hidden[1]  # the hidden splits did differ: what was compared could have told them apart

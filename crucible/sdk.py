"""Python SDK for the Crucible gateway (what research agents use; it talks to the gateway only).

Every method maps to one ``/v1`` route and returns the decoded JSON. An error answer raises
:class:`CrucibleAPIError` carrying the problem+json body (``status``, ``code``, ``detail``, ``field`` …).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Self

import httpx


class CrucibleAPIError(Exception):
    """A problem+json answer from the gateway."""

    def __init__(self, problem: dict[str, Any]) -> None:
        self.problem = problem
        self.status = int(problem.get("status", 0))
        self.code = str(problem.get("code", ""))
        super().__init__(f"{self.status} {self.code}: {problem.get('detail', '')}")


class _GatewayClient:
    """Bearer-authenticated JSON calls to the gateway; error answers raise ``CrucibleAPIError``."""

    def __init__(self, base_url: str, key: str, *, timeout_s: float = 300.0) -> None:
        self.base_url, self.key = base_url.rstrip("/"), key
        self.http = httpx.Client(base_url=base_url, timeout=timeout_s, headers={"Authorization": f"Bearer {key}"})

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        resp = self.http.request(method, path, **kw)
        if resp.status_code >= 400:
            try:
                body = resp.json()
            except ValueError:
                body = {"status": resp.status_code, "detail": resp.text[:500]}
            raise CrucibleAPIError(body)
        return resp.json()

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class CrucibleClient(_GatewayClient):
    """A run's client: ``CrucibleClient("http://127.0.0.1:8000", "crk_…")``."""


    # run
    def run(self) -> dict[str, Any]:
        """The run card (``GET /v1/run``)."""
        return self._call("GET", "/v1/run")

    def budget(self) -> dict[str, Any]:
        """Remaining, held and spent micro-USD (``GET /v1/budget``)."""
        return self._call("GET", "/v1/budget")

    def report(self) -> dict[str, Any]:
        """Where the run's time and money went, and what it tried (``GET /v1/run/report``)."""
        return self._call("GET", "/v1/run/report")

    # suite data
    # ``task``: the benchmark's task (see the run card); leave it out when the benchmark has one
    def train_sample(self, offset: int = 0, limit: int = 100, task: str | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/suite/train-sample", params=_task({"offset": offset, "limit": limit}, task))["data"]

    def validation_items(self, task: str | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/suite/validation", params=_task({}, task))["data"]

    def candidate_scores(self, task: str) -> list[dict[str, Any]]:
        """Evaluator track: a development target's score of each candidate (``{"candidate", "score"}``)."""
        return self._call("GET", "/v1/suite/candidate-scores", params=_task({}, task))["data"]

    # datasets
    def upload_dataset(self, data: bytes | Path, name: str = "dataset.jsonl") -> dict[str, Any]:
        """Upload JSONL bytes (or a file path) as a dataset."""
        content = data.read_bytes() if isinstance(data, Path) else data
        return self._call("POST", "/v1/datasets", files={"file": (name, content, "application/jsonl")}, data={"name": name})

    def dataset(self, dataset_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/datasets/{dataset_id}")

    def datasets(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/datasets")["data"]

    # training
    def create_training_job(self, model: str, datasets: list[str], recipe: dict[str, Any] | None = None,
                            idempotency_key: str | None = None, harness: dict[str, Any] | None = None) -> dict[str, Any]:
        """Start a training job; with ``idempotency_key`` the call may be repeated (e.g. after a 503) without a second job.
        A ``grpo`` job with no ``datasets`` trains on the run's training pool, rendered and rewarded through ``harness``
        (default: the task's initial system's harness)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body = {"model": model, "datasets": datasets, "recipe": recipe or {}} | ({"harness": harness} if harness is not None else {})
        return self._call("POST", "/v1/training/jobs", json=body, headers=headers)

    def merge_checkpoints(self, model: str, checkpoints: list[str], weights: list[float] | None = None, combination: str = "linear",
                          density: float = 0.5, seed: int = 0, idempotency_key: str | None = None) -> dict[str, Any]:
        """Start a merge job: combine the run's ``checkpoints`` of base ``model`` into a new checkpoint (``combination``
        ``linear``, ``ties``, ``dare_linear`` or ``dare_ties``; ``weights`` default to equal ones summing to 1)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        merge = {"checkpoints": checkpoints, "weights": weights, "combination": combination, "density": density, "seed": seed}
        return self._call("POST", "/v1/training/jobs", json={"model": model, "recipe": {"method": "merge"}, "merge": merge}, headers=headers)

    def training_jobs(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/training/jobs")["data"]

    def training_job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/training/jobs/{job_id}")

    def training_events(self, job_id: str, after: int = 0) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/training/jobs/{job_id}/events", params={"after": after})["data"]

    def checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/training/jobs/{job_id}/checkpoints")["data"]

    def cancel_training_job(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/training/jobs/{job_id}/cancel")

    # inference
    def chat(self, model: str, messages: list[dict[str, str]], **params: Any) -> dict[str, Any]:
        """OpenAI-compatible chat completion (``POST /v1/chat/completions``)."""
        return self._call("POST", "/v1/chat/completions", json={"model": model, "messages": messages, **params})

    # evaluations
    # ------------------------------------------------------------------ code harnesses

    def upload_harness(self, data: bytes | Path, name: str | None = None) -> dict[str, Any]:
        """Upload a harness archive (``.tar.gz`` bytes or a file path; ``harness.toml`` at its root)."""
        content = data.read_bytes() if isinstance(data, Path) else data
        return self._call("POST", "/v1/harnesses", files={"file": ("harness.tar.gz", content, "application/gzip")},
                          data={"name": name} if name else None)

    def harnesses(self) -> list[dict[str, Any]]:
        """The run's harness archives, then the suites' own (``platform: true``)."""
        return self._call("GET", "/v1/harnesses")["data"]

    def harness(self, harness_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/harnesses/{harness_id}")

    def harness_archive(self, harness_id: str) -> bytes:
        """The archive's ``.tar.gz`` bytes (a suite's own, to start an edited copy)."""
        resp = self.http.get(f"/v1/harnesses/{harness_id}/archive")
        if resp.status_code >= 400:
            raise CrucibleAPIError(resp.json())
        return resp.content

    # ------------------------------------------------------------------ evaluations

    def create_evaluation(self, model: str | None, harness: dict[str, Any] | None = None, limit: int | None = None, task: str | None = None,
                          harness_archive: str | None = None, candidates: list[str] | None = None, ablation: str | None = None) -> dict[str, Any]:
        """Evaluate ``model`` on validation with a declarative ``harness`` or the code harness ``harness_archive``
        (neither: the suite's default). On the evaluator track's own task: ``model`` ``None``, the evaluator as
        ``harness_archive``, and for a pilot on some candidates their names (``candidates``, two or more). ``ablation``
        ``"null_model"``: the system with its model replaced by one that answers every call empty (the harness alone)."""
        body: dict[str, Any] = {"split": "validation"} | ({"model": model} if model is not None else {})
        if harness is not None:
            body["harness"] = harness
        if harness_archive is not None:
            body["harness_archive"] = harness_archive
        if limit is not None:
            body["limit"] = limit
        if candidates is not None:
            body["candidates"] = candidates
        if ablation is not None:
            body["ablation"] = ablation
        return self._call("POST", "/v1/evaluations", json=body, params=_task({}, task))

    def evaluations(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/evaluations")["data"]

    def evaluation(self, eval_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/evaluations/{eval_id}")

    def trajectories(self, eval_id: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/evaluations/{eval_id}/trajectories")["data"]

    def wait_evaluation(self, eval_id: str, poll_s: float = 1.0, on_poll: Any = None) -> dict[str, Any]:
        """Poll until the evaluation ends; ``on_poll(evaluation)`` is called after each poll."""
        while True:
            ev = self.evaluation(eval_id)
            if on_poll:
                on_poll(ev)
            if ev["status"] in ("succeeded", "failed", "cancelled"):
                return ev
            time.sleep(poll_s)

    # submissions
    def submit(self, model: str | None, harness: dict[str, Any] | None = None, note: str | None = None, task: str | None = None,
               harness_archive: str | None = None) -> dict[str, Any]:
        """Submit the final system (on the evaluator track's own task: ``model`` ``None``, the evaluator as ``harness_archive``)."""
        body: dict[str, Any] = {"model": model} if model is not None else {}
        if harness is not None:
            body["harness"] = harness
        if harness_archive is not None:
            body["harness_archive"] = harness_archive
        if note:
            body["note"] = note
        return self._call("POST", "/v1/submissions", json=body, params=_task({}, task))

    def submission(self, sub_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/submissions/{sub_id}")

    def wait_submission(self, sub_id: str, poll_s: float = 2.0, on_poll: Any = None) -> dict[str, Any]:
        while True:
            sub = self.submission(sub_id)
            if on_poll:
                on_poll(sub)
            if sub["status"] in ("graded", "failed"):
                return sub
            time.sleep(poll_s)



class AdminClient(_GatewayClient):
    """The operator's client for ``/admin`` routes: ``AdminClient(url, admin_key)``."""


    def load_benchmark(self, doc: dict[str, Any], *, wait: bool = True, poll_s: float = 1.0, on_poll: Any = None,
                       attempts: int = 3) -> dict[str, Any]:
        """Load a benchmark (``POST /admin/benchmarks``), answered in seconds with ``status`` ``building`` while the grader
        builds its splits in the background. Loading is idempotent, so a call cut off (a timeout, a 502/503/504) is made
        again, up to ``attempts`` times in all. With ``wait``, poll until the splits are built (:meth:`wait_benchmark`):
        the benchmark, ``ready``, with the grader's ``warnings`` for the operator."""
        for attempt in range(1, attempts + 1):
            try:
                bm = self._call("POST", "/admin/benchmarks", json=doc)
                break
            except (httpx.TimeoutException, httpx.TransportError, CrucibleAPIError) as exc:
                if attempt == attempts or (isinstance(exc, CrucibleAPIError) and exc.status not in (502, 503, 504)):
                    raise
                time.sleep(poll_s * attempt)
        return self.wait_benchmark(bm["id"], poll_s, on_poll) if wait else bm

    def benchmark(self, benchmark: str) -> dict[str, Any]:
        """A benchmark (by id or name) with its ``status`` (building|ready|failed) and, when failed, ``error``."""
        return self._call("GET", f"/admin/benchmarks/{benchmark}")

    def benchmarks(self) -> list[dict[str, Any]]:
        """Every benchmark, oldest first, with its status."""
        return self._call("GET", "/admin/benchmarks")["data"]

    def wait_benchmark(self, benchmark: str, poll_s: float = 1.0, on_poll: Any = None) -> dict[str, Any]:
        """Poll until the benchmark's splits are built (``on_poll(benchmark)`` after each poll): the benchmark once
        ``ready``; raises :class:`CrucibleAPIError` (code ``benchmark_failed``, ``detail`` the reason) once ``failed``."""
        while True:
            bm = self.benchmark(benchmark)
            if on_poll:
                on_poll(bm)
            if bm["status"] == "ready":
                return bm
            if bm["status"] == "failed":
                raise CrucibleAPIError({"status": 422, "code": "benchmark_failed", "detail": f"benchmark {bm['name']}: {bm['error']}",
                                        "benchmark": bm["id"]})
            time.sleep(poll_s)

    def import_tasks(self, name: str, suite: str, archive: bytes) -> dict[str, Any]:
        """Import the ``.tar.gz`` ``archive`` (one folder of the suite's tasks) as collection ``name``: its validation starts."""
        return self._call("POST", "/admin/task-collections", data={"name": name, "suite": suite},
                          files={"file": (f"{name}.tar.gz", archive, "application/gzip")})

    def task_collection(self, name: str) -> dict[str, Any]:
        """The collection: ``status`` (validating|done), ``accepted``/``refused``/``pending`` and ``tasks`` (name, status, reason)."""
        return self._call("GET", f"/admin/task-collections/{name}")

    def task_collections(self) -> list[dict[str, Any]]:
        return self._call("GET", "/admin/task-collections")["data"]

    def wait_task_collection(self, name: str, poll_s: float = 2.0, on_poll: Any = None) -> dict[str, Any]:
        """Poll until every task of the collection is accepted or refused; ``on_poll(collection)`` after each poll."""
        while True:
            collection = self.task_collection(name)
            if on_poll:
                on_poll(collection)
            if collection["status"] == "done":
                return collection
            time.sleep(poll_s)

    def baselines(self, benchmark: str) -> dict[str, Any]:
        """The benchmark's baselines: per task under ``tasks``, its split sizes and the initial (and reference) system's
        test score and status; ``initial_status``/``reference_status`` summed up over the tasks."""
        return self._call("GET", f"/admin/benchmarks/{benchmark}/baselines")

    def wait_baselines(self, benchmark: str, poll_s: float = 1.0) -> dict[str, Any]:
        """Poll until the initial (and reference) system's test evaluations have ended."""
        while True:
            status = self.baselines(benchmark)
            if status["initial_status"] in ("succeeded", "failed") and status["reference_status"] in (None, "declared", "succeeded", "failed"):
                return status
            time.sleep(poll_s)

    def add_model(self, card: dict[str, Any]) -> dict[str, Any]:
        """Register a base model card (``services.common.llms.ModelCard`` as JSON); returns it once it is served."""
        return self._call("POST", "/admin/models", json=card)

    def models(self) -> list[dict[str, Any]]:
        """The cards of the base models served now."""
        return self._call("GET", "/admin/models")["data"]

    def create_run(self, benchmark: str, agent_name: str, **overrides: Any) -> dict[str, Any]:
        return self._call("POST", "/admin/runs", json={"benchmark": benchmark, "agent_name": agent_name, **overrides})

    def runs(self) -> list[dict[str, Any]]:
        return self._call("GET", "/admin/runs")["data"]

    def revoke(self, run_id: str) -> dict[str, Any]:
        return self._call("POST", f"/admin/runs/{run_id}/revoke")

    def report(self, run_id: str) -> dict[str, Any]:
        """A run's report (``GET /admin/runs/{run_id}/report``)."""
        return self._call("GET", f"/admin/runs/{run_id}/report")

    def entries(self, run_id: str) -> list[dict[str, Any]]:
        """The run's ledger entries, oldest first."""
        return self._call("GET", f"/admin/runs/{run_id}/entries")["data"]

    def refund(self, run_id: str, entry_id: str, reason: str, idempotency_key: str, amount_usd_micros: int | None = None) -> dict[str, Any]:
        """Refund (part of) charge entry ``entry_id`` of the run; safe to repeat with the same ``idempotency_key``."""
        body = {"entry_id": entry_id, "reason": reason, "idempotency_key": idempotency_key}
        return self._call("POST", f"/admin/runs/{run_id}/refunds", json=body | ({"amount_usd_micros": amount_usd_micros} if amount_usd_micros else {}))

    def leaderboard(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/leaderboard")["data"]


def _task(params: dict[str, Any], task: str | None) -> dict[str, Any]:
    return params | ({"task": task} if task else {})

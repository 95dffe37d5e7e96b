"""The simulated research agents of the soak test (:mod:`tests.compose.test_soak`), a Locust file run by ``locust
--headless`` against the gateway's published port.

Each simulated agent holds a run of its own (keys in the JSON file ``CRUCIBLE_SOAK_KEYS``: ``{"researchers": [...],
"spender": key, "vandal": key}``) and calls the gateway as a coding agent does:

- :class:`Researcher`: reads its budget, run, validation items and lists (the light reads), chats with the base model,
  uploads small SFT datasets and starts short training jobs, starts small validation evaluations and polls them;
- :class:`Spender`: a run with a tiny budget that chats until the ledger refuses it (402) and goes on asking;
- :class:`Vandal`: bad input on every agent route it can reach (wrong types, unknown fields, bodies that are not
  JSON, ids that do not exist, an empty key).

Any answer of 500 or more, or a connection that fails, is a failure; the 4xx an agent expects (402 for the spender,
422/400/404/401 for the vandal, 429 for anyone at a rate limit) are successes. Requests are named by route template
(``GET /v1/evaluations/{id}``), so Locust's statistics give each route's latency percentiles.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import threading
from pathlib import Path
from typing import Any

from locust import HttpUser, between, task

MODEL = "smollm2-135m-instruct"
KEYS = json.loads(Path(os.environ["CRUCIBLE_SOAK_KEYS"]).read_text()) if "CRUCIBLE_SOAK_KEYS" in os.environ else {}
_researchers = itertools.cycle(KEYS.get("researchers", [""]))
_lock = threading.Lock()
EXPECTED_ANYWHERE = {429}  # a rate limit under load: the agent waits, nothing is wrong


def _json(resp: Any) -> bool:
    try:
        return isinstance(resp.json(), dict)
    except ValueError:
        return False


class _Agent(HttpUser):
    abstract = True
    expected: frozenset[int] = frozenset()
    refuses: bool = False  # every request of this agent must be refused (a 2xx is a failure)

    def call(self, method: str, path: str, name: str, expected: set[int] | frozenset[int] = frozenset(), *, light: bool = False,
             **kwargs: Any) -> dict[str, Any] | None:
        """One request; a 2xx or 3xx answer, or a status in ``expected`` or :data:`EXPECTED_ANYWHERE`, is a success
        (a 5xx, an unexpected 4xx, or no answer at all is a failure). Returns the JSON body of a 2xx answer. A ``light``
        read's time is also recorded under ``LIGHT light reads``, all such reads pooled (a minute holds too few of one
        route for its own 99th percentile to be more than its slowest)."""
        headers = {"Authorization": f"Bearer {self.key}", **kwargs.pop("headers", {})}
        with self.client.request(method, path, name=name, catch_response=True, headers=headers, **kwargs) as resp:
            status = resp.status_code  # 0: no answer at all (a refused or broken connection)
            if 200 <= status < 400 and self.refuses:
                resp.failure(f"{status}: bad input accepted")
            elif 200 <= status < 400:
                resp.success()
                if light:
                    self.environment.events.request.fire(request_type="LIGHT", name="light reads", response_time=resp.request_meta["response_time"],
                                                         response_length=0, exception=None, context={})
                try:
                    return resp.json()
                except ValueError:
                    return None
            if status in expected or status in self.expected or status in EXPECTED_ANYWHERE:
                resp.success()
                self.environment.events.request.fire(request_type="REFUSED", name=f"{status} {resp.json().get('code', '') if _json(resp) else ''}".strip(),
                                                     response_time=0, response_length=0, exception=None, context={})
            else:  # with the client's own error when there was no answer (a reset, a refused or dropped connection)
                resp.failure(f"{status}: {resp.text[:300] if status else repr(resp.error)[:300]}")
            return None


class Researcher(_Agent):
    """An agent improving its system: mostly reads, some chats, now and then a dataset, a training job or an evaluation."""

    weight = 8
    wait_time = between(1, 3)

    def on_start(self) -> None:
        with _lock:
            self.key = next(_researchers)
        self.evaluations: list[str] = []
        self.jobs: list[str] = []
        self.sample: list[dict[str, Any]] = []

    def on_stop(self) -> None:
        """Cancel what it left queued or running, as an agent at the end of its session does (the holds come back)."""
        for job in self.jobs:
            self.call("POST", f"/v1/training/jobs/{job}/cancel", "POST /v1/training/jobs/{id}/cancel", expected={409})

    @task(10)
    def budget(self) -> None:
        self.call("GET", "/v1/budget", "GET /v1/budget", light=True)

    @task(4)
    def own_run(self) -> None:
        self.call("GET", "/v1/run", "GET /v1/run", light=True)

    @task(4)
    def lists(self) -> None:
        path = random.choice(["/v1/evaluations", "/v1/datasets", "/v1/training/jobs", "/v1/harnesses", "/v1/models"])
        self.call("GET", path, f"GET {path}", light=True)

    @task(2)
    def validation_items(self) -> None:
        self.call("GET", "/v1/suite/validation", "GET /v1/suite/validation")

    @task(4)
    def poll(self) -> None:
        if self.evaluations:
            self.call("GET", f"/v1/evaluations/{random.choice(self.evaluations)}", "GET /v1/evaluations/{id}", light=True)
        if self.jobs:
            self.call("GET", f"/v1/training/jobs/{random.choice(self.jobs)}", "GET /v1/training/jobs/{id}", light=True)

    @task(3)
    def chat(self) -> None:
        self.call("POST", "/v1/chat/completions", "POST /v1/chat/completions", expected={402},
                  json={"model": MODEL, "messages": [{"role": "user", "content": f"What is {random.randint(1, 99)} + {random.randint(1, 99)}?"}],
                        "max_tokens": 4, "temperature": 0})

    @task(1)
    def evaluate(self) -> None:
        out = self.call("POST", "/v1/evaluations", "POST /v1/evaluations", expected={402}, json={"model": MODEL, "split": "validation", "limit": 2})
        if out:
            self.evaluations.append(out["id"])

    @task(1)
    def train(self) -> None:
        if len(self.jobs) >= 2:  # an agent waits for its jobs rather than queueing more behind one train worker
            return
        if not self.sample:
            page = self.call("GET", "/v1/suite/train-sample?limit=16", "GET /v1/suite/train-sample")
            self.sample = (page or {}).get("data", [])
            if not self.sample:
                return
        rows = "".join(json.dumps({"messages": [{"role": "user", "content": it["question"]}, {"role": "assistant", "content": it["answer"]}]}) + "\n"
                       for it in self.sample).encode()
        dataset = self.call("POST", "/v1/datasets", "POST /v1/datasets", files={"file": ("soak.jsonl", rows, "application/jsonl")}, data={"name": "soak.jsonl"})
        if dataset:
            job = self.call("POST", "/v1/training/jobs", "POST /v1/training/jobs", expected={402},
                            json={"model": MODEL, "datasets": [dataset["id"]], "recipe": {"max_steps": 2, "batch_size": 2, "warmup_steps": 0}})
            if job:
                self.jobs.append(job["id"])


class Spender(_Agent):
    """An agent whose tiny budget runs out: after that every priced call is a 402, and it keeps asking."""

    weight = 1
    fixed_count = 1
    wait_time = between(0.5, 1.5)
    expected = frozenset({402})

    def on_start(self) -> None:
        self.key = KEYS.get("spender", "")

    @task(3)
    def chat(self) -> None:
        self.call("POST", "/v1/chat/completions", "POST /v1/chat/completions (spender)",
                  json={"model": MODEL, "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 8})

    @task(1)
    def budget(self) -> None:
        self.call("GET", "/v1/budget", "GET /v1/budget (spender)")


BAD_BODIES = [
    ("POST", "/v1/chat/completions", {"json": {"model": MODEL, "messages": "hello"}}),
    ("POST", "/v1/chat/completions", {"json": {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": "8"}}),
    ("POST", "/v1/chat/completions", {"json": {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}}),
    ("POST", "/v1/chat/completions", {"json": {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**12}}),
    ("POST", "/v1/chat/completions", {"data": b"{not json", "headers": {"Content-Type": "application/json"}}),
    ("POST", "/v1/chat/completions", {"json": [1, 2, 3]}),
    ("POST", "/v1/evaluations", {"json": {"model": MODEL, "limit": "2"}}),
    ("POST", "/v1/evaluations", {"json": {"model": MODEL, "limit": -1, "surprise": True}}),
    ("POST", "/v1/training/jobs", {"json": {"model": MODEL, "datasets": ["ds_doesnotexist"], "recipe": {"max_steps": 0}}}),
    ("POST", "/v1/training/jobs", {"json": {"model": MODEL, "datasets": "ds_x"}}),
    ("POST", "/v1/datasets", {"files": {"file": ("bad.jsonl", b"\xff\xfe not json\n", "application/jsonl")}, "data": {"name": "bad.jsonl"}}),
    ("GET", "/v1/evaluations/eval_doesnotexist", {}),
    ("GET", "/v1/training/jobs/job_doesnotexist", {}),
    ("GET", "/v1/suite/train-sample?limit=-5", {}),
    ("POST", "/v1/harnesses", {"files": {"file": ("h.tar.gz", b"not a tarball", "application/gzip")}}),
]


class Vandal(_Agent):
    """An agent that sends bad input: every request must be a 4xx naming what is wrong, never a 5xx."""

    weight = 1
    fixed_count = 1
    wait_time = between(0.5, 1.5)
    expected = frozenset({400, 401, 404, 405, 409, 413, 415, 422})
    refuses = True

    def on_start(self) -> None:
        self.key = KEYS.get("vandal", "")

    @task(5)
    def bad_body(self) -> None:
        method, path, kwargs = random.choice(BAD_BODIES)
        self.call(method, path, f"{method} {path.split('?')[0]} (bad input)", **kwargs)

    @task(1)
    def no_key(self) -> None:
        key, self.key = self.key, ""
        try:
            self.call("GET", "/v1/budget", "GET /v1/budget (no key)")
        finally:
            self.key = key

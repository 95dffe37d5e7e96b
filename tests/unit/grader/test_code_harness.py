"""Code harnesses, for real: archives validated at upload, rollouts in the bubblewrap sandbox with the rollout model
endpoint as the only peer, task verifiers run after the harness is gone, trajectories and charges.

The grader app runs in this process on temporary SQLite databases with the real ledger app; inference is a stand-in
that plays a terminal agent's model (it proposes a command, then says DONE). Every sandbox is real.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from inference_service.client import InferenceClient

from grader import model_endpoint, worker
from grader.app import create_app
from grader.client import GraderClient
from grader.harness_archives import inspect_archive
from grader.model_endpoint import Binding, ModelEndpoint
from grader.rollouts import RolloutLimits, run_rollout
from grader.sandboxes import get_sandbox
from grader.service import Grader
from grader.settings import GraderSettings
from grader.suites import get_suite
from grader.suites.terminal import TASKS_DIR, tasks
from services.common.auth import RunContext, run_headers
from services.common.celery_app import serve_worker_metrics
from services.common.contracts import EvaluationCreate, EvaluationLimits, GradingSpec, SubmissionCreate
from services.common.errors import UpstreamProblem
from services.common.settings import ServiceSettings
from services.ledger.app import create_app as create_ledger_app
from services.ledger.client import LedgerClient
from services.ledger.schemas import AccountCreate, HoldStatus
from services.ledger.settings import LedgerSettings
from tests.archives import archive, code_harness, oracle_archive
from tests.netns import SANDBOX_NETWORK_PROBE, outside_hosts
from tests.unit.grader.test_routes import GATEWAY_TOKEN, GRADER_TOKEN, stand_in
from tests.unit.inprocess import in_process

BASE = "smollm2-135m-instruct"
TASK = "count-log-errors"


METERED: list[tuple[str | None, str | None]] = []  # (hold, idempotency key) of every completion inference was asked for


def agent_model(request: httpx.Request) -> httpx.Response:
    """Inference playing a terminal agent's model: the first answer is a command, the next ``DONE``. Inference
    charges each completion to the hold it is given, once per idempotency key; here they are recorded."""
    if request.method == "GET":
        model = request.url.path.rsplit("/", 1)[1]
        return httpx.Response(200, json={"id": model, "object": "model", "owned_by": "crucible", "base_model": model})
    body = json.loads(request.content)
    if body["messages"][-1]["content"] == "slow":  # a call still in flight when its harness is gone
        time.sleep(3)
    METERED.append((request.headers.get("x-crucible-hold"), request.headers.get("idempotency-key")))
    answered = any(m["role"] == "assistant" for m in body["messages"])
    content = "DONE" if answered else "```bash\nls /app\n```"
    return httpx.Response(200, json={"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": body["model"],
                                     "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                                     "usage": {"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45}})


@dataclass
class Served:
    http: TestClient
    grader: GraderClient
    service: Grader
    ledger: LedgerClient
    queue: list[str]
    task_id: str
    tmp: Path

    def ctx(self, run_id: str) -> RunContext:
        self.ledger.open_account(AccountCreate(account_id=run_id, budget_usd_micros=10_000_000))
        return RunContext(run_id=run_id, task_id=self.task_id)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("code-harness")
    ledger_app = create_ledger_app(LedgerSettings(data_dir=tmp / "ledger", service_token="ledger-token", trusted_tokens={"grader": GRADER_TOKEN}))
    settings = GraderSettings(data_dir=tmp, grader_test_seed=99, service_token=GRADER_TOKEN, trusted_tokens={"gateway": GATEWAY_TOKEN},
                              rollout_concurrency=2, rollout_wall_s=60, verifier_wall_s=60)
    with TestClient(ledger_app, base_url="http://ledger") as ledger_http, TestClient(create_app(settings), base_url="http://grader") as http:
        service: Grader = http.app.state.grader  # type: ignore[attr-defined]
        service.close()
        queue: list[str] = []
        service.ledger = ledger = LedgerClient(in_process(ledger_http, GRADER_TOKEN, "ledger"))
        service.inference = InferenceClient(stand_in("inference", agent_model))
        service.enqueue = queue.append
        service.enqueue_build = None  # no queue: a task's splits are built in the registering call
        client = GraderClient(in_process(http, GATEWAY_TOKEN, "grader"))
        spec = GradingSpec(task_id="bm_terminal", suite={"name": "terminal", "params": {"tasks": [TASK, "dedupe-lines", "extract-emails", "csv-column-sum", "find-large-files"]},
                                                          "splits": {"validation": {"seed": 1, "size": 2}, "train": {"seed": 0, "size": 1},
                                                                     "test": {"size": 2}}},
                           initial_system={"model": BASE}, reference_score=1.0, evaluation={"max_tokens": 64, "max_turns": 4, "samples": 1})
        client.register_task(spec)
        yield Served(http, client, service, ledger, queue, spec.task_id, tmp)


@pytest.fixture(scope="module")
def endpoint(served: Served) -> ModelEndpoint:
    return worker.model_endpoint(served.service)


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.slow])])
def backend(request: pytest.FixtureRequest) -> str:
    """The sandbox backend a rollout test runs on: bubblewrap in `make test`, Docker in `make test-slow`."""
    return request.param


def rollout(endpoint: ModelEndpoint, backend: str, data: bytes, task: str = TASK, model: str = BASE, max_calls: int = 4, **caps: Any):  # noqa: ANN201
    suite = get_suite("terminal")
    [item] = [it for it in suite.generate({"tasks": [task]}, 0, 1, split="validation")]
    binding = Binding(model=model, ctx=None, hold_id=None, key=f"eval_test:{task}:0", context_tokens=None, max_tokens=64, max_calls=max_calls)
    return run_rollout(get_sandbox(backend), endpoint, archive=data, archive_id="har_test", manifest=inspect_archive(data), instruction=item.question,
                       binding=binding, environment=suite.environment(item), caps=RolloutLimits(**{"wall_s": 30, "verifier_wall_s": 30, **caps}))


# --------------------------------------------------------------------------- the shipped tasks


def test_the_terminal_suite_ships_at_least_30_tasks_in_harbors_format() -> None:
    assert len(tasks()) >= 30
    categories = {t["toml"]["metadata"]["category"] for t in tasks().values()}
    assert {"files", "text-processing", "scripting", "git", "data"} <= categories
    for name in tasks():
        folder = TASKS_DIR / name
        assert (folder / "instruction.md").is_file() and (folder / "tests" / "test.sh").is_file() and (folder / "solution" / "solve.sh").is_file(), name


def test_the_oracle_harness_scores_1_and_a_noop_harness_0_on_every_shipped_task(endpoint: ModelEndpoint, backend: str) -> None:
    """Every task's oracle scores 1 on both backends (its environment and verifier work in each sandbox). Doing nothing
    scores 0 on every task on bubblewrap and on every fifth on Docker, whose rollouts cost seconds each: that a task's
    tests fail an untouched workspace is the task's own property, the same verifier on both backends."""
    oracle, noop = oracle_archive(), code_harness("exit 0\n")
    names = list(tasks())
    idle = names if backend == "bwrap" else names[::5]
    with ThreadPoolExecutor(2) as pool:
        oracle_rewards = dict(zip(names, pool.map(lambda t: rollout(endpoint, backend, oracle, t).reward, names), strict=True))
        noop_rewards = dict(zip(idle, pool.map(lambda t: rollout(endpoint, backend, noop, t).reward, idle), strict=True))
    assert {t: r for t, r in oracle_rewards.items() if r != 1.0} == {}
    assert {t: r for t, r in noop_rewards.items() if r != 0.0} == {}


# --------------------------------------------------------------------------- archives


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", data: bytes = b"x", mode: int = 0o644) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        manifest = b'name = "h"\nentry = "true"\n'
        info = tarfile.TarInfo("harness.toml")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.mode = kind, link, mode
        info.size = len(data) if kind == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return buf.getvalue()


@pytest.mark.parametrize(("data", "member", "says"), [
    (_member("/etc/cron.d/evil"), "/etc/cron.d/evil", "unsafe"),
    (_member("../outside.sh"), "../outside.sh", "unsafe"),
    (_member("lib/../../outside.sh"), "lib/../../outside.sh", "unsafe"),
    (_member("escape", tarfile.SYMTYPE, "/etc/passwd"), "escape", "unsafe"),
    (_member("escape", tarfile.SYMTYPE, "../../etc"), "escape", "unsafe"),
    (_member("hard", tarfile.LNKTYPE, "harness.toml"), "hard", "hard links"),
    (_member("null", tarfile.CHRTYPE), "null", "unsafe"),
    (_member("pipe", tarfile.FIFOTYPE), "pipe", "unsafe"),
    (_member("suid", mode=0o4755), "suid", "setuid"),
], ids=["absolute", "dotdot", "dotdot-inside", "symlink-absolute", "symlink-out", "hardlink", "device", "fifo", "setuid"])
def test_an_unsafe_archive_is_refused_naming_the_member(served: Served, data: bytes, member: str, says: str) -> None:
    ctx = served.ctx(f"run_unsafe_{hashlib.sha256(data).hexdigest()[:8]}")
    response = served.http.post("/internal/harnesses", content=data, headers={**run_headers(ctx, GATEWAY_TOKEN), "Content-Type": "application/gzip"})
    assert response.status_code == 422, response.text
    assert (response.json()["field"], response.json()["member"]) == ("file", member)
    assert says in response.json()["detail"]


@pytest.mark.parametrize(("data", "field", "says"), [
    (b"not a tarball", "file", "gzip"),
    (archive({"run.sh": "true"}), "harness.toml", "no harness.toml"),
    (archive({}, 'entry = "true"\n'), "harness.toml.name", "Field required"),
    (archive({}, 'name = "h"\nentry = "true"\n[limits]\nwall_s = -1\n'), "harness.toml.limits.wall_s", "greater than 0"),
    (archive({}, 'name = "h"\nentry = "true"\nnetwork = true\n'), "harness.toml.network", "Extra inputs"),
    (archive({}, "name = [\n"), "harness.toml", "not TOML"),
    (archive({f"f{i}": "" for i in range(2001)}, 'name = "h"\nentry = "true"\n'), "file", "more than 2000 members"),
    (archive({"a\nb": ""}, 'name = "h"\nentry = "true"\n'), "file", "control character"),
    (archive({"/".join(["d"] * 40) + "/f": ""}, 'name = "h"\nentry = "true"\n'), "file", "deeper than 32"),
    (archive({"./harness.toml": 'name = "h2"\nentry = "true"\n'}, 'name = "h"\nentry = "true"\n'), "file", "harness.toml twice"),
    (archive({}, 'name = "h"\nentry = "true"\n[limits]\nwall_s = "10"\n'), "harness.toml.limits.wall_s", "valid number"),
    (archive({}, 'name = "h"\nentry = "a\\u0000b"\n'), "harness.toml.entry", "pattern"),
], ids=["not-gzip", "no-manifest", "manifest-missing-key", "manifest-bad-limit", "manifest-unknown-key", "manifest-not-toml", "too-many-members",
        "newline-in-name", "too-deep", "two-manifests", "limit-as-string", "nul-in-entry"])
def test_a_bad_archive_is_a_422_naming_the_field(served: Served, data: bytes, field: str, says: str) -> None:
    ctx = served.ctx(f"run_bad_{hashlib.sha256(data).hexdigest()[:8]}")
    response = served.http.post("/internal/harnesses", content=data, headers={**run_headers(ctx, GATEWAY_TOKEN), "Content-Type": "application/gzip"})
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field and says in response.json()["detail"], response.json()


def test_an_archive_is_content_addressed_per_run_and_another_run_cannot_see_it(served: Served) -> None:
    ours, theirs = served.ctx("run_archive_owner"), served.ctx("run_archive_other")
    data = code_harness("echo hi\n")
    first, again = served.grader.upload_harness(ours, data, name="mine"), served.grader.upload_harness(ours, data)
    assert first.id == again.id and first.id.startswith("har_") and first.sha256 == hashlib.sha256(data).hexdigest()
    assert served.grader.harness_archive(ours, first.id) == data
    listed = served.grader.list_harnesses(ours).data
    assert [a.id for a in listed if not a.platform] == [first.id] and any(a.platform and a.name == "terminal-agent" for a in listed)
    for call in (lambda: served.grader.get_harness(theirs, first.id), lambda: served.grader.harness_archive(theirs, first.id),
                 lambda: served.grader.create_evaluation(theirs, EvaluationCreate(model=BASE, harness_archive=first.id), limits=EvaluationLimits())):
        with pytest.raises(UpstreamProblem) as refused:
            call()
        assert refused.value.status == 404
    assert served.grader.upload_harness(theirs, data).id != first.id  # the same bytes are the other run's own archive


def test_a_terminal_task_needs_a_code_harness(served: Served) -> None:
    ctx = served.ctx("run_declarative")
    with pytest.raises(UpstreamProblem) as refused:
        served.grader.create_evaluation(ctx, EvaluationCreate(model=BASE, harness={"user_template": "{{ question }}"}), limits=EvaluationLimits())
    assert (refused.value.status, refused.value.problem["field"]) == (422, "harness")
    body = {"model": BASE, "harness": {}, "harness_archive": "har_01jd3k4m5n6p7q8r9s0t1v2w3x"}
    response = served.http.post("/internal/evaluations", json=body, headers=run_headers(ctx, GATEWAY_TOKEN))
    assert response.status_code == 422 and response.json()["field"] == "harness_archive"


# --------------------------------------------------------------------------- evaluations of code harnesses


def test_the_default_harness_evaluates_through_the_rollout_endpoint_and_every_cost_is_charged(served: Served) -> None:
    ctx = served.ctx("run_default_harness")
    created = served.grader.create_evaluation(ctx, EvaluationCreate(model=BASE), limits=EvaluationLimits())
    assert created.harness_archive and created.harness_archive.startswith("har_")
    [hold] = served.ledger.list_holds(ctx.run_id)
    worker.run_evaluation(served.service, created.id)
    done = served.grader.get_evaluation(ctx, created.id)
    assert (done.status, done.items_done) == ("succeeded", 2), done.error
    trajectories = served.grader.get_trajectories(ctx, created.id).data
    for t in trajectories:
        rollout = t.rollout
        assert rollout is not None and rollout.model_calls == 2 and rollout.harness == created.harness_archive, t
        assert [s.source for s in rollout.steps] == ["system", "user", "agent", "environment", "agent"]
        assert rollout.steps[2].message.startswith("```bash") and "(exit code 0)" in rollout.steps[3].message
        assert rollout.verifier_run is not None and rollout.reward == t.score == 0.0 and rollout.failure is None
        assert (t.prompt_tokens, t.completion_tokens) == (80, 10)
    assert served.ledger.get_hold(hold.hold_id).status == HoldStatus.settled
    keys = sorted(key for held, key in METERED if held == hold.hold_id)  # every model call charged to the evaluation's hold, once
    assert keys == sorted(f"{created.id}:{t.item_id}:0:{call}" for t in trajectories for call in (0, 1))
    [sandbox] = [b for b in served.ledger.usage(ctx.run_id) if b.kind == "sandbox_seconds"]
    assert sandbox.quantity >= 2 and sandbox.amount_usd_micros > 0


def test_an_edited_harness_is_evaluated_and_submitted(served: Served) -> None:
    ctx = served.ctx("run_edited_harness")
    uploaded = served.grader.upload_harness(ctx, oracle_archive(served.service.store.items(served.task_id)))
    created = served.grader.create_evaluation(ctx, EvaluationCreate(model=BASE, harness_archive=uploaded.id), limits=EvaluationLimits())
    worker.run_evaluation(served.service, created.id)
    done = served.grader.get_evaluation(ctx, created.id)
    assert (done.status, done.score.value, done.harness_archive) == ("succeeded", 1.0, uploaded.id)  # type: ignore[union-attr]
    sub = served.grader.create_submission(ctx, SubmissionCreate(model=BASE, harness_archive=uploaded.id), max_submissions=1, datasets=[])
    for eval_id in served.queue[-2:]:  # its grading and its null-model ablation
        worker.run_evaluation(served.service, eval_id)
    graded = served.grader.get_submission(ctx, sub.id)
    assert (graded.status, graded.score.value, graded.harness_archive) == ("graded", 1.0, uploaded.id)  # type: ignore[union-attr]
    assert graded.model_free_score is not None and graded.model_free_score.value == 1.0  # the oracle needs no model


def test_a_null_model_ablation_runs_the_harness_against_empty_answers_and_charges_only_its_sandbox_seconds(served: Served) -> None:
    """The rollout's sandbox reaches the same endpoint, which answers every call with an empty message and asks inference
    nothing; the evaluation holds and charges sandbox seconds, no tokens."""
    ctx = served.ctx("run_null_model")
    created = served.grader.create_evaluation(ctx, EvaluationCreate(model=BASE, ablation="null_model"), limits=EvaluationLimits())
    assert created.ablation == "null_model" and created.harness_archive
    [hold] = served.ledger.list_holds(ctx.run_id)
    METERED.clear()
    worker.run_evaluation(served.service, created.id)
    done = served.grader.get_evaluation(ctx, created.id)
    assert (done.status, done.items_done, done.score.value) == ("succeeded", 2, 0.0), done.error  # type: ignore[union-attr]
    for t in served.grader.get_trajectories(ctx, created.id).data:
        rollout = t.rollout
        assert rollout is not None and rollout.model_calls >= 1 and rollout.model == BASE, t
        assert [s.message for s in rollout.steps if s.source == "agent"] == [""] * rollout.model_calls
        assert (t.completion, t.prompt_tokens, t.completion_tokens) == ("", 0, 0)
    assert METERED == []  # inference was never called
    assert served.ledger.get_hold(hold.hold_id).status == HoldStatus.settled
    charged = {b.kind: b.quantity for b in served.ledger.usage(ctx.run_id) if b.quantity}
    assert set(charged) == {"sandbox_seconds"} and charged["sandbox_seconds"] >= 2


# --------------------------------------------------------------------------- hostile harnesses


@pytest.fixture(scope="module")
def listeners() -> Iterator[dict[str, Any]]:
    """TCP servers standing in for the grader, the ledger and the test store (loopback), and hosts of the test's own
    (:func:`tests.netns.outside_hosts`: one behind a network namespace's veth pair, one on the host's end of it): a
    sandbox must reach none of them, though the host does."""
    servers, ports = [], {}
    for name in ("grader", "ledger", "teststore"):
        s = socket.create_server(("127.0.0.1", 0))
        servers.append(s)
        ports[name] = s.getsockname()[1]
        threading.Thread(target=lambda srv=s: [c.close() for c, _ in iter(srv.accept, None)], daemon=True).start()
    with outside_hosts() as outside:
        outside.check_reachable()
        yield {"ports": ports, "outside": outside}
    for s in servers:
        s.close()


def test_a_harness_cannot_open_a_socket_to_any_service_or_the_outside(endpoint: ModelEndpoint, backend: str, listeners: dict[str, Any]) -> None:
    outside = listeners["outside"]
    seen = outside.connections()
    targets = [("127.0.0.1", port) for port in listeners["ports"].values()] + outside.targets
    probe = SANDBOX_NETWORK_PROBE + "import socket\n" + "".join(
        f"try:\n    socket.create_connection(({h!r}, {p}), timeout=3); print('REACHED {h}:{p}')\nexcept OSError as e:\n    print('refused {h}:{p}', e)\n"
        for h, p in targets)
    out = rollout(endpoint, backend, archive({"probe.py": probe}, 'name = "probe"\nentry = "python3 /harness/probe.py"\n'))
    stdout = out.trajectory.harness_run.stdout  # type: ignore[union-attr]
    assert "REACHED" not in stdout, stdout
    network, *lines = stdout.splitlines()
    assert json.loads(network.removeprefix("NETWORK ")) == {"interfaces": ["lo"], "routes": [], "routes6": []}, network
    assert [line.split()[0] for line in lines] == ["refused"] * len(targets), stdout
    assert outside.connections() == seen and out.reward == 0.0


def test_a_harness_cannot_read_or_write_outside_its_workspace(served: Served, endpoint: ModelEndpoint, backend: str) -> None:
    secret = served.tmp / "grader-secret.txt"
    secret.write_text("s3cr3t-the-harness-must-not-see")
    store = served.tmp / "grader-teststore.sqlite"
    assert store.exists()
    script = (f"cat {secret}; cat {store} > /dev/null && echo READ-TESTSTORE; ls {TASKS_DIR} {TASKS_DIR.parent}; "
              f"echo x > /usr/planted && echo WROTE-USR; echo x > {served.tmp}/planted && echo WROTE-DATA; echo x > /planted && echo WROTE-ROOT; "
              "echo ok > /app/mine && echo WROTE-APP\n")
    out = rollout(endpoint, backend, code_harness(script))
    stdout = out.trajectory.harness_run.stdout  # type: ignore[union-attr]
    assert "WROTE-APP" in stdout and not [w for w in ("READ-TESTSTORE", "WROTE-USR", "WROTE-DATA", "WROTE-ROOT") if w in stdout], stdout
    assert "s3cr3t" not in stdout and TASK not in stdout and "terminal.py" not in stdout
    assert not (served.tmp / "planted").exists() and not Path("/usr/planted").exists() and not Path("/planted").exists()


def test_files_planted_where_the_tests_go_do_not_count(endpoint: ModelEndpoint, backend: str) -> None:
    script = ("mkdir -p /tests /logs/verifier && echo 1 > /logs/verifier/reward.txt && printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh; "
              "echo 'def pytest_configure(): open(\"/logs/verifier/reward.txt\", \"w\").write(\"1\")' > /app/conftest.py; echo 999 > /app/error_count.txt\n")
    out = rollout(endpoint, backend, code_harness(script))
    assert (out.reward, out.trajectory.failure) == (0.0, None)
    assert out.trajectory.verifier_run is not None and out.trajectory.verifier_run.exit_code == 0


@pytest.mark.parametrize(("script", "caps", "limit"), [
    ("sleep 600\n", {"wall_s": 3}, "wall"),
    (":(){ :|:& };:\nsleep 5\n", {"processes": 32, "wall_s": 20}, "processes"),
    ("head -c 200000000 /dev/zero > /app/fill; sleep 1\n", {"disk_mb": 16}, "disk"),
], ids=["sleeps-past-the-limit", "fork-bomb", "fills-the-disk"])
def test_a_harness_past_a_limit_is_a_failed_rollout_with_a_reason(endpoint: ModelEndpoint, backend: str, script: str, caps: dict[str, Any], limit: str) -> None:
    out = rollout(endpoint, backend, code_harness(script), **caps)
    assert out.trajectory.harness_run.limit == limit, out.trajectory  # type: ignore[union-attr]
    assert (out.reward, out.trajectory.failure) == (0.0, f"the harness was stopped by its {limit} limit")
    assert out.trajectory.verifier_run is None


def test_a_harness_that_forks_a_sleeper_leaves_nothing_running(endpoint: ModelEndpoint, backend: str) -> None:
    import subprocess

    marker = f"sleeper-{hashlib.sha256(str(id(endpoint)).encode()).hexdigest()[:12]}"
    out = rollout(endpoint, backend, code_harness(f"(exec -a {marker} sleep 1000) &\nsetsid sleep 999 &\necho started\n"))
    assert out.trajectory.harness_run.exit_code == 0  # type: ignore[union-attr]
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout == b""


ASK = ("import json, os, urllib.request, urllib.error\n"
       "def ask(model=os.environ['OPENAI_MODEL'], key=os.environ['OPENAI_API_KEY']):\n"
       "    body = json.dumps({'model': model, 'messages': [{'role': 'user', 'content': 'hi'}]}).encode()\n"
       "    req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=body, method='POST',\n"
       "                                 headers={'Content-Type': 'application/json', 'Authorization': 'Bearer ' + key})\n"
       "    try:\n        return urllib.request.urlopen(req, timeout=30).status\n"
       "    except urllib.error.HTTPError as e:\n        return e.code\n")


def asking(calls: str) -> bytes:
    """A harness that prints the HTTP status of each ``ask(...)`` in ``calls`` (a Python expression list)."""
    return archive({"call.py": ASK + f"print(*[{calls}])\n"}, 'name = "c"\nentry = "python3 /harness/call.py"\n')


def test_the_model_endpoint_serves_only_the_rollouts_model_and_only_while_it_runs(endpoint: ModelEndpoint, backend: str) -> None:
    out = rollout(endpoint, backend, asking("ask(), ask('ckpt_01jd3k4m5n6p7q8r9s0t1v2w3x'), ask('another-base-model'), ask(key='rk-guessed')"))
    assert out.trajectory.harness_run.stdout.split() == ["200", "404", "404", "401"], out.trajectory.harness_run  # type: ignore[union-attr]
    assert out.trajectory.model_calls == 1
    # the token and the rollout's socket are gone with the rollout
    assert endpoint.open_sockets() == 0 and not list(endpoint._dir.glob("*.sock"))


def test_the_model_endpoint_answers_its_two_routes_and_nothing_else(endpoint: ModelEndpoint) -> None:
    """No docs, schema, health or metrics (the worker's request counts would tell of other rollouts, a hidden split's
    grading among them), with a rollout's token or without."""
    bound = endpoint.bind(Binding(model=BASE, ctx=None, hold_id=None, key="eval_test:routes:0", context_tokens=None, max_tokens=8, max_calls=1))
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(bound.socket)), base_url="http://rollout") as client:
            assert client.get("/v1/models", headers={"Authorization": f"Bearer {bound.token}"}).json()["data"][0]["id"] == BASE
            for headers in ({}, {"Authorization": f"Bearer {bound.token}"}):
                for path in ("/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect", "/metrics", "/healthz", "/v1/completions", "/v1/embeddings"):
                    response = client.request("POST" if path.startswith("/v1/") else "GET", path, headers=headers)
                    assert response.status_code in (404, 405) and "rollout-model" not in response.text, (path, response.status_code, response.text[:200])
    finally:
        endpoint.unbind(bound.token)


def _binding(key: str) -> Binding:
    return Binding(model=BASE, ctx=None, hold_id=None, key=key, context_tokens=None, max_tokens=8, max_calls=1)


def _open(path: Path, n: int) -> list[socket.socket]:
    conns = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(path))
        conns.append(s)
    return conns


def _closed(s: socket.socket, timeout_s: float) -> bool:
    s.settimeout(timeout_s)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_a_rollout_holding_thousands_of_connections_exhausts_only_itself(endpoint: ModelEndpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rollout has its own socket with a cap on open connections and on the time to send a request: 2,000 idle
    connections to one rollout's socket leave at most MAX_CONNECTIONS open in the worker, another rollout is answered
    at once, a token is accepted on its own rollout's socket alone, and a request sent too slowly is cut off."""
    monkeypatch.setattr(model_endpoint, "READ_TIMEOUT_S", 2.0)
    refused, cut_off = model_endpoint.REFUSED._value.get(), model_endpoint.CUT_OFF._value.get()
    greedy, other = endpoint.bind(_binding("eval_test:greedy:0")), endpoint.bind(_binding("eval_test:other:0"))
    fds_before = len(os.listdir("/proc/self/fd"))
    conns = _open(greedy.socket, 2000)
    try:
        deadline = time.monotonic() + 10  # the worker accepts the backlog and closes what is over the cap as its loop gets to it
        while len(open_now := [c for c in conns if not _closed(c, 0.001)]) > model_endpoint.MAX_CONNECTIONS and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(open_now) <= model_endpoint.MAX_CONNECTIONS, len(open_now)
        # the test's own 2,000 client sockets are counted here too: the worker's side holds at most the cap
        assert len(os.listdir("/proc/self/fd")) - fds_before <= len(conns) + model_endpoint.MAX_CONNECTIONS + 8
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(other.socket)), base_url="http://rollout", timeout=10) as client:
            assert client.get("/v1/models", headers={"Authorization": f"Bearer {other.token}"}).status_code == 200
            assert client.get("/v1/models", headers={"Authorization": f"Bearer {greedy.token}"}).status_code == 401  # not this socket's
        # the idle ones it kept are closed once they have sent no request for READ_TIMEOUT_S, as is one sending headers slowly
        assert all(_closed(c, 5.0) for c in open_now)
        slow = _open(greedy.socket, 1)[0]
        slow.sendall(b"GET /v1/models HTTP/1.1\r\nHost: rollout\r\n")
        assert _closed(slow, 5.0)
        slow.close()
    finally:
        for c in conns:
            c.close()
        endpoint.unbind(greedy.token)
        endpoint.unbind(other.token)
    with pytest.raises(FileNotFoundError):
        _open(greedy.socket, 1)
    # the worker's metrics count what its cap refused and cut off (served on the worker's metrics port, not here)
    assert model_endpoint.REFUSED._value.get() - refused >= 2000 - model_endpoint.MAX_CONNECTIONS
    assert model_endpoint.CUT_OFF._value.get() - cut_off >= len(open_now)


def test_a_rollout_cannot_make_the_worker_validate_a_million_messages(endpoint: ModelEndpoint) -> None:
    """A body of 100,000 empty messages is refused at once for its length (one error, naming ``messages``), not
    validated message by message on the loop every rollout shares (a million were gigabytes of errors), and a larger
    body is a 413, while another rollout is answered."""
    greedy, other = endpoint.bind(_binding("eval_test:many:0")), endpoint.bind(_binding("eval_test:bystander:0"))
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(greedy.socket)), base_url="http://rollout", timeout=30) as client:
            body = b'{"model": "m", "messages": [' + b",".join([b"{}"] * 100_000) + b"]}"
            started = time.monotonic()
            refused = client.post("/v1/chat/completions", content=body, headers={"Authorization": f"Bearer {greedy.token}", "Content-Type": "application/json"})
            assert refused.status_code == 422 and refused.json()["field"] == "messages" and len(refused.content) < 10_000, refused.text[:500]
            assert time.monotonic() - started < 5
            too_big = client.post("/v1/chat/completions", content=b" " * (model_endpoint.MAX_BODY_BYTES + 1),
                                  headers={"Authorization": f"Bearer {greedy.token}", "Content-Type": "application/json"})
            assert too_big.status_code == 413
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(other.socket)), base_url="http://rollout", timeout=10) as client:
            assert client.get("/v1/models", headers={"Authorization": f"Bearer {other.token}"}).status_code == 200
    finally:
        endpoint.unbind(greedy.token)
        endpoint.unbind(other.token)


def test_a_worker_serves_its_metrics_on_its_own_port_when_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """``CRUCIBLE_WORKER_METRICS_PORT``: the process's Prometheus metrics (the rollout endpoint's among them) answer on
    that port over HTTP."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("CRUCIBLE_WORKER_METRICS_PORT", str(port))
    serve_worker_metrics(ServiceSettings())  # what a worker whose settings name the port runs once ready (make_celery)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert "crucible_rollout_sockets_open" in text and "crucible_rollout_connections_refused_total" in text
    assert "crucible_http_requests_total" in text  # the process's whole registry


def test_a_harness_cannot_take_the_model_endpoint_away_from_the_rollouts_after_it(endpoint: ModelEndpoint, backend: str) -> None:
    """A harness that chmods, removes or replaces its rollout's socket fails (it is bound in read-only), and the next
    rollout reaches the model as before."""
    script = ("chmod 000 /run/crucible/model.sock && echo CHMODDED; rm -f /run/crucible/model.sock && echo REMOVED; "
              "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.bind('/run/crucible/model.sock')\" 2>/dev/null && echo REPLACED\n")
    out = rollout(endpoint, backend, code_harness(script))
    assert not [w for w in ("CHMODDED", "REMOVED", "REPLACED") if w in out.trajectory.harness_run.stdout], out.trajectory.harness_run  # type: ignore[union-attr]
    out = rollout(endpoint, backend, asking("ask()"))
    assert out.trajectory.harness_run.stdout.split() == ["200"], out.trajectory.harness_run  # type: ignore[union-attr]


def test_a_harness_cannot_call_the_model_more_than_the_benchmark_allows(endpoint: ModelEndpoint, backend: str) -> None:
    out = rollout(endpoint, backend, asking("ask(), ask(), ask()"), max_calls=2)
    assert out.trajectory.harness_run.stdout.split() == ["200", "200", "429"] and out.trajectory.model_calls == 2  # type: ignore[union-attr]


# --------------------------------------------------------------------------- conversations the grader drives


def test_a_bfcl_multi_turn_conversation_is_metered_turn_by_turn_and_recorded(served: Served) -> None:
    spec = GradingSpec(task_id="bm_multi_turn", suite={"name": "bfcl_multi_turn", "params": {},
                                                       "splits": {"validation": {"seed": 1, "size": 2}, "train": {"seed": 0, "size": 2}, "test": {"size": 2}}},
                       initial_system={"model": BASE}, reference_score=1.0, evaluation={"max_tokens": 64, "max_turns": 3, "samples": 1})
    served.grader.register_task(spec)
    served.ledger.open_account(AccountCreate(account_id="run_multi_turn", budget_usd_micros=10_000_000))
    ctx = RunContext(run_id="run_multi_turn", task_id=spec.task_id)
    created = served.grader.create_evaluation(ctx, EvaluationCreate(model=BASE), limits=EvaluationLimits())
    assert created.harness_archive is None
    [hold] = served.ledger.list_holds(ctx.run_id)
    METERED.clear()
    worker.run_evaluation(served.service, created.id)
    done = served.grader.get_evaluation(ctx, created.id)
    assert (done.status, done.items_done) == ("succeeded", 2), done.error
    for t in served.grader.get_trajectories(ctx, created.id).data:
        rollout = t.rollout
        assert rollout is not None and rollout.harness is None and rollout.sandbox is None
        # the stand-in's answers hold no call, so each user turn takes one model turn; three turns allowed, then the limit
        assert rollout.model_calls == 3 and [s.source for s in rollout.steps][:3] == ["system", "user", "agent"]
        assert t.score == 0.0 and rollout.failure is not None and "TurnLimitReached" in rollout.failure
        assert (t.prompt_tokens, t.completion_tokens) == (120, 15)
    assert sorted(key for held, key in METERED if held == hold.hold_id) == sorted(
        f"{created.id}:{t.item_id}:0:{turn}" for t in served.grader.get_trajectories(ctx, created.id).data for turn in range(3))
    assert served.ledger.get_hold(hold.hold_id).status == HoldStatus.settled


def test_a_harness_has_no_capabilities_and_cannot_mount_anything(endpoint: ModelEndpoint, backend: str) -> None:
    """The escape a root harness with capabilities had: mount the host's cgroup hierarchy and set its release_agent."""
    script = ("grep CapEff /proc/self/status; mkdir -p /tmp/cg; mount -t cgroup -o pids none /tmp/cg && echo MOUNTED-CGROUP; "
              "mount -t tmpfs none /tmp/cg && echo MOUNTED-TMPFS; mount -o remount,rw / && echo REMOUNTED; "
              "for f in /sys/fs/cgroup/release_agent /sys/fs/cgroup/*/release_agent; do echo /x > $f && echo WROTE-RELEASE-AGENT; done 2>/dev/null\n")
    out = rollout(endpoint, backend, code_harness(script))
    stdout = out.trajectory.harness_run.stdout  # type: ignore[union-attr]
    assert "CapEff:\t0000000000000000" in stdout, stdout
    assert not [w for w in ("MOUNTED-CGROUP", "MOUNTED-TMPFS", "REMOUNTED", "WROTE-RELEASE-AGENT") if w in stdout], stdout


def test_a_deep_tree_left_behind_fails_only_its_rollout_and_is_removed(endpoint: ModelEndpoint, backend: str) -> None:
    marker = f"marker-{time.monotonic_ns()}"
    script = (f"touch /app/{marker}; python3 -c \"import os\nfor _ in range(3000):\n    os.mkdir('d'); os.chdir('d')\"; "
              "cd /harness && mkdir -p $(printf 'x/%.0s' $(seq 600))\n")
    out = rollout(endpoint, backend, code_harness(script))
    assert out.reward == 0.0 and out.trajectory.verifier_run is not None
    assert list(Path(tempfile.gettempdir()).glob(f"crucible-ws-*/app/{marker}")) == []  # the workspace is gone


def test_a_model_call_in_flight_when_its_harness_ends_is_charged_and_recorded(endpoint: ModelEndpoint, backend: str) -> None:
    calls = ("import json, os, threading, urllib.request\n"
             "def slow():\n"
             "    body = json.dumps({'model': os.environ['OPENAI_MODEL'], 'messages': [{'role': 'user', 'content': 'slow'}]}).encode()\n"
             "    req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=body, method='POST',\n"
             "                                 headers={'Content-Type': 'application/json', 'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']})\n"
             "    urllib.request.urlopen(req, timeout=30)\n"
             "threading.Thread(target=slow, daemon=True).start()\n"
             "import time; time.sleep(1); print('leaving')\n")
    METERED.clear()
    out = rollout(endpoint, backend, archive({"call.py": calls}, 'name = "c"\nentry = "python3 /harness/call.py"\n'))
    assert out.trajectory.harness_run.stdout == "leaving\n"  # type: ignore[union-attr]
    assert out.trajectory.model_calls == 1 and out.trajectory.steps[-1].source == "agent" and [(None, f"eval_test:{TASK}:0:0")] == METERED


def test_the_model_endpoint_refuses_several_choices_and_more_than_two_calls_at_once(endpoint: ModelEndpoint, backend: str) -> None:
    n2 = ASK.replace("'content': 'hi'}]", "'content': 'hi'}], 'n': 2")
    out = rollout(endpoint, backend, archive({"call.py": n2 + "print(ask())\n"}, 'name = "c"\nentry = "python3 /harness/call.py"\n'))
    assert out.trajectory.harness_run.stdout.split() == ["422"]  # type: ignore[union-attr]
    slow = ASK.replace("'content': 'hi'", "'content': 'slow'")
    together = slow + "import concurrent.futures as f\nprint(*sorted(f.ThreadPoolExecutor(3).map(lambda _: ask(), range(3))))\n"
    out = rollout(endpoint, backend, archive({"call.py": together}, 'name = "c"\nentry = "python3 /harness/call.py"\n'))
    assert out.trajectory.harness_run.stdout.split() == ["200", "200", "429"], out.trajectory.harness_run  # type: ignore[union-attr]


def test_agent_code_the_verifier_runs_cannot_write_the_reward_or_the_tests(endpoint: ModelEndpoint, backend: str) -> None:
    """The cheat an attack found: a script the task asks for, which the verifier runs, writes the reward itself. The
    verifier runs it as the agent user, which can write neither the reward nor the tests; and a repository's config that
    runs commands (core.fsmonitor, hooks) runs them as that user too."""
    cheat = "echo 1 > /logs/verifier/reward.txt; touch /tests/planted; echo Fizz"
    out = rollout(endpoint, backend, code_harness(f"printf '%s\\\\n' '{cheat}' > /app/fizzbuzz.sh\n"), task="fizzbuzz-script")
    assert (out.reward, out.trajectory.failure) == (0.0, None), out.trajectory.verifier_run
    hook = "echo 1 > /logs/verifier/reward.txt; false"
    git = (f"git config core.fsmonitor '{hook}'; git config core.pager '{hook}'; mkdir -p .git/hooks; "
           f"printf '#!/bin/sh\\\\n{hook}\\\\n' > .git/hooks/post-checkout; chmod +x .git/hooks/post-checkout\n")
    out = rollout(endpoint, backend, code_harness(git), task="git-commit-changes")
    assert (out.reward, out.trajectory.failure) == (0.0, None), out.trajectory.verifier_run

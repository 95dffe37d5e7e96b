"""OpenAI's fine-tuning API, end to end with the unmodified ``openai`` SDK against the running stack under a run key:
files, every job state to ``succeeded``, events, checkpoints, chat with the result, an evaluation of it, cancelling,
reinforcement fine-tuning with a grader, DPO, the graders' own routes, refusals in OpenAI's terms, a budget that cannot
cover a job, and the SDK's repeat of a create.

The jobs train the test-only model (``tiny-smollm2``): what is checked is the API, not what the model learns.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import yaml

from crucible.sdk import CrucibleClient
from tests.conftest import plumbing_benchmark
from tests.models import TINY_MODEL

pytestmark = pytest.mark.e2e

SFT_ROWS = [{"messages": [{"role": "user", "content": f"{a} + {b} ="}, {"role": "assistant", "content": str(a + b)}]}
            for a in range(3) for b in range(3)]
RFT_ROWS = [{"messages": [{"role": "user", "content": f"Say {word}."}], "answer": word} for word in ("yes", "no", "maybe", "ok")]
DPO_ROWS = [{"input": {"messages": [{"role": "user", "content": f"Is {n} even?"}]},
             "preferred_output": [{"role": "assistant", "content": "yes" if n % 2 == 0 else "no"}],
             "non_preferred_output": [{"role": "assistant", "content": "no" if n % 2 == 0 else "yes"}]} for n in range(4)]
STRING_CHECK = {"type": "string_check", "name": "says_it", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}", "operation": "ilike"}


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture(scope="module")
def ft_benchmark(admin) -> dict:  # noqa: ANN001
    """The test benchmark on the test-only model with no recipe field locked (every method allowed)."""
    doc = plumbing_benchmark("openai-finetuning-test")
    doc["recipe"] = {}
    return admin.load_benchmark(yaml.safe_load(yaml.safe_dump(doc)))


@pytest.fixture()
def run(admin, ft_benchmark) -> dict:  # noqa: ANN001
    return admin.create_run(ft_benchmark["name"], "openai-finetuning")


@pytest.fixture()
def sdk(stack, run) -> Iterator[openai.OpenAI]:  # noqa: ANN001
    with openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=run["api_key"], max_retries=0, timeout=120) as client:
        yield client


def upload(sdk: openai.OpenAI, rows: list[dict[str, Any]], name: str = "train.jsonl") -> Any:
    return sdk.files.create(file=(name, jsonl(rows), "application/jsonl"), purpose="fine-tune")


def wait(sdk: openai.OpenAI, job_id: str, timeout_s: float = 240) -> tuple[Any, list[str]]:
    """Poll the job until it ends: ``(job, the statuses seen in order)``."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        job = sdk.fine_tuning.jobs.retrieve(job_id)
        if not seen or seen[-1] != job.status:
            seen.append(job.status)
        if job.status in ("succeeded", "failed", "cancelled"):
            return job, seen
        assert time.monotonic() < deadline, f"job {job_id} still {job.status} after {timeout_s} s"
        time.sleep(0.3)


def test_supervised_job_from_upload_to_chat_and_evaluation(stack, sdk: openai.OpenAI, run: dict) -> None:  # noqa: ANN001
    file = upload(sdk, SFT_ROWS)
    assert (file.object, file.purpose, file.status, file.filename, file.bytes) == ("file", "fine-tune", "processed", "train.jsonl", len(jsonl(SFT_ROWS)))
    assert file.id.startswith("ds_") and sdk.files.retrieve(file.id).id == file.id
    assert file.id in [f.id for f in sdk.files.list()]
    assert sdk.files.content(file.id).read() == jsonl(SFT_ROWS)

    job = sdk.fine_tuning.jobs.create(model=TINY_MODEL, training_file=file.id, suffix="sums", metadata={"team": "a"}, seed=7,
                                      method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2, "batch_size": 3}}})
    assert (job.object, job.model, job.training_file, job.seed, job.user_provided_suffix, job.metadata) == (  # type: ignore[attr-defined]
        "fine_tuning.job", TINY_MODEL, file.id, 7, "sums", {"team": "a"})
    assert job.status in ("validating_files", "queued", "running") and job.fine_tuned_model is None and job.organization_id == run["id"]
    assert job.method.type == "supervised"
    assert job.hyperparameters.batch_size == 3 and job.hyperparameters.n_epochs == pytest.approx(2.0)  # 6 steps of 3 over 9 rows
    assert job.hyperparameters.learning_rate_multiplier == 1.0  # "auto": the recipe's default learning rate

    done, seen = wait(sdk, job.id)
    assert done.status == "succeeded", (done.error, seen)
    assert seen[-1] == "succeeded" and set(seen) <= {"validating_files", "queued", "running", "succeeded"}, seen
    assert done.fine_tuned_model and done.fine_tuned_model.startswith("ckpt_") and done.trained_tokens > 0 and done.finished_at >= done.created_at
    assert done.error is None

    events = list(sdk.fine_tuning.jobs.list_events(job.id, limit=100))
    assert [e.created_at for e in events] == sorted((e.created_at for e in events), reverse=True)  # newest first
    metrics = [e for e in events if e.type == "metrics"]
    assert len(metrics) == 6 and {e.data["step"] for e in metrics} == set(range(1, 7))
    assert all(e.data["total_steps"] == 6 and e.data["train_loss"] > 0 and e.message.startswith("Step ") for e in metrics)
    page = sdk.fine_tuning.jobs.list_events(job.id, limit=2)
    assert len(page.data) == 2 and page.has_more
    assert sdk.fine_tuning.jobs.list_events(job.id, limit=2, after=page.data[-1].id).data[0].id == events[2].id

    checkpoints = list(sdk.fine_tuning.jobs.checkpoints.list(job.id))
    assert checkpoints and checkpoints[0].step_number == 6 and checkpoints[0].fine_tuned_model_checkpoint == done.fine_tuned_model
    assert all(c.fine_tuning_job_id == job.id and c.metrics.step == c.step_number for c in checkpoints)

    for model in (done.fine_tuned_model, checkpoints[-1].fine_tuned_model_checkpoint):
        answer = sdk.chat.completions.create(model=model, messages=[{"role": "user", "content": "1 + 1 ="}], max_tokens=4, temperature=0)
        assert answer.model == model and answer.usage.completion_tokens > 0

    with CrucibleClient(stack.gateway_url, run["api_key"]) as native:
        evaluation = native.wait_evaluation(native.create_evaluation(done.fine_tuned_model, limit=4)["id"])
        assert evaluation["status"] == "succeeded" and evaluation["model"] == done.fine_tuned_model
        assert native.training_job(job.id)["recipe"]["method"] == "sft"

    assert [j.id for j in sdk.fine_tuning.jobs.list(metadata={"team": "a"})] == [job.id]
    assert list(sdk.fine_tuning.jobs.list(metadata={"team": "b"})) == []


def test_a_job_is_cancelled_and_a_second_cancel_is_a_400(sdk: openai.OpenAI) -> None:
    file = upload(sdk, SFT_ROWS)
    job = sdk.fine_tuning.jobs.create(model=TINY_MODEL, training_file=file.id, hyperparameters={"n_epochs": 50, "batch_size": 1})
    cancelled = sdk.fine_tuning.jobs.cancel(job.id)
    assert cancelled.id == job.id
    done, _ = wait(sdk, job.id)
    assert done.status == "cancelled" and done.fine_tuned_model is None
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.fine_tuning.jobs.cancel(job.id)
    assert exc.value.param == "fine_tuning_job_id"
    with pytest.raises(openai.BadRequestError):
        sdk.fine_tuning.jobs.pause(job.id)
    with pytest.raises(openai.NotFoundError):
        sdk.fine_tuning.jobs.retrieve("job_0000000000000000000000000a")


def test_reinforcement_job_rewarded_by_a_string_check_grader(sdk: openai.OpenAI) -> None:
    file = upload(sdk, RFT_ROWS, "rft.jsonl")
    job = sdk.fine_tuning.jobs.create(
        model=TINY_MODEL, training_file=file.id,
        method={"type": "reinforcement", "reinforcement": {"grader": STRING_CHECK,
                                                           "hyperparameters": {"n_epochs": 1, "batch_size": 2, "compute_multiplier": 0.5}}})
    assert job.method.type == "reinforcement" and job.method.reinforcement.grader.type == "string_check"
    assert job.method.reinforcement.hyperparameters.compute_multiplier == 0.5  # a group of 2
    done, seen = wait(sdk, job.id)
    assert done.status == "succeeded", (done.error, seen)
    metrics = [e.data for e in sdk.fine_tuning.jobs.list_events(job.id, limit=100) if e.type == "metrics"]
    assert len(metrics) == 2 and all(0.0 <= m["reward_mean"] <= 1.0 for m in metrics)


def test_dpo_job_on_openai_preference_rows(sdk: openai.OpenAI) -> None:
    file = upload(sdk, DPO_ROWS, "dpo.jsonl")
    job = sdk.fine_tuning.jobs.create(model=TINY_MODEL, training_file=file.id,
                                      method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2, "n_epochs": 1, "batch_size": 2}}})
    assert job.method.dpo.hyperparameters.beta == 0.2
    done, seen = wait(sdk, job.id)
    assert done.status == "succeeded", (done.error, seen)


def test_graders_run_and_validate(sdk: openai.OpenAI) -> None:
    multi = {"type": "multi", "name": "blend", "calculate_output": "0.5 * exact + 0.5 * close",
             "graders": {"exact": {**STRING_CHECK, "name": "exact", "operation": "eq"},
                         "close": {"type": "text_similarity", "name": "close", "input": "{{ sample.output_text }}",
                                   "reference": "{{ item.answer }}", "evaluation_metric": "fuzzy_match"}}}
    result = sdk.fine_tuning.alpha.graders.run(grader=multi, model_sample="yes", item={"answer": "yes"})
    assert result.reward == 1.0 and result.sub_rewards == {"exact": 1.0, "close": 1.0}
    result = sdk.fine_tuning.alpha.graders.run(grader=STRING_CHECK, model_sample="yes", item={"other": 1})
    assert result.reward == 0.0 and result.metadata.errors.invalid_variable_error
    python = {"type": "python", "name": "length", "source": "def grade(sample, item):\n    return len(sample['output_text']) / 10\n"}
    assert sdk.fine_tuning.alpha.graders.run(grader=python, model_sample="abcde").reward == 0.5
    assert sdk.fine_tuning.alpha.graders.validate(grader=STRING_CHECK).grader.name == "says_it"
    judge = {"type": "score_model", "name": "judge", "model": TINY_MODEL, "range": [0, 10], "sampling_params": {"max_completions_tokens": 4},
             "input": [{"role": "user", "content": "Score 0-10: is {{ sample.output_text }} the answer {{ item.answer }}?"}]}
    judged = sdk.fine_tuning.alpha.graders.run(grader=judge, model_sample="yes", item={"answer": "yes"})
    assert judged.metadata.token_usage > 0 and 0.0 <= judged.reward <= 10.0  # the test-only model's answer: a parse error or a number
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.fine_tuning.alpha.graders.validate(grader={**multi, "calculate_output": "exact + nope"})
    assert "nope" in exc.value.message


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"validation_file": "ds_0000000000000000000000000a"}, "validation_file"),
    ({"integrations": [{"type": "wandb", "wandb": {"project": "p"}}]}, "integrations"),
    ({"method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 0}}}}, "method.supervised.hyperparameters.n_epochs"),
    ({"method": {"type": "supervised", "supervised": {"hyperparameters": {"warmup": 3}}}}, "method.supervised.hyperparameters.warmup"),
    ({"method": {"type": "reinforcement", "reinforcement": {"grader": STRING_CHECK, "hyperparameters": {"eval_interval": 5}}}},
     "method.reinforcement.hyperparameters.eval_interval"),
    ({"method": {"type": "reinforcement", "reinforcement": {"grader": {**STRING_CHECK, "operation": "contains"}}}},
     "method.reinforcement.grader.operation"),
    ({"method": {"type": "dpo", "supervised": {}}}, "method"),
    ({"shape": "unknown"}, "shape"),
])
def test_a_field_that_cannot_be_honoured_is_a_400_naming_it(sdk: openai.OpenAI, kwargs: dict, param: str) -> None:
    file = upload(sdk, SFT_ROWS)
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.fine_tuning.jobs.create(model=TINY_MODEL, training_file=file.id, extra_body=kwargs)
    assert exc.value.param is not None and exc.value.param.startswith(param), (exc.value.param, exc.value.message)
    assert exc.value.code and exc.value.type == "invalid_request_error"


def test_refusals_name_the_training_file_and_its_row(sdk: openai.OpenAI, new_run) -> None:  # noqa: ANN001
    rft = upload(sdk, RFT_ROWS)
    grader = {**STRING_CHECK, "reference": "{{ item.expected }}"}
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.fine_tuning.jobs.create(model=TINY_MODEL, training_file=rft.id, method={"type": "reinforcement", "reinforcement": {"grader": grader}})
    assert exc.value.param == "training_file" and "expected" in exc.value.message and "line 1" in exc.value.message
    with pytest.raises(openai.BadRequestError) as exc:  # an SFT job on prompts alone
        sdk.fine_tuning.jobs.create(model=TINY_MODEL, training_file=rft.id)
    assert exc.value.param == "training_file"
    other, _ = new_run("someone-else")
    with openai.OpenAI(base_url=str(sdk.base_url), api_key=other["api_key"], max_retries=0) as theirs:
        with pytest.raises(openai.BadRequestError) as exc:
            theirs.fine_tuning.jobs.create(model=TINY_MODEL, training_file=rft.id)
        assert exc.value.param == "training_file"
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.files.create(file=("a.jsonl", jsonl(SFT_ROWS)), purpose="assistants")
    assert exc.value.param == "purpose"
    with pytest.raises(openai.UnprocessableEntityError) as exc:
        sdk.files.create(file=("bad.jsonl", b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]}\n'),
                         purpose="fine-tune")
    assert exc.value.param == "messages[1].content" and exc.value.body["param"] == "messages[1].content"


def test_a_locked_method_is_a_403_naming_method_type(sdk: openai.OpenAI, new_run) -> None:  # noqa: ANN001
    run, _ = new_run("locked-method")  # the session's test benchmark locks recipe.method to sft
    with openai.OpenAI(base_url=str(sdk.base_url), api_key=run["api_key"], max_retries=0) as locked:
        file = upload(locked, DPO_ROWS)
        with pytest.raises(openai.PermissionDeniedError) as exc:
            locked.fine_tuning.jobs.create(model=TINY_MODEL, training_file=file.id, method={"type": "dpo"})
    assert exc.value.param == "method.type"


def test_a_budget_that_cannot_cover_the_job_is_a_402_and_charges_nothing(stack, admin, ft_benchmark) -> None:  # noqa: ANN001
    run = admin.create_run(ft_benchmark["name"], "poor", budget_usd=0.000001)
    with openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=run["api_key"], max_retries=0) as sdk:
        file = upload(sdk, SFT_ROWS)
        with pytest.raises(openai.APIStatusError) as exc:
            sdk.fine_tuning.jobs.create(model=TINY_MODEL, training_file=file.id, hyperparameters={"n_epochs": 3})
        assert exc.value.status_code == 402 and exc.value.type == "insufficient_quota"
        assert list(sdk.fine_tuning.jobs.list()) == []
    with CrucibleClient(stack.gateway_url, run["api_key"]) as native:
        budget = native.budget()
        assert budget["spent_usd_micros"] == 0 and budget["held_usd_micros"] == 0


def test_the_sdks_repeat_of_a_create_returns_the_job_first_created(stack, run: dict, sdk: openai.OpenAI) -> None:  # noqa: ANN001
    file = upload(sdk, SFT_ROWS)
    body = {"model": TINY_MODEL, "training_file": file.id, "hyperparameters": {"n_epochs": 1}}
    headers = {"Authorization": f"Bearer {run['api_key']}"}
    with httpx.Client(base_url=f"{stack.gateway_url}/v1", headers=headers, timeout=60) as http:
        first = http.post("/fine_tuning/jobs", json=body).json()
        repeat = http.post("/fine_tuning/jobs", json=body, headers={"x-stainless-retry-count": "1"}).json()
        another = http.post("/fine_tuning/jobs", json=body).json()  # a new create, not a repeat: a second job
    assert repeat["id"] == first["id"] and another["id"] != first["id"]
    assert [j.id for j in sdk.fine_tuning.jobs.list()] == [another["id"], first["id"]]
    for job_id in (first["id"], another["id"]):
        sdk.fine_tuning.jobs.cancel(job_id)


def test_a_conflict_tells_the_sdk_not_to_retry(stack, run: dict) -> None:  # noqa: ANN001
    """A 409 (an idempotency key reused with another body) carries ``x-should-retry: false``: the SDK retries 409s otherwise."""
    headers = {"Authorization": f"Bearer {run['api_key']}", "Idempotency-Key": "ft-conflict-1"}
    with httpx.Client(base_url=f"{stack.gateway_url}/v1", headers=headers, timeout=60) as http:
        file = http.post("/files", files={"file": ("t.jsonl", io.BytesIO(jsonl(SFT_ROWS)))}, data={"purpose": "fine-tune"}).json()
        first = http.post("/fine_tuning/jobs", json={"model": TINY_MODEL, "training_file": file["id"], "seed": 1})
        second = http.post("/fine_tuning/jobs", json={"model": TINY_MODEL, "training_file": file["id"], "seed": 2})
        assert first.status_code == 200 and second.status_code == 409, second.text
        assert second.headers["x-should-retry"] == "false" and second.json()["error"]["type"] == "conflict_error"
        http.post(f"/fine_tuning/jobs/{first.json()['id']}/cancel")

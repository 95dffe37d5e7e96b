"""Tinker's training primitives, end to end with the unmodified ``tinker`` SDK against the running stack under a run
key (``tml-`` + the key): an SFT loop that ends in a checkpoint a validation evaluation scores and chat answers with,
sampling from saved weights, a small RL loop (sample, reward, ``importance_sampling``, ``optim_step``), a custom loss,
a request the server refuses as the client's mistake, a track that does not let the run train, and a budget that runs
out mid-loop.

The live models are the test-only model (``tiny-smollm2``): what is checked is the protocol, the metering and the
checkpoints, not what the model learns. Each test closes its ``ServiceClient``, which lets the train worker go at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import tinker
import torch
import yaml
from tinker import types

from crucible.sdk import CrucibleClient
from tests.conftest import plumbing_benchmark
from tests.models import TINY_MODEL

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tinker_benchmark(admin) -> dict:  # noqa: ANN001
    """The test benchmark on the test-only model with no recipe field locked."""
    doc = plumbing_benchmark("tinker-test")
    doc["recipe"] = {}
    return admin.load_benchmark(yaml.safe_load(yaml.safe_dump(doc)))


@pytest.fixture()
def run(admin, tinker_benchmark) -> dict:  # noqa: ANN001
    return admin.create_run(tinker_benchmark["name"], "tinker")


def service_client(stack: Any, key: str) -> tinker.ServiceClient:  # noqa: ANN401
    return tinker.ServiceClient(api_key=f"tml-{key}", base_url=stack.gateway_url)


@pytest.fixture()
def service(stack, run: dict) -> Iterator[tinker.ServiceClient]:  # noqa: ANN001
    client = service_client(stack, run["api_key"])
    yield client
    client.close("success").result()


def sft_datum(tokenizer: Any, prompt: str, answer: str) -> types.Datum:  # noqa: ANN401
    p = tokenizer.encode(prompt, add_special_tokens=False)
    a = tokenizer.encode(answer, add_special_tokens=False)
    tokens = p + a
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": [0.0] * (len(p) - 1) + [1.0] * len(a)})


def test_an_sft_loop_ends_in_a_checkpoint_that_is_sampled_evaluated_and_chatted_with(stack, service: tinker.ServiceClient, run: dict) -> None:  # noqa: ANN001
    training = service.create_lora_training_client(base_model=TINY_MODEL, rank=4, seed=1).result()
    tokenizer = training.get_tokenizer()
    datum = sft_datum(tokenizer, "The capital of France is", " Paris.")
    losses = []
    for _ in range(4):
        fwd_bwd = training.forward_backward([datum], "cross_entropy")
        optim = training.optim_step(types.AdamParams(learning_rate=5e-2))
        out = fwd_bwd.result()
        optim.result()
        losses.append(out.metrics["loss:sum"])
        assert len(out.loss_fn_outputs[0]["logprobs"].tolist()) == len(datum.loss_fn_inputs["target_tokens"].tolist())
    assert losses[-1] < losses[0], losses

    path = training.save_weights_for_sampler("sft").result().path
    assert path == f"tinker://{training.model_id}/sampler_weights/sft"
    sampler = service.create_sampling_client(model_path=path).result()
    prompt = types.ModelInput.from_ints(tokenizer.encode("The capital of France is", add_special_tokens=False))
    result = sampler.sample(prompt, num_samples=2, sampling_params=types.SamplingParams(max_tokens=5, temperature=1.0, seed=3)).result()
    assert len(result.sequences) == 2 and all(0 < len(s.tokens) <= 5 and len(s.logprobs) == len(s.tokens) for s in result.sequences)
    state = training.save_state("after-sft").result().path
    assert state == f"tinker://{training.model_id}/weights/after-sft"
    resumed = service.create_training_client_from_state_with_optimizer(state).result()  # a second live model, from the saved state
    assert resumed.forward([datum], "cross_entropy").result().metrics["loss:sum"] == pytest.approx(
        training.forward([datum], "cross_entropy").result().metrics["loss:sum"], rel=1e-4)

    with CrucibleClient(stack.gateway_url, run["api_key"]) as native:
        job, _resumed_job = [j for j in native.training_jobs() if j["recipe"]["method"] == "primitives"]
        assert job["recipe"]["lora_r"] == 4 and job["steps_done"] == 4 and job["trained_tokens"] > 0
        checkpoints = native.checkpoints(job["id"])
        assert len(checkpoints) == 1 and checkpoints[0]["step"] == 4
        model = checkpoints[0]["id"]
        assert native.chat(model, [{"role": "user", "content": "hi"}], max_tokens=3)["model"] == model
        evaluation = native.wait_evaluation(native.create_evaluation(model, limit=4)["id"])
        assert evaluation["status"] == "succeeded"
        usage = native.budget()["usage_by_kind"]
        assert usage["training_tokens"] == job["trained_tokens"] and usage["decode_tokens"] > 0

    listed = tinker.RestClient(api_key=f"tml-{run['api_key']}", base_url=stack.gateway_url).list_checkpoints(training.model_id).result()
    assert {c.tinker_path for c in listed.checkpoints} == {path, state}


def test_a_small_rl_loop_samples_rewards_and_trains_by_importance_sampling(service: tinker.ServiceClient) -> None:
    training = service.create_lora_training_client(base_model=TINY_MODEL, rank=4, seed=2).result()
    tokenizer = training.get_tokenizer()
    prompt = tokenizer.encode("Count: one two", add_special_tokens=False)
    params = types.SamplingParams(max_tokens=4, temperature=1.0)
    for it in range(2):
        sampler = training.save_weights_and_get_sampling_client().result()
        res = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=4, sampling_params=params).result()
        rewards = [float(len(s.tokens) % 2) for s in res.sequences]
        baseline = sum(rewards) / len(rewards)
        batch = []
        for seq, r in zip(res.sequences, rewards, strict=True):
            full, n_p = prompt + list(seq.tokens), len(prompt) - 1
            batch.append(types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                                     loss_fn_inputs={"target_tokens": full[1:], "logprobs": [0.0] * n_p + list(seq.logprobs),
                                                     "advantages": [0.0] * n_p + [r - baseline] * len(seq.tokens)}))
        out = training.forward_backward(batch, "importance_sampling").result()
        training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        assert "loss:sum" in out.metrics and len(out.loss_fn_outputs) == 4, it

    datum = sft_datum(tokenizer, "a b", " c")

    def custom(data: list[types.Datum], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        loss = -sum((lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in zip(data, logprobs, strict=True))
        return loss, {"custom": float(loss.detach())}

    out = training.forward_backward_custom([datum], custom).result()
    assert out.metrics["loss:sum"] > 0 and "custom" in out.metrics


def test_a_refused_request_fails_its_future_and_the_client_goes_on(stack, service: tinker.ServiceClient, run: dict) -> None:  # noqa: ANN001
    training = service.create_lora_training_client(base_model=TINY_MODEL, rank=2).result()
    tokenizer = training.get_tokenizer()
    datum = sft_datum(tokenizer, "x y", " z")
    with pytest.raises(tinker.RequestFailedError) as exc:
        training.forward_backward([datum], "ppo").result()  # ppo needs logprobs and advantages
    assert "advantages" in str(exc.value) or "logprobs" in str(exc.value)
    assert training.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"] > 0
    with pytest.raises(tinker.BadRequestError):
        service.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=2).result()
    with CrucibleClient(stack.gateway_url, run["api_key"]) as native:  # cancelled: what it was asked after that does not run
        live = [j for j in native.training_jobs() if j["recipe"]["method"] == "primitives"][-1]
        native.cancel_training_job(live["id"])
        with pytest.raises((tinker.ConflictError, tinker.RequestFailedError)):
            training.forward_backward([datum], "cross_entropy").result()
        assert native.budget()["held_usd_micros"] == 0


def test_a_track_without_the_trainer_refuses_the_primitives(stack, admin, tinker_benchmark) -> None:  # noqa: ANN001
    run = admin.create_run(tinker_benchmark["name"], "data-only", track="data")
    client = service_client(stack, run["api_key"])
    try:
        with pytest.raises(tinker.PermissionDeniedError):
            client.create_lora_training_client(base_model=TINY_MODEL, rank=2).result()
    finally:
        client.close("success").result()


def test_a_budget_that_runs_out_mid_loop_stops_the_loop_and_charges_only_work_done(stack, admin, tinker_benchmark) -> None:  # noqa: ANN001
    run = admin.create_run(tinker_benchmark["name"], "poor", budget_usd=0.03)
    client = service_client(stack, run["api_key"])
    try:
        training = client.create_lora_training_client(base_model=TINY_MODEL, rank=2).result()
        tokenizer = training.get_tokenizer()
        datum = sft_datum(tokenizer, "word " * 200, " end")  # about 400 tokens: 8,000 µUSD a step at the default price
        done = 0
        with pytest.raises(tinker.BillingError):
            for _ in range(1000):
                training.forward_backward([datum], "cross_entropy").result()
                training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
                done += 1
        assert done > 0
    finally:
        client.close("success").result()
    with CrucibleClient(stack.gateway_url, run["api_key"]) as native:
        budget = native.budget()
        (job,) = native.training_jobs()
    assert budget["held_usd_micros"] == 0 and 0 < budget["spent_usd_micros"] <= budget["budget_usd_micros"]
    assert budget["usage_by_kind"]["training_tokens"] == job["trained_tokens"] == done * len(datum.model_input.to_ints())

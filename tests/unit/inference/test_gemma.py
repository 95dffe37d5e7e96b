"""Gemma 3 270M, a base model registered by its built-in card, through each part of the platform in this process with
the real model: served by the inference app (text and chat completions, metered), fine-tuned by the trainer's LoRA
SFT loop (a few steps on every linear layer), its checkpoint served as an adapter, and the initial system of a
benchmark on it graded by the grader's own evaluation worker against the real inference app. Nothing of the core is
mocked: the stand-ins are the trainer's checkpoint look-up (answering with the adapter trained here) and the queue."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from inference_service.app import create_app
from inference_service.client import InferenceClient
from inference_service.service import Inference
from inference_service.settings import InferenceSettings
from trainer_service.client import TrainerClient
from trainer_service.config import TrainConfig
from trainer_service.methods import METHODS
from trainer_service.schemas import ChatRow
from trainer_service.training import train

from grader import worker
from grader.app import create_app as create_grader_app
from grader.client import GraderClient
from grader.service import Grader
from grader.settings import GraderSettings
from services.common.contracts import GradingSpec
from services.common.http import ServiceClient
from services.common.ids import new_id
from services.common.openai_protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from services.ledger.client import LedgerClient
from tests.conftest import prepared_models
from tests.unit.inference.conftest import GATEWAY_TOKEN, INFERENCE_TOKEN, run
from tests.unit.inprocess import in_process

GEMMA = "gemma3-270m"
GRADER_TOKEN = "grader-token-for-gemma"
CKPT = new_id("ckpt")
ROWS = [ChatRow.model_validate({"messages": [{"role": "user", "content": f"{a} + {b} ="}, {"role": "assistant", "content": str(a + b)}]})
        for a in range(1, 5) for b in range(1, 5)]


@dataclass
class Stack:
    inference: InferenceClient  # called as the grader calls it (inference trusts the grader)
    service: Inference
    adapter_dir: Path  # where the test's fine-tuned checkpoint is (filled by the training test)
    engine: str


@pytest.fixture(scope="module", params=["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, ledger: LedgerClient) -> Iterator[Stack]:
    """The inference app on each engine that loads Gemma in this process (vLLM's: in ``make test-slow``)."""
    data_dir = tmp_path_factory.mktemp("gemma")
    (data_dir / "models").symlink_to(prepared_models(GEMMA), target_is_directory=True)
    adapter_dir = data_dir / "adapter"
    engine = request.param

    def checkpoints(request: httpx.Request) -> httpx.Response:
        """The trainer: knows the one checkpoint trained in this module."""
        if request.url.path.endswith(CKPT):
            return httpx.Response(200, json={"id": CKPT, "run_id": f"run_gemma_{engine}", "base_model": GEMMA, "uri": adapter_dir.as_uri(),
                                             "kind": "lora", "step": 3})
        return httpx.Response(404, json={"status": 404, "title": "Not found", "code": "not_found", "detail": "unknown checkpoint"})

    settings = InferenceSettings(data_dir=data_dir, service_token=INFERENCE_TOKEN, trusted_tokens={"gateway": GATEWAY_TOKEN, "grader": GRADER_TOKEN},
                                 engine=engine, max_lora_rank=16)
    with TestClient(create_app(settings), base_url="http://inference") as http:
        service: Inference = http.app.state.inference  # type: ignore[attr-defined]
        service.ledger.close()
        service.ledger = ledger
        service.trainer.close()
        trainer = ServiceClient("http://trainer", INFERENCE_TOKEN, name="trainer")
        trainer.client = httpx.Client(base_url="http://trainer", transport=httpx.MockTransport(checkpoints))
        service.trainer = TrainerClient(trainer)
        yield Stack(InferenceClient(in_process(http, GRADER_TOKEN, "inference")), service, adapter_dir, engine)
        service.ledger = LedgerClient.connect(settings)  # the app closes its clients on shutdown; the shared ledger stays open


def test_gemma_is_served_with_its_cards_template_context_cap_and_prices(stack: Stack, ledger: LedgerClient) -> None:
    assert [m.id for m in stack.inference.list_models().data] == [GEMMA]
    (card,) = stack.inference.list_base_models().data
    assert (card.name, card.context_tokens, card.stop_tokens) == (GEMMA, 8192, ["<end_of_turn>"])
    ctx = run(ledger, f"run_gemma_serve_{stack.engine}")
    started = time.perf_counter()
    text = stack.inference.completions(ctx, CompletionRequest(model=GEMMA, prompt="The capital of France is", max_tokens=16, temperature=0))
    elapsed = time.perf_counter() - started
    assert "France" in text.choices[0].text or "Paris" in text.choices[0].text, text.choices[0].text
    print(f"gemma text completion: {text.usage.completion_tokens} tokens in {elapsed:.2f} s")  # noqa: T201
    chat = stack.inference.chat_completions(ctx, ChatCompletionRequest(model=GEMMA, messages=[ChatMessage(role="user", content="2 + 3 =")],
                                                                     max_tokens=4, temperature=0))
    rendered = stack.service.engines[GEMMA].renderer.render([{"role": "user", "content": "2 + 3 ="}])  # type: ignore[attr-defined]
    assert rendered == "<bos><start_of_turn>user\n2 + 3 =<end_of_turn>\n<start_of_turn>model\n" and chat.usage.prompt_tokens > 5
    end_of_turn = stack.service.engines[GEMMA].tokenizer.convert_tokens_to_ids("<end_of_turn>")  # type: ignore[attr-defined]
    ended = stack.inference.chat_completions(ctx, ChatCompletionRequest(model=GEMMA, messages=[ChatMessage(role="user", content="2 + 3 =")],
                                                                       max_tokens=8, temperature=0, logit_bias={str(end_of_turn): 100}))
    assert (ended.choices[0].finish_reason, ended.choices[0].message.content, ended.usage.completion_tokens) == ("stop", "", 1)  # the card's stop token
    assert ledger.get_balance(ctx.run_id).usage_by_kind["decode_tokens"] == text.usage.completion_tokens + chat.usage.completion_tokens + 1
    too_long = ChatCompletionRequest(model=GEMMA, messages=[ChatMessage(role="user", content="hi")], max_tokens=9000)
    with pytest.raises(Exception) as exc:  # the card's cap (8192), not the model's 32768 positions
        stack.inference.chat_completions(ctx, too_long)
    assert exc.value.problem["context_tokens"] == 8192  # type: ignore[attr-defined]


def test_gemma_fine_tunes_with_lora_on_every_linear_layer_and_its_checkpoint_is_served(stack: Stack, ledger: LedgerClient, tmp_path: Path) -> None:
    steps: list[float] = []
    config = TrainConfig(max_steps=3, batch_size=4, warmup_steps=0, max_seq_len=64, checkpoint_every=3, learning_rate=1e-3)
    started = time.perf_counter()
    result = train(stack.service.settings.models_dir / GEMMA, METHODS["sft"], ROWS, config, tmp_path / "train",
                   on_step=lambda m: steps.append(m.elapsed_s))
    print(f"gemma LoRA SFT: {result.steps_done} steps (batch 4) in {time.perf_counter() - started:.1f} s, loss {result.final_loss:.3f}, "  # noqa: T201
          f"step times {[round(b - a, 2) for a, b in zip([0.0, *steps], steps, strict=False)]} s")
    assert result.steps_done == 3 and result.final_loss == result.final_loss  # finite
    adapter = json.loads((result.last_checkpoint / "adapter_config.json").read_text())
    assert set(adapter["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    result.last_checkpoint.rename(stack.adapter_dir)
    ctx = run(ledger, f"run_gemma_{stack.engine}")
    out = stack.inference.chat_completions(ctx, ChatCompletionRequest(model=CKPT, messages=[ChatMessage(role="user", content="2 + 3 =")],
                                                                    max_tokens=4, temperature=0))
    assert out.model == CKPT and out.usage.completion_tokens >= 1


def test_a_benchmark_on_gemma_is_graded_by_the_grader_on_the_real_inference(stack: Stack, ledger: LedgerClient,
                                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("grader")
    settings = GraderSettings(data_dir=tmp, grader_test_seed=99, service_token=GRADER_TOKEN, trusted_tokens={"gateway": GATEWAY_TOKEN})
    with TestClient(create_grader_app(settings), base_url="http://grader") as http:
        grader: Grader = http.app.state.grader  # type: ignore[attr-defined]
        grader.close()
        grader.ledger, grader.inference = ledger, stack.inference
        queue: list[str] = []
        grader.enqueue = queue.append
        grader.enqueue_build = None  # no queue: a task's splits are built in the registering call
        spec = GradingSpec(task_id="bm_gemma", suite={"name": "reasoning_gym", "params": {"task": "chain_sum", "min_terms": 2, "max_terms": 2,
                                                                                        "min_digits": 1, "max_digits": 1},
                                                      "splits": {"train": {"seed": 1, "size": 50}, "validation": {"seed": 2, "size": 4},
                                                                 "test": {"size": 4}}},
                           initial_system={"model": GEMMA}, reference_score=1.0,
                           evaluation={"max_tokens": 6, "temperature": 0.0, "samples": 1, "metric": "avg@k", "context_tokens": 512})
        client = GraderClient(in_process(http, GATEWAY_TOKEN, "grader"))
        try:
            assert client.register_task(spec).initial_status == "queued"
            for eval_id in queue:
                worker.run_evaluation(grader, eval_id)
            status = client.task_status("bm_gemma")
        finally:  # the app closes its clients on shutdown: not the shared ones
            grader.ledger, grader.inference = LedgerClient.connect(settings), InferenceClient.connect(settings)
        assert status.initial_status == "succeeded", status
        assert 0.0 <= status.initial.value <= 1.0 and status.initial.n == 4

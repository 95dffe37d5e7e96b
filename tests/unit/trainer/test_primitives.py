"""Tinker's training primitives (:mod:`trainer_service.primitives`) on the test-only model ``tiny-smollm2`` (SmolLM2's
architecture and tokenizer, random weights; :mod:`tests.models`), computed for real on the CPU in float32.

The wire codec is checked against the unmodified ``tinker`` SDK: requests are built by its own ``request_conv`` from
its ``tinker.types`` objects and results read back by its own ``response_conv``. The losses are checked against their
formulas on log-probabilities computed independently (a plain transformers model), and the training semantics
Tinker's users rely on (sums, accumulation until ``optim_step``, ``forward`` changing nothing, exact resume) by what
the adapter's weights do."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tinker import types
from tinker.proto import request_conv, response_conv
from tinker.proto import tinker_public_pb2 as pb
from trainer_service import primitives
from trainer_service.devices import Device
from trainer_service.primitives import (
    OPTIMIZER_FILE,
    Datum,
    LiveModel,
    PrimitiveError,
    decode_forward_backward,
    encode_forward_backward_output,
    encode_sample_response,
)
from transformers import AutoModelForCausalLM

from tests.conftest import prepared_models
from tests.models import TINY_MODEL

CPU = Device(torch.device("cpu"), "cpu (float32)", None)
SEQ_A = [1, 504, 3120, 28, 7, 4093, 17, 902, 40, 2]
SEQ_B = [1, 3620, 1425, 39, 11, 2]


def sft(seq: list[int], weights: list[float] | None = None) -> Datum:
    """A datum as Tinker's users build one: input ``seq[:-1]``, targets ``seq[1:]``."""
    n = len(seq) - 1
    return Datum(seq[:-1], {"target_tokens": np.array(seq[1:], np.int64), "weights": np.array(weights or [1.0] * n, np.float32)})


def rl(seq: list[int], sampler_logprobs: np.ndarray, advantages: float) -> Datum:
    n = len(seq) - 1
    return Datum(seq[:-1], {"target_tokens": np.array(seq[1:], np.int64), "logprobs": np.asarray(sampler_logprobs, np.float32),
                            "advantages": np.full(n, advantages, np.float32)})


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread while these tests run (as under ``make test``'s xdist workers, tests/conftest.py): on two busy
    cores, two threads spinning for a 64-wide model measured 20x slower sampling."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base() -> Path:
    return prepared_models(TINY_MODEL) / TINY_MODEL


def live(base: Path, seed: int = 0, **lora: object) -> LiveModel:
    return LiveModel(base, rank=4, seed=seed, device=CPU, **lora)  # type: ignore[arg-type]


def lora_weights(model: LiveModel) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.peft_model.named_parameters() if p.requires_grad}


def lora_grads(model: LiveModel) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for name, p in model.peft_model.named_parameters() if p.requires_grad}


def assert_same_grads(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], rel: float = 1e-4) -> None:
    """Each parameter's gradient equal up to float rounding, measured against that gradient's norm (summation order differs)."""
    for name, grad in expected.items():
        assert float((got[name] - grad).norm()) <= rel * float(grad.norm()) + 1e-9, name


def forward(model: LiveModel, *data: Datum) -> list[np.ndarray]:
    return model.forward_backward(list(data), "cross_entropy", forward_only=True)[0]


# --- the wire codec, against the SDK's own converters ----------------------------------------------------------------


def test_a_forward_backward_request_written_by_the_sdk_decodes_to_its_tokens_inputs_and_config() -> None:
    sparse_targets = torch.zeros(5, 4, dtype=torch.int64)
    sparse_targets[torch.arange(5), torch.tensor([0, 2, 1, 3, 0])] = torch.tensor([7, 8, 9, 10, 11])
    data = [
        types.Datum(model_input=types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1, 2, 3]), types.EncodedTextChunk(tokens=[4, 5])]),
                    loss_fn_inputs={"target_tokens": [2, 3, 4, 5, 6], "weights": [0.0, 0.0, 1.0, 1.0, -1.5],
                                    "advantages": types.TensorData(data=[0.5, 0.5, 0.5, 0.5, 0.5], dtype="float32")}),  # no shape: 1-D
        types.Datum(model_input=types.ModelInput.from_ints([9, 8, 7, 6, 5]),
                    loss_fn_inputs={"target_tokens": sparse_targets, "weights": (sparse_targets > 0).float() * 0.25}),
    ]
    request = types.ForwardBackwardRequest(forward_backward_input=types.ForwardBackwardInput(
        data=data, loss_fn="ppo", loss_fn_config={"clip_low_threshold": 0.7, "note": "v2 only"}), model_id="sess-1:train:0", seq_id=7)
    msg = request_conv.forward_backward_request_to_proto(request)
    msg.forward_only = True  # as the SDK's training resource sets it for forward()
    assert msg.data[1].loss_fn_inputs["target_tokens"].WhichOneof("encoding") == "sparse_csr"  # the SDK's automatic CSR

    decoded = decode_forward_backward(msg.SerializeToString())

    assert (decoded.model_id, decoded.seq_id, decoded.loss_fn, decoded.forward_only) == ("sess-1:train:0", 7, "ppo", True)
    assert decoded.loss_fn_config == {"clip_low_threshold": pytest.approx(0.7), "note": "v2 only"}
    first, second = decoded.data
    assert first.tokens == [1, 2, 3, 4, 5] and second.tokens == [9, 8, 7, 6, 5]
    assert first.inputs["target_tokens"].dtype == np.int64 and first.inputs["target_tokens"].tolist() == [2, 3, 4, 5, 6]
    assert first.inputs["weights"].dtype == np.float32 and first.inputs["weights"].tolist() == [0.0, 0.0, 1.0, 1.0, -1.5]
    assert first.inputs["advantages"].shape == (5,)
    assert np.array_equal(second.inputs["target_tokens"], sparse_targets.numpy())
    assert np.array_equal(second.inputs["weights"], ((sparse_targets > 0).float() * 0.25).numpy())

    image = types.Datum(model_input=types.ModelInput(chunks=[types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=4)]),
                        loss_fn_inputs={"target_tokens": [1, 2, 3, 4]})
    request = types.ForwardBackwardRequest(forward_backward_input=types.ForwardBackwardInput(data=[image], loss_fn="cross_entropy"), model_id="m", seq_id=1)
    with pytest.raises(PrimitiveError, match="image chunk"):
        decode_forward_backward(request_conv.forward_backward_request_to_proto(request).SerializeToString())
    with pytest.raises(PrimitiveError, match="not a ForwardBackwardRequest"):
        decode_forward_backward(b"\xff\xff\xff")


def test_results_encode_to_what_the_sdk_reads_back() -> None:
    per_datum = [np.array([-0.5, -1.25, -2.0], np.float32), np.array([-3.0], np.float32), np.arange(6, dtype=np.float32).reshape(3, 2) * -1]
    output = response_conv.deserialize_forward_backward_output(encode_forward_backward_output(per_datum, {"loss:sum": 4.75}))
    assert output.metrics == {"loss:sum": 4.75}
    assert [o["logprobs"].shape for o in output.loss_fn_outputs] == [[3], [1], [3, 2]]
    for sent, got in zip(per_datum, output.loss_fn_outputs, strict=True):
        assert np.array_equal(got["logprobs"].to_numpy(), sent)
    with pytest.raises(PrimitiveError, match="name:reduction"):
        encode_forward_backward_output(per_datum, {"loss": 1.0})

    body = encode_sample_response([([5, 6, 7], [-0.1, -0.2, -0.3], "stop"), ([8], [-1.5], "length")], prompt_logprobs=[None, -2.0, -3.5])
    response = response_conv.deserialize_sample_response(body)
    assert [(s.tokens, s.stop_reason) for s in response.sequences] == [([5, 6, 7], "stop"), ([8], "length")]
    assert response.sequences[0].logprobs == pytest.approx([-0.1, -0.2, -0.3])
    assert response.prompt_logprobs == [None, -2.0, -3.5]
    assert pb.SampleResponse.FromString(body).sequences[0].stop_reason == pb.STOP_REASON_STOP


# --- forward_backward and optim_step ---------------------------------------------------------------------------------


def test_cross_entropy_is_minus_the_weighted_sum_of_the_models_own_logprobs(base: Path) -> None:
    model = live(base)  # a fresh adapter (lora_B = 0) is the base itself
    reference = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    weights_a = [0.0, 0.0, 1.0, 1.0, 2.0, -0.5, 1.0, 0.25, 1.0]
    data = [sft(SEQ_A, weights_a), sft(SEQ_B)]  # two lengths: a padded batch

    logprobs, metrics, tokens = model.forward_backward(data, "cross_entropy")

    expected_loss = 0.0
    for datum, got in zip(data, logprobs, strict=True):
        with torch.no_grad():
            full = torch.log_softmax(reference(input_ids=torch.tensor([datum.tokens])).logits[0].float(), -1)
        expected = full.gather(-1, torch.tensor(datum.inputs["target_tokens"])[:, None])[:, 0].numpy()
        assert got.dtype == np.float32 and got.shape == datum.inputs["target_tokens"].shape
        np.testing.assert_allclose(got, expected, atol=2e-5)
        expected_loss -= float((expected * datum.inputs["weights"]).sum())
    assert metrics["loss:sum"] == pytest.approx(expected_loss, rel=1e-5)
    assert tokens == len(SEQ_A) - 1 + len(SEQ_B) - 1


def test_a_few_sft_steps_lower_the_loss_on_a_fixed_datum(base: Path) -> None:
    model = live(base)
    losses = []
    for _ in range(4):
        losses.append(model.forward_backward([sft(SEQ_A)], "cross_entropy")[1]["loss:sum"])
        metrics = model.optim_step(learning_rate=1e-2)
        assert metrics["grad_norm:mean"] > 0 and metrics["learning_rate:mean"] == 1e-2
    assert losses[-1] < losses[0] - 1.0, losses
    assert model.steps == 4


def test_grad_clip_norm_scales_the_gradient_to_that_global_norm(base: Path) -> None:
    clipped, unclipped = live(base), live(base)
    updates = []
    for model, clip in ((clipped, 1e-3), (unclipped, 0.0)):
        before = lora_weights(model)
        model.forward_backward([sft(SEQ_A)], "cross_entropy")
        # beta1 = beta2 = 0 and an eps far above the gradient: AdamW's update is lr * g / eps, linear in the gradient
        norm = model.optim_step(learning_rate=1.0, beta1=0.0, beta2=0.0, eps=1e3, grad_clip_norm=clip)["grad_norm:mean"]
        updates.append(torch.cat([(w - before[name]).flatten() for name, w in lora_weights(model).items()]).norm())
    assert float(updates[0] / updates[1]) == pytest.approx(1e-3 / norm, rel=1e-2)  # the norm reported is the one before clipping


def test_gradients_accumulate_over_forward_backward_calls_until_optim_step(base: Path) -> None:
    halves, whole = live(base), live(base)
    for model in (halves, whole):  # one identical step first, so that lora_A's gradients are not zero (lora_B starts at zero)
        model.forward_backward([sft(SEQ_B)], "cross_entropy")
        model.optim_step(learning_rate=1e-2)

    halves.forward_backward([sft(SEQ_A)], "cross_entropy")
    halves.forward_backward([sft(SEQ_B)], "cross_entropy")
    whole.forward_backward([sft(SEQ_A), sft(SEQ_B)], "cross_entropy")

    assert_same_grads(lora_grads(halves), lora_grads(whole))
    for model in (halves, whole):
        model.optim_step(learning_rate=1e-3, eps=1e-6)
        assert all(p.grad is None for p in model.peft_model.parameters())  # cleared by the step
    for name, weight in lora_weights(whole).items():
        torch.testing.assert_close(lora_weights(halves)[name], weight, rtol=0, atol=1e-5)


def test_output_layer_chunks_and_micro_batches_give_the_same_logprobs_and_gradients(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = [sft(SEQ_A), sft(SEQ_B), sft(SEQ_A[2:])]
    whole = live(base)
    expected_logprobs, expected_metrics, _ = whole.forward_backward(data, "cross_entropy")
    monkeypatch.setattr(primitives, "HEAD_CHUNK", 4)  # 9 positions: chunks of 4, 4, 1, recomputed in the backward pass
    monkeypatch.setattr(primitives, "MICROBATCH_TOKENS", 10)  # one datum per transformer pass
    chunked = live(base)

    logprobs, metrics, _ = chunked.forward_backward(data, "cross_entropy")

    for got, expected in zip(logprobs, expected_logprobs, strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert metrics["loss:sum"] == pytest.approx(expected_metrics["loss:sum"], rel=1e-5)
    assert_same_grads(lora_grads(chunked), lora_grads(whole))


def test_forward_only_computes_the_same_outputs_and_changes_nothing(base: Path) -> None:
    model = live(base)
    model.forward_backward([sft(SEQ_A)], "cross_entropy")
    model.optim_step(learning_rate=1e-2)
    before = lora_weights(model)

    logprobs, metrics, tokens = model.forward_backward([sft(SEQ_A)], "cross_entropy", forward_only=True)

    assert all(p.grad is None for p in model.peft_model.parameters())
    model.optim_step(learning_rate=1e-2)  # nothing accumulated: nothing moves
    assert all(torch.equal(before[name], weight) for name, weight in lora_weights(model).items())
    again, again_metrics, _ = model.forward_backward([sft(SEQ_A)], "cross_entropy")
    np.testing.assert_allclose(again[0], logprobs[0], atol=1e-6)
    assert again_metrics["loss:sum"] == pytest.approx(metrics["loss:sum"], rel=1e-6) and tokens == len(SEQ_A) - 1


def test_importance_sampling_on_its_own_samples_is_minus_the_advantages_and_raises_a_positive_advantage_sequence(base: Path) -> None:
    model = live(base)
    own = forward(model, sft(SEQ_A))[0]

    _, metrics, _ = model.forward_backward([rl(SEQ_A, own, advantages=1.0)], "importance_sampling")
    assert metrics["loss:sum"] == pytest.approx(-(len(SEQ_A) - 1), rel=1e-5)  # ratio 1: -sum(A)
    model.optim_step(learning_rate=1e-3)

    assert forward(model, sft(SEQ_A))[0].sum() > own.sum() + 0.01


def test_ppo_clips_the_ratio_at_its_thresholds(base: Path) -> None:
    model = live(base)
    own = forward(model, sft(SEQ_A))[0]
    n = len(own)

    def ppo(ratio: float, advantage: float, **config: float) -> tuple[float, bool]:
        """``(loss:sum, whether any gradient flowed)`` at a sampler whose probabilities are the model's over ``ratio``."""
        loss = model.forward_backward([rl(SEQ_A, own - math.log(ratio), advantage)], "ppo", config or None)[1]["loss:sum"]
        flowed = any(g.abs().max() > 0 for g in lora_grads(model).values())
        model.optim_step(learning_rate=0.0)  # clears the gradients; a zero rate moves nothing
        return loss, flowed

    assert ppo(2.0, 1.0) == (pytest.approx(-1.2 * n, rel=1e-5), False)  # above 1.2 with A > 0: clipped, no gradient
    assert ppo(2.0, -1.0) == (pytest.approx(2.0 * n, rel=1e-5), True)  # A < 0: the unclipped term is the minimum
    assert ppo(0.5, -1.0) == (pytest.approx(0.8 * n, rel=1e-5), False)  # below 0.8 with A < 0: clipped
    assert ppo(0.5, 1.0) == (pytest.approx(-0.5 * n, rel=1e-5), True)
    assert ppo(2.0, 1.0, clip_low_threshold=0.5, clip_high_threshold=3.0) == (pytest.approx(-2.0 * n, rel=1e-5), True)


def test_cispo_and_dro_follow_their_formulas(base: Path) -> None:
    model = live(base)
    own = forward(model, sft(SEQ_A))[0].astype(np.float64)

    cispo = model.forward_backward([rl(SEQ_A, own - math.log(8.0), 0.5)], "cispo", forward_only=True)[1]["loss:sum"]
    assert cispo == pytest.approx(-(4.0 * 0.5 * own).sum(), rel=1e-5)  # the weight 8 is clipped to 4
    dro = model.forward_backward([rl(SEQ_A, own - 1.0, 0.5)], "dro", {"beta": 0.1}, forward_only=True)[1]["loss:sum"]
    assert dro == pytest.approx(-(own * 0.5 - 0.5 * 0.1 * 1.0).sum(), rel=1e-5)


def test_negative_cross_entropy_weights_push_the_sequence_down(base: Path) -> None:
    model = live(base)
    own = forward(model, sft(SEQ_A))[0]

    _, metrics, _ = model.forward_backward([sft(SEQ_A, [-1.0] * (len(SEQ_A) - 1))], "cross_entropy")
    assert metrics["loss:sum"] == pytest.approx(float(own.sum()), rel=1e-5)
    model.optim_step(learning_rate=1e-3)

    assert forward(model, sft(SEQ_A))[0].sum() < own.sum() - 0.01


def test_bad_requests_are_refused_with_what_is_wrong_and_leave_the_gradients_alone(base: Path) -> None:
    model = live(base)
    own = forward(model, sft(SEQ_A))[0]
    targets = np.array(SEQ_A[1:], np.int64)
    cases = [
        ([sft(SEQ_A)], "gspo", None, "unsupported loss_fn 'gspo'"),
        ([Datum(SEQ_A[:-1], {"target_tokens": targets, "logprobs": own})], "ppo", None, r"ppo requires loss_fn_inputs\['advantages'\]"),
        ([Datum(SEQ_A[:-1], {"weights": np.ones(9, np.float32)})], "cross_entropy", None, r"requires loss_fn_inputs\['target_tokens'\]"),
        ([Datum(SEQ_A[:-2], {"target_tokens": targets})], "cross_entropy", None, "9 positions for 8 model_input tokens"),
        ([Datum(SEQ_A[:-1], {"target_tokens": targets, "weights": np.ones(4, np.float32)})], "cross_entropy", None, r"'weights'\] has shape \[4\]"),
        ([Datum(SEQ_A[:-1], {"target_tokens": targets, "mask": np.ones(9, np.float32)})], "cross_entropy", None, r"takes no loss_fn_inputs\['mask'\]"),
        ([rl(SEQ_A, own, 1.0)], "dro", None, r"dro requires loss_fn_config\['beta'\]"),
        ([rl(SEQ_A, own, 1.0)], "ppo", {"clip_ratio": 0.2}, r"takes no loss_fn_config\['clip_ratio'\]"),
        ([Datum(SEQ_A[:-1], {"target_tokens": np.stack([targets, targets], 1), "logprobs": own, "advantages": own})], "ppo", None, r"shape \[N\]"),
        ([Datum([1, 10**6], {"target_tokens": np.array([1, 2])})], "cross_entropy", None, "outside the vocabulary"),
        ([Datum([], {"target_tokens": np.array([], np.int64)})], "cross_entropy", None, "has no tokens"),
    ]
    model.forward_backward([sft(SEQ_B)], "cross_entropy")
    pending = lora_grads(model)
    for data, loss_fn, config, message in cases:
        with pytest.raises(PrimitiveError, match=message):
            model.forward_backward(data, loss_fn, config)
    assert all(torch.equal(pending[name], grad) for name, grad in lora_grads(model).items())
    with pytest.raises(PrimitiveError, match="beta1"):
        model.optim_step(beta1=1.0)


def test_cross_entropy_takes_top_k_targets(base: Path) -> None:
    model = live(base)
    own = forward(model, sft(SEQ_A))[0]
    targets = np.stack([np.array(SEQ_A[1:]), np.full(9, 5)], 1)  # [N, 2]: the real next token and token 5
    logprobs, metrics, _ = model.forward_backward([Datum(SEQ_A[:-1], {"target_tokens": targets, "weights": np.tile([1.0, 0.0], (9, 1)).astype(np.float32)})],
                                                  "cross_entropy")
    assert logprobs[0].shape == (9, 2)
    np.testing.assert_allclose(logprobs[0][:, 0], own, atol=1e-6)
    assert metrics["loss:sum"] == pytest.approx(-float(own.sum()), rel=1e-5)


# --- sampling --------------------------------------------------------------------------------------------------------


def test_samples_carry_the_models_own_logprobs_at_temperature_one(base: Path) -> None:
    model = live(base)
    model.forward_backward([sft(SEQ_A)], "cross_entropy")
    model.optim_step(learning_rate=1e-2)  # an adapter that is not zero, lm_head's included
    prompt = SEQ_A[:4]

    samples = model.sample(prompt, num_samples=3, max_tokens=6, temperature=1.0, stop=[], seed=7)

    assert len(samples) == 3 and all(len(s.tokens) == len(s.logprobs) == 6 and s.stop_reason == "length" for s in samples)
    for sample in samples:
        scored = model.prompt_logprobs(prompt + sample.tokens)
        assert scored[0] is None and len(scored) == len(prompt) + 6
        np.testing.assert_allclose(sample.logprobs, scored[len(prompt):], atol=1e-4)
    assert model.sample(prompt, num_samples=3, max_tokens=6, stop=[], seed=7) == samples  # a seed reproduces the draws
    cut = model.sample(prompt, num_samples=2, max_tokens=4, temperature=0.7, top_k=5, top_p=0.9, stop=[], seed=1)
    assert all(len(s.tokens) == 4 and max(s.logprobs) <= 0 for s in cut)


def test_a_sample_past_its_deadline_ends_where_it_is_with_reason_length(base: Path) -> None:
    """``primitives_sample_s``: a sample still decoding at its deadline is cut there (once, a 32 × 300 sample held the
    only train worker for minutes), its tokens so far kept and charged."""
    model = live(base)
    cut = model.sample(SEQ_A[:4], num_samples=3, max_tokens=50, temperature=1.0, stop=[], seed=3, deadline=time.monotonic())
    assert [(len(s.tokens), s.stop_reason) for s in cut] == [(1, "length")] * 3
    whole = model.sample(SEQ_A[:4], num_samples=3, max_tokens=50, temperature=1.0, stop=[], seed=3, deadline=time.monotonic() + 600)
    assert all(len(s.tokens) == 50 for s in whole) and [s.tokens[:1] for s in whole] == [s.tokens for s in cut]


def test_sampling_stops_at_a_stop_token_or_string(base: Path) -> None:
    model = live(base)
    prompt = SEQ_A[:4]
    greedy = model.sample(prompt, max_tokens=8, temperature=0, stop=[])[0].tokens
    assert len(greedy) == 8

    stop_id = greedy[3]
    expected = greedy[: greedy.index(stop_id) + 1]
    assert model.sample(prompt, max_tokens=8, temperature=0, stop=[stop_id])[0][::2] == (expected, "stop")

    tokenizer = model.tokenizer
    piece = next(tokenizer.decode([t]).strip() for t in greedy if len(tokenizer.decode([t]).strip()) >= 2)
    end = next(k for k in range(1, 9) if piece in tokenizer.decode(greedy[:k]))
    assert model.sample(prompt, max_tokens=8, temperature=0, stop=[piece])[0][::2] == (greedy[:end], "stop")
    assert model.sample(prompt, max_tokens=8, temperature=0, stop=None) == model.sample(prompt, max_tokens=8, temperature=0, stop=sorted(model.eos_token_ids))
    with pytest.raises(PrimitiveError, match="not a mix"):
        model.sample(prompt, max_tokens=2, stop=["a", 3])  # type: ignore[list-item]


# --- checkpoints -----------------------------------------------------------------------------------------------------


def test_a_saved_adapter_loads_with_peft_and_the_inference_engine_to_the_same_logits(base: Path, tmp_path: Path) -> None:
    from inference_service.engines.adapters import LoadedModels
    from inference_service.engines.base import Adapter
    from peft import PeftModel

    model = live(base)
    model.forward_backward([sft(SEQ_A)], "cross_entropy")
    model.optim_step(learning_rate=1e-2)
    folder = model.save_adapter(tmp_path / "step-1")

    assert {"adapter_model.safetensors", "adapter_config.json"} <= {p.name for p in folder.iterdir()}
    saved = load_file(folder / "adapter_model.safetensors")
    assert saved and all("lora_" in key for key in saved)  # LoRA weights only: no copy of the base's lm_head
    assert any("lm_head.lora_B" in key for key in saved)
    expected = torch.tensor(forward(model, sft(SEQ_A))[0])
    input_ids = torch.tensor([SEQ_A[:-1]])
    targets = torch.tensor(SEQ_A[1:])[:, None]

    def logprobs(causal_lm: object) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(causal_lm(input_ids=input_ids).logits[0].float(), -1).gather(-1, targets)[:, 0]  # type: ignore[operator]

    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), folder).eval()
    torch.testing.assert_close(logprobs(peft), expected, rtol=0, atol=1e-5)
    served = LoadedModels(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval(), max_loaded_adapters=1, max_loaded_full_checkpoints=1)
    with served.serving(Adapter(name="ckpt-1", path=folder)) as engine_model:
        torch.testing.assert_close(logprobs(engine_model), expected, rtol=0, atol=1e-5)


def test_save_state_then_load_state_with_the_optimizer_resumes_to_the_same_next_step(base: Path, tmp_path: Path) -> None:
    original = live(base, seed=0)
    for seq in (SEQ_A, SEQ_B):
        original.forward_backward([sft(seq)], "cross_entropy")
        original.optim_step(learning_rate=1e-2, weight_decay=0.01)
    folder = original.save_state(tmp_path / "state")
    assert (folder / OPTIMIZER_FILE).is_file()

    def next_step(model: LiveModel) -> dict[str, torch.Tensor]:
        model.forward_backward([sft(SEQ_A)], "cross_entropy")
        model.optim_step(learning_rate=1e-2, weight_decay=0.01)
        return lora_weights(model)

    resumed = live(base, seed=1)  # another initialization: everything comes from the folder
    resumed.load_state(folder, optimizer=True)
    assert resumed.steps == 2
    created = LiveModel.from_state(base, folder, optimizer=True, device=CPU)
    fresh_optimizer = live(base, seed=1)
    fresh_optimizer.load_state(folder, optimizer=False)
    expected = next_step(original)
    for model in (resumed, created):
        got = next_step(model)
        assert all(torch.equal(got[name], weight) for name, weight in expected.items())
    got = next_step(fresh_optimizer)
    assert not all(torch.equal(got[name], weight) for name, weight in expected.items())  # Adam's moments were not restored

    with pytest.raises(PrimitiveError, match="rank-4 adapter"):
        LiveModel(base, rank=2, seed=0, device=CPU).load_state(folder, optimizer=False)
    adapter_only = original.save_adapter(tmp_path / "adapter")
    with pytest.raises(PrimitiveError, match="no optimizer state"):
        resumed.load_state(adapter_only, optimizer=True)

"""Tinker's training primitives (the ``tinker`` SDK's API, Thinking Machines) computed on one live LoRA model held in
memory: the compute a server of that API runs for ``forward_backward``, ``forward``, ``optim_step``, ``sample``,
``compute_logprobs``, ``save_state``, ``save_weights_for_sampler`` and ``load_state``. Pure compute: no database, no
HTTP, no metering (each call returns the token counts a caller bills).

Two parts:

- the wire codec (``tinker.proto.tinker_public_pb2``, the SDK's own protobuf schema): :func:`decode_forward_backward`
  reads a ``ForwardBackwardRequest`` body into a :class:`ForwardBackward` of :class:`Datum`; :func:`encode_forward_backward_output`
  and :func:`encode_sample_response` write the ``ForwardBackwardOutput`` and ``SampleResponse`` result bodies the SDK
  deserializes (``tinker.proto.response_conv``). Every other message of the API is JSON and not this module's;
- :class:`LiveModel`: a Crucible base model with a PEFT LoRA adapter placed as Tinker's ``LoraConfig`` says
  (``train_attn``: q, k, v, o projections; ``train_mlp``: gate, up, down; ``train_unembed``: LoRA on ``lm_head``, see
  :func:`lora_target_modules`), AdamW over the adapter, and the losses of Tinker's loss docs (:data:`LOSSES`).

Tinker's semantics kept (tinker-docs.thinkingmachines.ai, "Losses"; the SDK 0.38.0): position ``i`` of a datum's
tokens predicts ``target_tokens[i]`` (so ``len(target_tokens) == len(tokens)``); every loss is a **sum** over tokens
and data, never a mean; gradients **accumulate** over ``forward_backward`` calls until ``optim_step`` applies and
clears them; ``forward`` (``forward_only``) computes the same outputs and no gradient; each datum's output is its
target log-probabilities ``log p(target_tokens[i] | tokens[:i+1])``, shaped as ``target_tokens``; metric keys are
``name:reduction`` (``loss:sum`` always).

Where this differs from, or decides what Tinker leaves open (each also where it applies):

- ``lm_head`` LoRA (``train_unembed``) is a LoRA layer on the output projection, not ``modules_to_save`` (a full copy
  of a vocabulary-sized matrix). On a base whose embeddings are tied to ``lm_head`` (SmolLM2, Qwen3 small models),
  serving the adapter with PEFT is exact, but *merging* it (``merge_and_unload``: a full-weight child of a LoRA parent,
  :func:`~trainer_service.policy.load_model`) adds the ``lm_head`` update to the shared matrix, so it changes the
  input embeddings too (PEFT issue 2777). LoRA alpha is :data:`LORA_ALPHA` for every rank (Tinker's convention, as in
  Thinking Machines' "LoRA Without Regret"); no LoRA dropout.
- An input or ``loss_fn_config`` key the loss does not take is refused (a misspelt key would otherwise be silently
  unused); the RL losses accept ``weights`` and ignore it, as the loss docs' formulas do.
- ``dro`` requires ``beta`` (the docs give no default); ``cispo``'s clip defaults are the cookbook's (0.0, 4.0).
- Sampled log-probabilities are ``log_softmax(logits / temperature)`` at the sampled token: the distribution the
  temperature defines, before ``top_k``/``top_p`` truncation (so at temperature 1 they are the model's own and match
  :meth:`LiveModel.prompt_logprobs`); temperature 0 is greedy and reports the model's temperature-1 log-probabilities.
- An ``optim_step`` whose gradient norm is not finite is refused and its gradients discarded (weights untouched).
- ``gspo``, ``stable_reinforce`` and ``custom`` (server-side custom losses) are refused: the SDK's
  ``forward_backward_custom`` needs only ``cross_entropy`` with real-valued weights, which is here.

Invariants: a :class:`LiveModel` is not thread-safe; its caller runs one model's requests one at a time in ``seq_id``
order. Memory per ``forward_backward`` is bounded by micro-batches of :data:`MICROBATCH_TOKENS` padded tokens (each
backpropagated before the next: the sum loss makes that exact) and by output-layer chunks of :data:`HEAD_CHUNK`
positions (recomputed in the backward pass, so no ``[tokens, vocab]`` logits are kept).
"""

from __future__ import annotations

import json
import math
import shutil
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from trainer_service import estimate
from trainer_service.config import TrainConfig
from trainer_service.devices import Device, select_device
from trainer_service.policy import load_model

LORA_ALPHA = 32
"""LoRA alpha of every adapter (scale ``alpha / rank``), whatever the rank."""

ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
UNEMBED_MODULES = ("lm_head",)

MICROBATCH_TOKENS = 8192
"""Padded tokens (rows x longest row) per transformer pass of a ``forward_backward``; a longer datum runs alone."""

MAX_SPARSE_ELEMENTS = 1 << 26
"""Largest dense size (rows x columns) a sparse CSR input may declare: its zeros are materialized."""

HEAD_CHUNK = 1024
"""Positions per output-layer pass: at most ``[HEAD_CHUNK, vocab]`` float32 logits exist at a time."""

TIED_LM_HEAD_WARNING = r".*tie_word_embeddings=True.*ensure_weight_tying"
"""PEFT's warning for LoRA on a tied ``lm_head``, silenced where an adapter is built: the case is the one the module
docstring states (exact served, not merged)."""

OPTIMIZER_FILE = "optimizer_state.pt"
"""File of a :meth:`LiveModel.save_state` folder beside the adapter: the AdamW state, the steps taken and the names
of the parameters it is over."""


class PrimitiveError(ValueError):
    """A request the primitives cannot compute, said in words a user can act on (the failed future's ``error``, category
    ``user``): an unsupported loss or chunk, a missing or misshapen input, an out-of-range token or hyper-parameter, a
    checkpoint of another LoRA shape."""


# --- the wire codec -------------------------------------------------------------------------------------------------


@dataclass
class Datum:
    """One datum of a ``forward_backward``: its input ``tokens`` (the concatenated text chunks of its ``model_input``)
    and its ``loss_fn_inputs`` decoded to dense numpy arrays of their declared dtype and shape (``target_tokens``
    ``[N]`` or ``[N, K]`` int64; ``weights``, ``logprobs``, ``advantages`` ``[N]`` float32)."""

    tokens: list[int]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class ForwardBackward:
    """A decoded ``ForwardBackwardRequest``: the model and its request's place in that model's order (``seq_id``), the
    loss and its config (``loss_fn_config_v2``'s numbers and texts over the legacy numeric map), whether it is a
    ``forward`` (``forward_only``: no gradient) and the data."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[Datum]


def _pb() -> Any:
    """The SDK's protobuf module (imported on first use: importing ``tinker`` takes seconds)."""
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


def _frombuffer(buffer: bytes, dtype: int, what: str) -> np.ndarray:
    """The values of ``buffer`` (little-endian, proto ``DType`` ``dtype``) as a 1-D array: float32, int64, int32, or
    bfloat16 widened to float32. Raises :class:`PrimitiveError` for an unknown dtype or a ragged buffer."""
    pb = _pb()
    numpy_dtype = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32, pb.DTYPE_BFLOAT16: np.uint16}.get(dtype)
    if numpy_dtype is None:
        raise PrimitiveError(f"{what}: unsupported dtype {pb.DType.Name(dtype) if dtype in pb.DType.values() else dtype}")
    try:
        values = np.frombuffer(buffer, dtype=np.dtype(numpy_dtype).newbyteorder("<")).astype(numpy_dtype)
    except ValueError as e:
        raise PrimitiveError(f"{what}: {len(buffer)} bytes are not a whole number of {np.dtype(numpy_dtype).name} values") from e
    if dtype == pb.DTYPE_BFLOAT16:
        values = (values.astype(np.uint32) << 16).view(np.float32)
    return values


def _decode_tensor(msg: Any, what: str) -> np.ndarray:
    """A proto ``Tensor`` as a dense array of its dtype and shape: ``dense`` bytes reshaped (an empty shape is 1-D), or
    ``sparse_csr`` (2-D; the unlisted entries 0, as the SDK's ``TensorData.to_numpy`` densifies them). Raises
    :class:`PrimitiveError` for values that do not fill the shape or CSR indices that do not describe it."""
    shape = [int(s) for s in msg.shape]
    if any(s < 0 for s in shape):
        raise PrimitiveError(f"{what}: negative shape {shape}")
    if msg.WhichOneof("encoding") == "sparse_csr":
        csr = msg.sparse_csr
        values = _frombuffer(csr.values, msg.dtype, what)
        crow = _frombuffer(csr.crow_indices, _pb().DTYPE_INT64, f"{what} crow_indices")
        col = _frombuffer(csr.col_indices, _pb().DTYPE_INT64, f"{what} col_indices")
        if len(shape) != 2:
            raise PrimitiveError(f"{what}: a sparse CSR tensor is 2-D, its shape is {shape}")
        rows, cols = shape
        if rows * cols > MAX_SPARSE_ELEMENTS:
            raise PrimitiveError(f"{what}: a {rows}x{cols} sparse tensor is larger than the {MAX_SPARSE_ELEMENTS} entries an input may have")
        if (len(crow) != rows + 1 or crow[0] != 0 or crow[-1] != len(values) or len(col) != len(values) or np.any(np.diff(crow) < 0)
                or np.any((col < 0) | (col >= cols))):
            raise PrimitiveError(f"{what}: its sparse CSR indices do not describe a {rows}x{cols} tensor of {len(values)} values")
        dense = np.zeros(shape, dtype=values.dtype)
        dense[np.repeat(np.arange(rows), np.diff(crow)), col] = values
        return dense
    values = _frombuffer(msg.dense, msg.dtype, what)
    if not shape:
        return values
    if math.prod(shape) != values.size:
        raise PrimitiveError(f"{what}: {values.size} values do not fill shape {shape}")
    return values.reshape(shape)


def _decode_datum(index: int, msg: Any) -> Datum:
    """Datum ``index`` of a request: its text chunks' tokens concatenated and its inputs densified. Raises
    :class:`PrimitiveError` for an image or audio (``dmel``) chunk."""
    tokens: list[int] = []
    for chunk in msg.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise PrimitiveError(f"datum {index}: its model_input has a {kind or 'empty'} chunk; this server trains text models "
                                 "(encoded_text chunks only)")
        tokens += _frombuffer(chunk.encoded_text.tokens, _pb().DTYPE_INT32, f"datum {index}: model_input tokens").tolist()
    inputs = {name: _decode_tensor(tensor, f"datum {index}: loss_fn_inputs['{name}']") for name, tensor in msg.loss_fn_inputs.items()}
    return Datum(tokens=tokens, inputs=inputs)


def decode_forward_backward(body: bytes) -> ForwardBackward:
    """Decode a ``POST /api/v1/forward_backward`` body (protobuf ``tinker_public.ForwardBackwardRequest``, as the SDK's
    ``request_conv`` writes it; a ``Content-Encoding: zstd`` body decompressed first). Raises :class:`PrimitiveError`
    for bytes that are not that message, non-text chunks and tensors whose values do not fill their shape."""
    from google.protobuf.message import DecodeError

    msg = _pb().ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as e:
        raise PrimitiveError(f"the body is not a ForwardBackwardRequest protobuf: {e}") from e
    config: dict[str, float | str] = {key: float(value) for key, value in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():
        kind = value.WhichOneof("value")
        if kind is not None:
            config[key] = float(value.number) if kind == "number" else value.text
    return ForwardBackward(model_id=msg.model_id, seq_id=msg.seq_id, loss_fn=msg.loss_fn, loss_fn_config=config, forward_only=msg.forward_only,
                           data=[_decode_datum(i, datum) for i, datum in enumerate(msg.data)])


def encode_forward_backward_output(logprobs: Sequence[np.ndarray], metrics: Mapping[str, float]) -> bytes:
    """The result body of a ``forward_backward``/``forward`` (protobuf ``ForwardBackwardOutput``): each datum's output
    ``logprobs`` (``[N]``, or ``[N, K]`` for 2-D targets) as float32 in one ``ArrayRecord`` per run of consecutive data
    with the same trailing shape (``BatchedTensor``: the arrays concatenated, int64 byte offsets, ``trailing_shape``
    ``[]`` or ``[K]``), and ``metrics`` (keys ``name:reduction``). Raises :class:`PrimitiveError` for a metric key
    without exactly one ``:`` (the SDK cannot merge it) or a 0-D array."""
    pb = _pb()
    for key in metrics:
        if key.count(":") != 1:
            raise PrimitiveError(f"metric {key!r} is not 'name:reduction'")
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    arrays = [np.ascontiguousarray(np.asarray(a, dtype=np.float32)) for a in logprobs]
    if any(a.ndim == 0 for a in arrays):
        raise PrimitiveError("a datum's logprobs is a scalar, not an array of its positions")
    start = 0
    while start < len(arrays):
        trailing = arrays[start].shape[1:]
        end = start
        while end < len(arrays) and arrays[end].shape[1:] == trailing:
            end += 1
        run = arrays[start:end]
        offsets = np.cumsum([0] + [a.nbytes for a in run]).astype("<i8")
        record = out.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(run))
        record.fields["logprobs"].CopyFrom(pb.BatchedTensor(data=b"".join(a.astype("<f4").tobytes() for a in run), offsets=offsets.tobytes(),
                                                            dtype=pb.DTYPE_FLOAT32, trailing_shape=list(trailing)))
        start = end
    for key, value in metrics.items():
        out.metrics[key] = float(value)
    return out.SerializeToString()


class SampledSequence(NamedTuple):
    """One sample: its generated ``tokens`` (with the stop token that ended it, if one did), each token's log-probability
    under the sampling distribution (see :meth:`LiveModel.sample`) and why it ended: ``stop`` (a stop token or string,
    or the end-of-sequence token) or ``length`` (``max_tokens``)."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str


def encode_sample_response(sequences: Sequence[tuple[Sequence[int], Sequence[float], str]],
                           prompt_logprobs: Sequence[float | None] | None = None) -> bytes:
    """The result body of a ``sample``/``compute_logprobs`` (protobuf ``SampleResponse``): per sequence its tokens
    (int32), their logprobs (float32) and stop reason (``stop`` or ``length``); ``prompt_logprobs`` (one per prompt
    token, ``None`` where not computed: position 0) as float32 with NaN for ``None``, which the SDK reads back as
    ``None``. Raises :class:`PrimitiveError` for another stop reason or logprobs not one per token."""
    pb = _pb()
    reasons = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}
    out = pb.SampleResponse()
    for tokens, logprobs, stop_reason in sequences:
        if stop_reason not in reasons:
            raise PrimitiveError(f"stop reason {stop_reason!r} is not 'stop' or 'length'")
        if len(logprobs) != len(tokens):
            raise PrimitiveError(f"{len(logprobs)} logprobs for {len(tokens)} sampled tokens")
        out.sequences.add(stop_reason=reasons[stop_reason], tokens=np.asarray(tokens, dtype="<i4").tobytes(),
                          logprobs=np.asarray(logprobs, dtype="<f4").tobytes())
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray([math.nan if x is None else x for x in prompt_logprobs], dtype="<f4").tobytes()
    return out.SerializeToString()


# --- the losses -----------------------------------------------------------------------------------------------------

Inputs = dict[str, torch.Tensor]


def _cross_entropy(lp: torch.Tensor, x: Inputs, c: dict[str, float]) -> torch.Tensor:
    """``-sum(weights * lp)`` (Tinker's loss docs, "cross_entropy"); ``weights`` default to 1 and may be any real number
    (negative ones push a token's probability down: the SDK's ``forward_backward_custom`` sends ``-dC/dlp`` as weights).
    With ``[N, K]`` targets (top-K distillation) ``lp`` is ``[N, K]`` and the sum runs over both axes."""
    weights = x.get("weights")
    return -(lp if weights is None else lp * weights).sum()


def _ratio(lp: torch.Tensor, x: Inputs) -> torch.Tensor:
    """``exp(lp - sampler_lp)``: the probability ratio of the policy now to the sampler's."""
    return torch.exp(lp - x["logprobs"])


def _importance_sampling(lp: torch.Tensor, x: Inputs, c: dict[str, float]) -> torch.Tensor:
    """``-sum(exp(lp - sampler_lp) * A)``: the policy gradient with importance weights for off-policy samples (Tinker's
    loss docs, "importance_sampling"); with ``sampler_lp == lp`` its gradient is REINFORCE's ``-sum(A * grad lp)``."""
    return -(_ratio(lp, x) * x["advantages"]).sum()


def _ppo(lp: torch.Tensor, x: Inputs, c: dict[str, float]) -> torch.Tensor:
    """``-sum(min(r * A, clip(r, low, high) * A))``, ``r = exp(lp - sampler_lp)``, token-wise: PPO's clipped surrogate
    (Schulman et al. 2017, "Proximal Policy Optimization Algorithms", eq. 7, with Tinker's asymmetric thresholds
    ``clip_low_threshold`` = 1 - eps_low, ``clip_high_threshold`` = 1 + eps_high; defaults 0.8, 1.2)."""
    ratio, advantages = _ratio(lp, x), x["advantages"]
    clipped = ratio.clamp(c["clip_low_threshold"], c["clip_high_threshold"])
    return -torch.minimum(ratio * advantages, clipped * advantages).sum()


def _cispo(lp: torch.Tensor, x: Inputs, c: dict[str, float]) -> torch.Tensor:
    """``-sum(sg(clip(r, low, high)) * A * lp)``: CISPO, which clips the importance-sampling weight (no gradient through
    it) instead of the update, so every token keeps its gradient (MiniMax 2025, "MiniMax-M1", §3.1; Tinker's loss docs;
    thresholds ``clip_low_threshold``/``clip_high_threshold``, defaults 0.0 and 4.0 as in Tinker's cookbook)."""
    weight = _ratio(lp, x).detach().clamp(c["clip_low_threshold"], c["clip_high_threshold"])
    return -(weight * x["advantages"] * lp).sum()


def _dro(lp: torch.Tensor, x: Inputs, c: dict[str, float]) -> torch.Tensor:
    """``-sum(lp * A - beta / 2 * (lp - sampler_lp)^2)``: Direct Reward Optimization's regularised policy objective,
    token-wise with the sampler as the reference (Richemond et al. 2024, "Offline Regularised Reinforcement Learning
    for Large Language Models Alignment"; the form in Tinker's loss docs, "dro"); ``beta`` has no default."""
    return -(lp * x["advantages"] - 0.5 * c["beta"] * (lp - x["logprobs"]) ** 2).sum()


@dataclass(frozen=True)
class Loss:
    """A loss of Tinker's ``forward_backward``: its ``name``, the ``loss_fn_inputs`` it requires beside
    ``target_tokens`` (each shaped like it) and those it accepts (``optional``; ``ignored`` ones are accepted and not
    read), its ``loss_fn_config`` keys with their defaults (``None``: required), whether it takes ``[N, K]`` targets,
    and ``compute(lp, inputs, config)``, one datum's loss (a scalar) from its target log-probabilities."""

    name: str
    compute: Callable[[torch.Tensor, Inputs, dict[str, float]], torch.Tensor]
    inputs: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    config: Mapping[str, float | None] = field(default_factory=dict)
    two_dimensional: bool = False

    def resolve(self, given: Mapping[str, float | str] | None) -> dict[str, float]:
        """The config this call runs with: ``given`` over the defaults. Raises :class:`PrimitiveError` for a key the
        loss does not take, a required key missing or a value that is not a finite number."""
        given = dict(given or {})
        unknown = sorted(set(given) - set(self.config))
        if unknown:
            takes = ", ".join(self.config) or "none"
            raise PrimitiveError(f"{self.name} takes no loss_fn_config['{unknown[0]}'] (it takes: {takes})")
        values = {}
        for key, default in self.config.items():
            value = given.get(key, default)
            if value is None:
                raise PrimitiveError(f"{self.name} requires loss_fn_config['{key}']")
            if isinstance(value, str | bool) or not math.isfinite(value):
                raise PrimitiveError(f"{self.name}'s loss_fn_config['{key}'] must be a finite number, not {value!r}")
            values[key] = float(value)
        return values


LOSSES: dict[str, Loss] = {loss.name: loss for loss in (
    Loss("cross_entropy", _cross_entropy, optional=("weights",), two_dimensional=True),
    Loss("importance_sampling", _importance_sampling, inputs=("logprobs", "advantages"), ignored=("weights",)),
    Loss("ppo", _ppo, inputs=("logprobs", "advantages"), ignored=("weights",), config={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    Loss("cispo", _cispo, inputs=("logprobs", "advantages"), ignored=("weights",), config={"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}),
    Loss("dro", _dro, inputs=("logprobs", "advantages"), ignored=("weights",), config={"beta": None}),
)}
"""The losses ``forward_backward`` computes, by Tinker's ``loss_fn`` name."""


def _checked_inputs(loss: Loss, index: int, datum: Datum, vocab_size: int, device: torch.device) -> Inputs:
    """Datum ``index``'s inputs as tensors on ``device`` (``target_tokens`` int64, the rest float32), after checking them
    against ``loss``. Raises :class:`PrimitiveError` for no tokens, a token or target outside the vocabulary, a missing
    or unknown input, targets that are not one per token (``[N]``, or ``[N, K]`` where the loss takes it) and other
    inputs not shaped like the targets."""
    where = f"datum {index}"
    if not datum.tokens:
        raise PrimitiveError(f"{where} has no tokens")
    if min(datum.tokens) < 0 or max(datum.tokens) >= vocab_size:
        raise PrimitiveError(f"{where}: a model_input token is outside the vocabulary [0, {vocab_size})")
    for name in ("target_tokens", *loss.inputs):
        if name not in datum.inputs:
            raise PrimitiveError(f"{loss.name} requires loss_fn_inputs['{name}'] ({where})")
    accepted = {"target_tokens", *loss.inputs, *loss.optional, *loss.ignored}
    unknown = sorted(set(datum.inputs) - accepted)
    if unknown:
        raise PrimitiveError(f"{loss.name} takes no loss_fn_inputs['{unknown[0]}'] ({where}; it takes: {', '.join(sorted(accepted))})")
    targets = datum.inputs["target_tokens"]
    if targets.dtype.kind not in "iu":
        raise PrimitiveError(f"{where}: loss_fn_inputs['target_tokens'] must be integers (int64), not {targets.dtype}")
    if targets.ndim not in ((1, 2) if loss.two_dimensional else (1,)):
        dims = "[N] or [N, K]" if loss.two_dimensional else "[N]"
        raise PrimitiveError(f"{where}: {loss.name} takes target_tokens of shape {dims}, not {list(targets.shape)}")
    if targets.shape[0] != len(datum.tokens):
        raise PrimitiveError(f"{where}: loss_fn_inputs['target_tokens'] has {targets.shape[0]} positions for {len(datum.tokens)} model_input tokens "
                             "(position i predicts target i)")
    if targets.size and (targets.min() < 0 or targets.max() >= vocab_size):
        raise PrimitiveError(f"{where}: a target token is outside the vocabulary [0, {vocab_size})")
    tensors = {"target_tokens": torch.as_tensor(targets.astype(np.int64), device=device)}
    for name in sorted(set(datum.inputs) - {"target_tokens"} - set(loss.ignored)):
        value = datum.inputs[name]
        if value.shape != targets.shape:
            raise PrimitiveError(f"{where}: loss_fn_inputs['{name}'] has shape {list(value.shape)}, target_tokens {list(targets.shape)}")
        tensors[name] = torch.as_tensor(value.astype(np.float32), device=device)
    return tensors


def lora_target_modules(train_attn: bool, train_mlp: bool, train_unembed: bool) -> list[str]:
    """The modules Tinker's ``LoraConfig`` switches put LoRA on: the attention projections (``train_attn``), the MLP's
    (``train_mlp``; dense MLPs: Crucible's base models are not mixtures of experts) and the output layer
    (``train_unembed``: LoRA on ``lm_head``). Raises :class:`PrimitiveError` when all three are off."""
    modules = [*(ATTN_MODULES if train_attn else ()), *(MLP_MODULES if train_mlp else ()), *(UNEMBED_MODULES if train_unembed else ())]
    if not modules:
        raise PrimitiveError("train_attn, train_mlp and train_unembed are all false: the adapter would train nothing")
    return modules


# --- the live model -------------------------------------------------------------------------------------------------


def _atomic_folder(folder: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write`` on a hidden sibling ``.<name>.tmp`` of ``folder`` and rename it into place, so ``folder`` is
    complete or absent (the trainer's checkpoints are written the same way)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


class LiveModel:
    """A base model with a trainable LoRA adapter and its AdamW state, held in memory for Tinker's primitives.

    ``LiveModel(base_dir, rank=…, seed=…, train_attn=…, train_mlp=…, train_unembed=…)`` is ``create_lora_training_client``
    (Tinker's defaults: rank 32, all three on): the base from a prepared Crucible base-model folder, loaded as a LoRA
    training job loads it (:func:`~trainer_service.policy.load_model`: float32 on CPU, a bf16 base with float32 adapter
    under autocast on CUDA), a fresh adapter (``lora_B`` zero, so the model starts as the base; ``lora_A`` drawn from
    ``seed``, or at random without one, leaving the process's RNG as it was). :meth:`from_state` is
    ``create_training_client_from_state``. ``device``: where it computes (default: the trainer's
    :func:`~trainer_service.devices.select_device`).
    """

    def __init__(self, base_dir: Path, *, rank: int = 32, seed: int | None = None, train_attn: bool = True, train_mlp: bool = True,
                 train_unembed: bool = True, device: Device | None = None) -> None:
        if not 1 <= rank <= 1024:
            raise PrimitiveError(f"LoRA rank {rank} is outside [1, 1024]")
        config = TrainConfig(adapter="lora", lora_r=rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                             target_modules=lora_target_modules(train_attn, train_mlp, train_unembed))
        device = device or select_device(config)
        with torch.random.fork_rng(devices=[device.torch_device.index or 0] if device.is_cuda else []), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=TIED_LM_HEAD_WARNING, category=UserWarning)
            if seed is None:
                torch.seed()
            else:
                torch.manual_seed(seed)
            model = load_model(Path(base_dir), config, device)
        self._attach(Path(base_dir), model, device)

    @classmethod
    def from_state(cls, base_dir: Path, folder: Path, *, optimizer: bool, device: Device | None = None) -> LiveModel:
        """A live model whose adapter is the one in ``folder`` (any Crucible LoRA checkpoint of this base, with its own
        rank and modules: one written by :meth:`save_state` or :meth:`save_adapter`, or by a training job), and with
        ``optimizer`` its AdamW state and step count too (:meth:`save_state` folders only). Raises
        :class:`PrimitiveError` for a folder without an adapter, or without optimizer state when ``optimizer``."""
        folder = Path(folder)
        if not (folder / "adapter_config.json").is_file():
            raise PrimitiveError(f"{folder.name} holds no LoRA adapter (adapter_config.json)")
        optimizer_state = _read_optimizer_state(folder) if optimizer else None
        live = cls.__new__(cls)
        config = TrainConfig(adapter="lora")
        device = device or select_device(config)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=TIED_LM_HEAD_WARNING, category=UserWarning)
            model = load_model(Path(base_dir), config, device, resume=folder)
        live._attach(Path(base_dir), model, device)
        if optimizer_state is not None:
            live._check_optimizer_state(optimizer_state, folder)
            live._restore_optimizer(optimizer_state)
        return live

    def _attach(self, base_dir: Path, model: Any, device: Device) -> None:
        """Hold ``model`` (a PEFT model) for the primitives: evaluation mode (no dropout anywhere), a fresh AdamW over its
        trainable parameters, the LoRA shape its config says."""
        model.eval()
        self.base_dir = base_dir
        self.device = device
        self._model = model
        self._causal_lm = model.get_base_model()
        self._named_params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self._params = [p for _, p in self._named_params]
        lora = model.peft_config["default"]
        self.rank: int = int(lora.r)
        self.target_modules: list[str] = sorted(lora.target_modules) if not isinstance(lora.target_modules, str) else [lora.target_modules]
        self.vocab_size: int = int(self._causal_lm.get_input_embeddings().num_embeddings)
        self.steps = 0
        self._optimizer = self._new_optimizer()
        self._tokenizer: Any = None

    def _new_optimizer(self) -> torch.optim.Optimizer:
        """AdamW over the adapter (fused on CUDA, as the trainer's); its hyper-parameters are set by each :meth:`optim_step`."""
        return torch.optim.AdamW(self._params, lr=0.0, fused=self.device.is_cuda)

    @property
    def peft_model(self) -> Any:
        """The PEFT model (the base with its adapter ``default``), for reading; train it through the primitives only."""
        return self._model

    @property
    def has_pending_gradients(self) -> bool:
        """Whether a ``forward_backward`` left gradients that no ``optim_step`` has applied yet (they live in memory
        only: :meth:`save_state` does not write them, as Tinker's ``save_state`` does not)."""
        return any(p.grad is not None for p in self._params)

    @property
    def trainable_parameters(self) -> int:
        """Parameters of the adapter (what ``optim_step`` updates)."""
        return sum(p.numel() for p in self._params)

    @property
    def tokenizer(self) -> Any:
        """The base model's tokenizer (loaded on first use: stop strings)."""
        if self._tokenizer is None:
            self._tokenizer = estimate.load_tokenizer(self.base_dir)
        return self._tokenizer

    @property
    def eos_token_ids(self) -> set[int]:
        """The end-of-sequence tokens sampling stops at when a request names no stop (the generation config's)."""
        eos = self._causal_lm.generation_config.eos_token_id
        if eos is None:
            eos = self._causal_lm.config.eos_token_id
        return set(eos if isinstance(eos, list) else [] if eos is None else [eos])

    @property
    def context_tokens(self) -> int:
        """The model's context window in tokens (prompt plus sampled)."""
        return int(self._causal_lm.config.max_position_embeddings)

    # forward_backward

    def _microbatches(self, data: Sequence[Datum]) -> Iterator[list[int]]:
        """Indices of ``data`` in order, cut into runs whose padded size (rows x longest) stays within
        :data:`MICROBATCH_TOKENS` (a longer datum alone)."""
        run: list[int] = []
        longest = 0
        for i, datum in enumerate(data):
            if run and (len(run) + 1) * max(longest, len(datum.tokens)) > MICROBATCH_TOKENS:
                yield run
                run, longest = [], 0
            run.append(i)
            longest = max(longest, len(datum.tokens))
        if run:
            yield run

    def _target_logprobs(self, tokens: list[list[int]], targets: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per row ``log p(targets[b][i] | tokens[b][:i+1])``, shaped as ``targets[b]`` (``[N]`` or ``[N, K]``), float32:
        one transformer pass over the right-padded rows, then the output layer (LoRA included) and log-softmax over
        :data:`HEAD_CHUNK` positions at a time; with gradients, each chunk is recomputed in the backward pass
        (activation checkpointing) instead of keeping its ``[chunk, vocab]`` logits."""
        from torch.utils.checkpoint import checkpoint

        device = self.device.torch_device
        longest = max(len(t) for t in tokens)
        input_ids = torch.zeros(len(tokens), longest, dtype=torch.long, device=device)
        attention_mask = torch.zeros_like(input_ids)
        for b, row in enumerate(tokens):
            input_ids[b, : len(row)] = torch.tensor(row, device=device)
            attention_mask[b, : len(row)] = 1
        hidden = self._causal_lm.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        head = self._causal_lm.get_output_embeddings()

        def chunk_logprobs(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return torch.log_softmax(head(h).float(), -1).gather(-1, t)

        out = []
        for b, row in enumerate(tokens):
            row_targets = targets[b].reshape(len(row), -1)
            pieces = []
            for start in range(0, len(row), HEAD_CHUNK):
                h, t = hidden[b, start : start + HEAD_CHUNK], row_targets[start : start + HEAD_CHUNK]
                pieces.append(checkpoint(chunk_logprobs, h, t, use_reentrant=False) if torch.is_grad_enabled() else chunk_logprobs(h, t))
            out.append(torch.cat(pieces).reshape(targets[b].shape))
        return out

    def forward_backward(self, data: Sequence[Datum], loss_fn: str, config: Mapping[str, float | str] | None = None,
                         forward_only: bool = False) -> tuple[list[np.ndarray], dict[str, float], int]:
        """Tinker's ``forward_backward`` (``forward`` with ``forward_only``): ``(logprobs, metrics, tokens)``.

        ``logprobs``: per datum its target log-probabilities (float32, shaped as its ``target_tokens``); ``metrics``:
        ``loss:sum`` (the loss of :data:`LOSSES` ``[loss_fn]`` summed over the data); ``tokens``: the input tokens
        processed (what the call is billed for). Unless ``forward_only``, the loss's gradient is added to the adapter's
        (sum reduction; :meth:`optim_step` applies and clears them). Everything is checked before anything is computed,
        so a refused call leaves the gradients as they were. Raises :class:`PrimitiveError` for an unknown loss, a bad
        config (:meth:`Loss.resolve`) or a bad datum (missing, unknown or misshapen inputs, tokens outside the
        vocabulary).
        """
        loss = LOSSES.get(loss_fn)
        if loss is None:
            raise PrimitiveError(f"unsupported loss_fn {loss_fn!r}: this server computes {', '.join(LOSSES)}")
        values = loss.resolve(config)
        inputs = [_checked_inputs(loss, i, datum, self.vocab_size, self.device.torch_device) for i, datum in enumerate(data)]
        outputs: list[np.ndarray] = []
        total = 0.0
        for run in self._microbatches(data):
            with torch.no_grad() if forward_only else nullcontext(), self.device.autocast():
                logprobs = self._target_logprobs([list(data[i].tokens) for i in run], [inputs[i]["target_tokens"] for i in run])
            run_loss = torch.stack([loss.compute(lp, inputs[i], values) for lp, i in zip(logprobs, run, strict=True)]).sum()
            if not forward_only:
                run_loss.backward()
            total += float(run_loss.detach())
            outputs += [lp.detach().float().cpu().numpy() for lp in logprobs]
        return outputs, {"loss:sum": total}, sum(len(datum.tokens) for datum in data)

    # optim_step

    def optim_step(self, learning_rate: float = 1e-4, beta1: float = 0.9, beta2: float = 0.95, eps: float = 1e-12, weight_decay: float = 0.0,
                   grad_clip_norm: float = 0.0) -> dict[str, float]:
        """Tinker's ``optim_step`` with ``AdamParams`` (its defaults): one AdamW step (``torch.optim.AdamW``, decoupled
        weight decay) on the gradients accumulated since the last step, with these hyper-parameters for this step, after
        clipping their global L2 norm to ``grad_clip_norm`` (0: no clipping); then the gradients are cleared. A step
        with no gradient leaves the weights as they are. Returns ``{"grad_norm:mean": the norm before clipping,
        "learning_rate:mean": learning_rate}``. Raises :class:`PrimitiveError` for a hyper-parameter out of range
        (learning rate, eps, weight decay or clip norm negative, betas outside [0, 1)) and for a gradient norm that is
        not finite: that step is not taken and its gradients are discarded."""
        for name, value in {"learning_rate": learning_rate, "eps": eps, "weight_decay": weight_decay, "grad_clip_norm": grad_clip_norm}.items():
            if not (math.isfinite(value) and value >= 0):
                raise PrimitiveError(f"adam_params.{name} must be a finite number >= 0, not {value}")
        for name, value in {"beta1": beta1, "beta2": beta2}.items():
            if not 0 <= value < 1:
                raise PrimitiveError(f"adam_params.{name} must be in [0, 1), not {value}")
        grads = [p.grad for p in self._params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        if not torch.isfinite(norm):
            self._optimizer.zero_grad(set_to_none=True)
            raise PrimitiveError(f"the gradient norm is {float(norm)}: the step was not taken and its gradients were discarded")
        if grad_clip_norm > 0 and grads:
            torch.nn.utils.clip_grads_with_norm_(self._params, grad_clip_norm, norm)
        for group in self._optimizer.param_groups:
            group.update(lr=learning_rate, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm:mean": float(norm), "learning_rate:mean": float(learning_rate)}

    # sampling

    @torch.no_grad()
    def prompt_logprobs(self, tokens: Sequence[int]) -> list[float | None]:
        """``compute_logprobs``: each token's log-probability given the ones before it under the model as it is
        (temperature 1), ``None`` at position 0 (nothing predicts it). Raises :class:`PrimitiveError` for no tokens or
        a token outside the vocabulary."""
        tokens = list(tokens)
        self._check_prompt(tokens)
        if len(tokens) == 1:
            return [None]
        with self.device.autocast():
            (logprobs,) = self._target_logprobs([tokens[:-1]], [torch.tensor(tokens[1:], device=self.device.torch_device)])
        return [None, *logprobs.float().cpu().tolist()]

    def _check_prompt(self, tokens: list[int]) -> None:
        if not tokens:
            raise PrimitiveError("the prompt has no tokens")
        if min(tokens) < 0 or max(tokens) >= self.vocab_size:
            raise PrimitiveError(f"a prompt token is outside the vocabulary [0, {self.vocab_size})")

    def _stops(self, stop: str | Sequence[str] | Sequence[int] | None) -> tuple[set[int], list[str]]:
        """``(stop token ids, stop strings)`` of a request's ``stop``: ``None`` the end-of-sequence tokens, ``[]``
        nothing (every stop off, end-of-sequence included: Tinker's ``SamplingParams.stop``), token ids or strings (a
        list of one kind). Raises :class:`PrimitiveError` for a mixed list, an empty string or an id outside the
        vocabulary."""
        if stop is None:
            return self.eos_token_ids, []
        items = [stop] if isinstance(stop, str) else list(stop)
        if all(isinstance(s, str) for s in items):
            if any(s == "" for s in items):
                raise PrimitiveError("a stop string is empty")
            return set(), list(items)  # type: ignore[arg-type]
        if all(isinstance(s, int) and not isinstance(s, bool) for s in items):
            if any(not 0 <= s < self.vocab_size for s in items):  # type: ignore[operator]
                raise PrimitiveError(f"a stop token is outside the vocabulary [0, {self.vocab_size})")
            return set(items), []  # type: ignore[arg-type]
        raise PrimitiveError("stop must be strings or token ids, not a mix")

    @staticmethod
    def _truncate(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
        """``scaled`` logits with every token outside the ``top_k`` most likely (``top_k <= 0``: no cut) and outside the
        smallest set whose probability reaches ``top_p`` (nucleus, Holtzman et al. 2020; 1: no cut) set to ``-inf``."""
        if 0 < top_k < scaled.shape[-1]:
            kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
            scaled = scaled.masked_fill(scaled < kth, -math.inf)
        if top_p < 1.0:
            ordered, order = torch.sort(scaled, descending=True, dim=-1)
            probs = torch.softmax(ordered, -1)
            outside = probs.cumsum(-1) - probs >= top_p  # the mass before a token already reaches top_p: never the first
            scaled = torch.full_like(scaled, -math.inf).scatter(-1, order, ordered.masked_fill(outside, -math.inf))
        return scaled

    @torch.no_grad()
    def sample(self, prompt: Sequence[int], num_samples: int = 1, max_tokens: int | None = None, temperature: float = 1.0, top_k: int = -1,
               top_p: float = 1.0, stop: str | Sequence[str] | Sequence[int] | None = None, seed: int | None = None,
               deadline: float | None = None) -> list[SampledSequence]:
        """Tinker's ``sample``: ``num_samples`` continuations of ``prompt`` drawn from the model as it is now, each at most
        ``max_tokens`` tokens (``None``: to the end of the context).

        Each step draws from ``softmax(logits / temperature)`` cut to ``top_k`` and ``top_p`` (:meth:`_truncate`;
        ``temperature`` 0: the most likely token); a sample's logprobs are ``log_softmax(logits / temperature)`` at its
        tokens (before the cut; temperature 0: the model's own, at temperature 1). A sample ends at a stop
        (:meth:`_stops`; ``None``: the end-of-sequence token), the token that completes it included — a stop string is
        found in the sample's decoded text, special tokens included, and the tokens up to the one completing it are
        kept — with reason ``stop``, or after ``max_tokens`` with ``length``. ``seed`` makes the draws reproducible
        (its own generator; the process's RNG is untouched). The prompt runs once; its key/value cache is shared by the
        samples. ``deadline`` (``time.monotonic()`` seconds): past it, the samples not finished end where they are, with
        reason ``length``. Tokens billed: ``len(prompt)`` prefill and the samples' tokens decode.

        Raises :class:`PrimitiveError` for an empty prompt or one with tokens outside the vocabulary, ``num_samples``
        below 1, ``max_tokens`` negative or past the context window with the prompt, a negative temperature, ``top_p``
        outside (0, 1] or a bad ``stop``.
        """
        from transformers import DynamicCache

        prompt = list(prompt)
        self._check_prompt(prompt)
        room = self.context_tokens - len(prompt)
        max_tokens = room if max_tokens is None else max_tokens
        if num_samples < 1:
            raise PrimitiveError(f"num_samples must be at least 1, not {num_samples}")
        if max_tokens < 0 or max_tokens > room:
            raise PrimitiveError(f"max_tokens {max_tokens} is outside [0, {room}]: the prompt has {len(prompt)} of the model's {self.context_tokens} tokens")
        if not (math.isfinite(temperature) and temperature >= 0):
            raise PrimitiveError(f"temperature must be a finite number >= 0, not {temperature}")
        if not 0 < top_p <= 1:
            raise PrimitiveError(f"top_p must be in (0, 1], not {top_p}")
        stop_ids, stop_strings = self._stops(stop)
        if max_tokens == 0:
            return [SampledSequence([], [], "length") for _ in range(num_samples)]
        window = max((len(s) for s in stop_strings), default=0) + 8  # tokens decoded to find a stop string that the last token completed
        device = self.device.torch_device
        generator = torch.Generator(device=device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)

        samples = [SampledSequence([], [], "length") for _ in range(num_samples)]
        done = [False] * num_samples
        cache = DynamicCache(config=self._causal_lm.config)
        with self.device.autocast():
            logits = self._causal_lm(input_ids=torch.tensor([prompt], device=device), cache=cache, use_cache=True, logits_to_keep=1).logits
        cache.batch_repeat_interleave(num_samples)
        logits = logits[:, -1].float().expand(num_samples, -1)
        for step in range(max_tokens):
            if temperature == 0:
                logprobs = torch.log_softmax(logits, -1)
                chosen = logprobs.argmax(-1)
            else:
                scaled = logits / temperature
                logprobs = torch.log_softmax(scaled, -1)
                probs = torch.softmax(self._truncate(scaled, top_k, top_p), -1)
                chosen = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            chosen_logprobs = logprobs.gather(-1, chosen[:, None]).squeeze(-1).tolist()
            for i, (token, logprob) in enumerate(zip(chosen.tolist(), chosen_logprobs, strict=True)):
                if done[i]:
                    continue
                tokens = samples[i].tokens
                tokens.append(token)
                samples[i].logprobs.append(logprob)
                if token in stop_ids or (stop_strings and any(s in self.tokenizer.decode(tokens[-window:]) for s in stop_strings)):
                    samples[i] = samples[i]._replace(stop_reason="stop")
                    done[i] = True
                elif len(tokens) == max_tokens:
                    done[i] = True
            if all(done) or step == max_tokens - 1 or (deadline is not None and time.monotonic() > deadline):
                break
            with self.device.autocast():
                logits = self._causal_lm(input_ids=chosen[:, None], cache=cache, use_cache=True).logits[:, -1].float()
        return samples

    # checkpoints

    def save_adapter(self, folder: Path) -> Path:
        """Write the adapter to ``folder`` as a Crucible LoRA checkpoint (``adapter_model.safetensors`` and
        ``adapter_config.json``, PEFT's ``save_pretrained`` as the trainer's checkpoints are written, so the inference
        service and :func:`~trainer_service.policy.load_model` read it as any LoRA checkpoint): Tinker's
        ``save_weights_for_sampler``. Only LoRA weights are written, never the base's ``lm_head`` or embeddings.
        Atomic: ``folder`` is complete or absent. Returns ``folder``."""
        return _atomic_folder(Path(folder), self._write_adapter)

    def _write_adapter(self, folder: Path) -> None:
        self._model.save_pretrained(folder, safe_serialization=True, save_embedding_layers=False)

    def save_state(self, folder: Path) -> Path:
        """:meth:`save_adapter` plus :data:`OPTIMIZER_FILE` (the AdamW state and the steps taken): Tinker's
        ``save_state``, which :meth:`load_state` and :meth:`from_state` resume exactly. Atomic. Returns ``folder``."""

        def write(tmp: Path) -> None:
            self._write_adapter(tmp)
            torch.save({"optimizer": self._optimizer.state_dict(), "steps": self.steps, "parameters": [name for name, _ in self._named_params]},
                       tmp / OPTIMIZER_FILE)

        return _atomic_folder(Path(folder), write)

    def load_state(self, folder: Path, optimizer: bool) -> None:
        """Tinker's ``load_state`` (``optimizer``: ``load_state_with_optimizer``): the adapter weights of ``folder`` (a
        checkpoint of this model's LoRA shape: same rank, alpha and modules) replace this model's, pending gradients
        are dropped, and the optimizer is the checkpoint's (``optimizer``) or a fresh one (step count 0). Everything is
        read and checked before anything changes. Raises :class:`PrimitiveError` for a folder without an adapter, of
        another LoRA shape, or without optimizer state when ``optimizer``."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        folder = Path(folder)
        try:
            saved = json.loads((folder / "adapter_config.json").read_text())
            weights = load_file(folder / "adapter_model.safetensors", device=str(self.device.torch_device))
        except (OSError, ValueError) as e:
            raise PrimitiveError(f"{folder.name} holds no readable LoRA adapter: {e}") from e
        lora = self._model.peft_config["default"]
        theirs = (saved.get("r"), saved.get("lora_alpha"), sorted(saved.get("target_modules") or []))
        ours = (self.rank, lora.lora_alpha, self.target_modules)
        if theirs != ours:
            raise PrimitiveError(f"{folder.name} is a rank-{theirs[0]} adapter (alpha {theirs[1]}) on {theirs[2]}; this model's is rank {ours[0]} "
                                 f"(alpha {ours[1]}) on {ours[2]}")
        optimizer_state = _read_optimizer_state(folder) if optimizer else None
        if optimizer_state is not None:
            self._check_optimizer_state(optimizer_state, folder)
        result = set_peft_model_state_dict(self._model, weights)
        missing = [key for key in result.missing_keys if "lora_" in key]
        if missing or result.unexpected_keys:
            raise PrimitiveError(f"{folder.name}'s adapter does not fit this model: missing {missing[:3]}, unexpected {list(result.unexpected_keys)[:3]}")
        self._optimizer.zero_grad(set_to_none=True)
        if optimizer_state is not None:
            self._restore_optimizer(optimizer_state)
        else:
            self._optimizer = self._new_optimizer()
            self.steps = 0

    def _check_optimizer_state(self, state: dict[str, Any], folder: Path) -> None:
        """Raises :class:`PrimitiveError` when ``state`` (``folder``'s) is over other parameters than this adapter's."""
        if state["parameters"] != [name for name, _ in self._named_params]:
            raise PrimitiveError(f"{folder.name}'s optimizer state is over other parameters than this model's adapter")

    def _restore_optimizer(self, state: dict[str, Any]) -> None:
        """A new AdamW holding ``state`` (checked by :meth:`_check_optimizer_state`), and its step count."""
        self._optimizer = self._new_optimizer()
        self._optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])


def _read_optimizer_state(folder: Path) -> dict[str, Any]:
    """``folder``'s :data:`OPTIMIZER_FILE`. Raises :class:`PrimitiveError` where there is none (an adapter written by
    :meth:`LiveModel.save_adapter` or a training job)."""
    path = Path(folder) / OPTIMIZER_FILE
    if not path.is_file():
        raise PrimitiveError(f"{Path(folder).name} holds no optimizer state (only save_state writes it)")
    return torch.load(path, weights_only=True, map_location="cpu")

"""The trainer's loop: one loop for every method (``trainer_service.methods``), LoRA or full weights, CPU or CUDA.

A method (:class:`Method`, one module each in ``trainer_service.methods``) turns dataset rows into examples and a
batch of examples into a loss; everything else is this module's
and the same for every method: the device, the model and its adapter, the optimizer and schedule, the data order,
checkpoints, resume, cancellation and the per-step metrics the job's events and metering use.

What makes the loop fast:

- the output layer runs only at supervised positions (:func:`token_logprobs`): the transformer body yields hidden
  states ``[batch, seq, hidden]``, the positions whose next-token label is not ``-100`` are gathered into
  ``[n_supervised, hidden]``, and only those meet ``lm_head``. On CUDA the projection and the log-softmax run as
  TRL's chunked kernel (``trl.kernels.ChunkedLogProbFunction``), which never materializes the ``[n, vocab]``
  logits; on CPU, where that kernel's torch fallback measured 2-4x slower, as one matmul and a cross-entropy;
- the prompt prefix every row of a batch shares (chat template, system prompt, fixed instructions) runs through
  the transformer once, not once per row (measured 1.5x faster steps on short arithmetic items);
- on CUDA: bf16 autocast over float32 master weights (LoRA: the frozen base itself in bf16), fused AdamW, SDPA
  attention; on CPU bf16 autocast only where the CPU has native bf16 (emulated bf16 measured 25x slower).

The data order is a pure function of ``(seed, step)``: the example at global position ``i`` is
``permutation(seed, epoch=i // n)[i % n]`` and step ``s`` (1-based) takes positions ``(s-1)*batch_size ...
s*batch_size - 1``. A checkpoint therefore only needs the step number to restore the data position, and
:func:`count_tokens` computes a job's tokens before it starts.
"""

from __future__ import annotations

import copy
import logging
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, make_dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar

import torch
import torch.nn.functional as F

from services.common import recipes
from services.common.llms import cpu_threads

if TYPE_CHECKING:
    from trainer_service.schemas import SFTRow

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
"""Label of a position that carries no loss (prompt, padding), as in transformers and PyTorch."""

MIN_SHARED_PREFIX = 8
"""A batch's common prompt prefix is computed once (see :func:`_hidden_at_supervised`) from this many tokens on."""

STATE_FILE = "training_state.pt"
"""File in a checkpoint folder holding optimizer, scheduler, RNG state and the step it was taken at."""

LOGPROB_VOCAB_CHUNK = 32768
"""Vocabulary tile of the chunked log-probability kernel on CUDA (TRL's default)."""


@dataclass
class LoopConfig:
    """The training loop's hyper-parameters; names follow PEFT's ``LoraConfig`` and transformers' ``TrainingArguments``.

    ``adapter``: ``lora`` trains a PEFT LoRA adapter (``lora_*`` on ``target_modules``) over the frozen base;
    ``full`` trains every weight. ``batch_size`` is examples per optimizer step (a DPO example is one preference
    pair). ``warmup_steps`` of linear warm-up precede the ``lr_scheduler_type`` decay (any name
    ``transformers.get_scheduler`` accepts) over ``max_steps``. Sequences longer than ``max_seq_len`` tokens are
    cut at the right. ``checkpoint_every`` is in steps; a final checkpoint is always written. ``bf16_autocast``
    takes effect on CUDA and on CPUs with native bf16 (:func:`cpu_has_native_bf16`). ``compile``: compile each
    decoder layer with ``torch.compile`` (regional compilation; ``None``: on CUDA only, where it was measured to
    help).
    """

    adapter: Literal["lora", "full"] = "lora"
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    batch_size: int = 16
    max_steps: int = 100
    warmup_steps: int = 10
    lr_scheduler_type: str = "cosine"
    max_seq_len: int = 256
    seed: int = 0
    checkpoint_every: int = 25
    bf16_autocast: bool = True
    compile: bool | None = None


TrainConfig = make_dataclass(  # built from the declarations, so that a method's field is never restated here
    "TrainConfig",
    [(name, info.annotation, field(default=info.default)) for method in recipes.METHODS.values() for name, info in method.config.model_fields.items()],
    bases=(LoopConfig,),
    namespace={"__module__": __name__,
               "__doc__": "A training job's hyper-parameters: :class:`LoopConfig`'s, then every registered method's own fields (``dpo_beta``, "
                          "``grpo_*``, ``orpo_lambda``: :mod:`services.common.recipes`, same names and defaults), each read only by its method."})


@dataclass
class Example:
    """One tokenized sequence: ``input_ids`` and ``labels`` have equal length (at most ``max_seq_len``).

    ``labels[t]`` is ``input_ids[t]`` on supervised (answer) tokens and ``IGNORE_INDEX`` elsewhere; the model
    is trained to predict ``labels[t]`` from tokens ``0..t-1``.
    """

    input_ids: list[int]
    labels: list[int]

    @property
    def num_supervised(self) -> int:
        """Number of tokens that carry loss (position 0 never does: no token comes before it to predict it from)."""
        return sum(label != IGNORE_INDEX for label in self.labels[1:])


@dataclass(frozen=True)
class TokenCounts:
    """Tokens of a step or a job, by what they are billed as: ``training`` (input tokens of the sequences the loss
    runs forward and backward through), and for a method that generates (GRPO's rollouts) ``prefill`` (prompt tokens
    a generation computes) and ``decode`` (tokens it generates), priced as inference's are."""

    training: int = 0
    prefill: int = 0
    decode: int = 0

    def __add__(self, other: TokenCounts) -> TokenCounts:
        return TokenCounts(self.training + other.training, self.prefill + other.prefill, self.decode + other.decode)


@dataclass
class StepLoss:
    """What a method's :meth:`Method.loss` gives the loop: the scalar ``loss`` to minimize, the method's own
    ``metrics`` for the step's event, and the step's ``tokens`` when the method counts them itself (a method that
    generates knows them only after generating; ``None``: the sum of ``method.tokens`` over the batch)."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    tokens: TokenCounts | None = None


@dataclass
class StepMetrics:
    """What one optimizer step did. ``tokens`` counts non-pad input tokens of the batch's training sequences (the
    billed ``training_tokens``), ``prefill_tokens``/``decode_tokens`` what its rollouts generated (GRPO; else 0);
    ``learning_rate`` is the rate used for this step; ``elapsed_s`` is wall time since this run started;
    ``extra`` holds the method's own metrics (DPO: ``reward_accuracy``, ``reward_margin``; GRPO: ``reward_mean``…)."""

    step: int
    max_steps: int
    loss: float
    learning_rate: float
    tokens: int
    tokens_per_s: float
    elapsed_s: float
    extra: dict[str, float] = field(default_factory=dict)
    prefill_tokens: int = 0
    decode_tokens: int = 0


@dataclass
class TrainResult:
    """Outcome of :func:`train`. ``usage``: the tokens of every step (:class:`TokenCounts`), including steps done
    before a resume; ``stopped`` is true
    when ``should_stop`` ended training early; ``last_checkpoint`` is the newest ``step-<N>`` folder and
    ``checkpoints`` every folder this call wrote, oldest first (``None`` and empty when nothing is written)."""

    steps_done: int
    final_loss: float
    stopped: bool
    last_checkpoint: Path | None
    checkpoints: list[Path] = field(default_factory=list)
    usage: TokenCounts = field(default_factory=TokenCounts)


@dataclass(frozen=True)
class Device:
    """Where a job trains: ``torch_device``, a readable ``name`` for its events, and the autocast dtype (``None``:
    float32 throughout)."""

    torch_device: torch.device
    name: str
    autocast_dtype: torch.dtype | None

    @property
    def is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    def autocast(self):  # noqa: ANN201 - a context manager
        """bf16 autocast on this device, or nothing."""
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.torch_device.type, dtype=self.autocast_dtype)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``); emulated
    bf16 is slower than float32. False where ``/proc/cpuinfo`` is absent."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = {flag for line in cpuinfo.splitlines() if line.startswith("flags") for flag in line.split()}
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def select_device(config: TrainConfig) -> Device:
    """The first CUDA device when this process sees one (bf16 autocast), else the CPU (every CPU this process may
    run on, or ``OMP_NUM_THREADS`` of them: :func:`~services.common.llms.cpu_threads`; bf16 autocast only with native bf16).
    Chosen once, at the start of a job."""
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        return Device(torch.device("cuda", index), f"cuda:{index} ({torch.cuda.get_device_name(index)})",
                      torch.bfloat16 if config.bf16_autocast else None)
    torch.set_num_threads(cpu_threads())
    bf16 = config.bf16_autocast and cpu_has_native_bf16()
    return Device(torch.device("cpu"), f"cpu ({torch.get_num_threads()} threads)", torch.bfloat16 if bf16 else None)


# --------------------------------------------------------------------------- tokenization


def _render_pair(tokenizer: Any, prompt: list[dict[str, str]], answer: dict[str, str]) -> tuple[str, str]:
    """Chat-template text of ``prompt`` plus the assistant header, and of the answer turn that follows it."""
    prefix = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template([*prompt, answer], tokenize=False)
    if not full.startswith(prefix):
        raise ValueError("the chat template does not render the prompt as a prefix of the conversation")
    return prefix, full[len(prefix) :]


class NoSupervisedTokens(ValueError):
    """Rows whose answer is cut away entirely at ``max_seq_len`` (their prompt fills it): such a row would train
    with loss 0 while its tokens are billed. ``indices``: their 0-based positions in the rows given."""

    def __init__(self, indices: list[int], max_seq_len: int) -> None:
        super().__init__(f"{len(indices)} row(s) have no supervised token left after truncation at {max_seq_len} tokens")
        self.indices, self.max_seq_len = indices, max_seq_len


def tokenize_turns(tokenizer: Any, prompt: list[dict[str, str]], answer: dict[str, str], max_seq_len: int) -> Example:
    """One conversation as an :class:`Example` with loss on the answer only.

    Prompt and answer are rendered with the tokenizer's chat template and tokenized separately, so the prompt
    tokens are exactly those the model sees at inference after ``add_generation_prompt``; the answer's tokens
    (its text and the template's end-of-turn tokens, ``<|im_end|>`` and ``\\n`` for ChatML) are supervised,
    everything else is ``IGNORE_INDEX``. Cut to ``max_seq_len`` tokens. ``ValueError`` if the chat template does
    not render the prompt as a prefix of the conversation.
    """
    prefix, answer_text = _render_pair(tokenizer, prompt, answer)
    prompt_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer_text, add_special_tokens=False)["input_ids"]
    return Example(input_ids=(prompt_ids + answer_ids)[:max_seq_len], labels=([IGNORE_INDEX] * len(prompt_ids) + answer_ids)[:max_seq_len])


def tokenize_examples(tokenizer: Any, rows: Sequence[SFTRow], max_seq_len: int) -> list[Example]:
    """Tokenize SFT rows (``sft_turns``, see ``trainer_service.schemas``: the last message of a ``messages`` row is
    the answer and the earlier ones the prompt; a ``prompt_completion`` row is one user message and the answer)
    with :func:`tokenize_turns`.

    Raises :class:`NoSupervisedTokens` if a row has no supervised token left after the cut.
    """
    examples = [tokenize_turns(tokenizer, *row.sft_turns(), max_seq_len) for row in rows]
    if empty := [index for index, example in enumerate(examples) if example.num_supervised == 0]:
        raise NoSupervisedTokens(empty, max_seq_len)
    return examples


def _batch_indices(step: int, n_rows: int, batch_size: int, seed: int) -> list[int]:
    """Example indices of 1-based ``step``: positions ``(step-1)*batch_size ...`` of the seeded epoch permutations."""
    start = (step - 1) * batch_size
    indices = []
    permutation, epoch = None, -1
    for position in range(start, start + batch_size):
        if position // n_rows != epoch:
            epoch = position // n_rows
            generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            permutation = torch.randperm(n_rows, generator=generator).tolist()
        indices.append(permutation[position % n_rows])
    return indices


def count_tokens(method: Method, examples: Sequence[Any], config: TrainConfig) -> TokenCounts:
    """The tokens a full run of ``config.max_steps`` steps of ``method`` over ``examples`` processes and bills:
    ``method.tokens`` of each example of each step, in :func:`train`'s data order. Exact for a method whose
    examples' sequences are known before training (SFT, DPO), an upper bound for one that generates (GRPO: every
    rollout as long as ``max_new_tokens`` allows), and for any run of the job (stopped or resumed runs process fewer).
    ``ValueError`` for no examples.
    """
    if not examples:
        raise ValueError("no training rows")
    per_example = [method.tokens(e) for e in examples]
    total = TokenCounts()
    for step in range(1, config.max_steps + 1):
        for i in _batch_indices(step, len(per_example), config.batch_size, config.seed):
            total += per_example[i]
    return total


def collate(examples: Sequence[Example], pad_token_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad to the longest example: ``input_ids``, ``attention_mask``, ``labels``, each ``[batch, seq]`` on ``device``."""
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        input_ids[row, :n] = torch.tensor(example.input_ids)
        attention_mask[row, :n] = 1
        labels[row, :n] = torch.tensor(example.labels)
    return input_ids.to(device, non_blocking=True), attention_mask.to(device, non_blocking=True), labels.to(device, non_blocking=True)


# --------------------------------------------------------------------------- log-probabilities


def _shared_prefix_len(input_ids: torch.Tensor, labels: torch.Tensor) -> int:
    """Length of the token prefix that every row of ``input_ids`` ``[batch, seq]`` shares and that predicts no
    label, i.e. the largest ``P`` with equal ``input_ids[:, :P]`` across rows and ``labels[:, 1:P+1]`` all
    ignored. Returns 0 when the batch has no supervised token."""
    supervised_positions = (labels != IGNORE_INDEX).any(0).nonzero()
    if len(supervised_positions) == 0:
        return 0
    same = int((input_ids == input_ids[:1]).all(0).long().cumprod(0).sum())
    return min(same, int(supervised_positions[0]) - 1)


def _hidden_at_supervised(causal_lm: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(hidden [n, hidden], targets [n], rows [n])`` at the ``n`` supervised positions of a right-padded batch
    (all inputs ``[batch, seq]``): ``hidden[b, t]`` predicts ``labels[b, t + 1]``; ``rows`` is each position's row.

    When the rows share a prompt prefix of ``P >= MIN_SHARED_PREFIX`` tokens, the prefix goes through the
    transformer once with batch 1, its key/value cache is repeated to the batch, and only the ``seq - P``
    remaining positions run per row; gradients flow through the shared cache, so results and gradients equal
    those of the plain pass (up to float rounding).
    """
    from transformers import DynamicCache

    body = causal_lm.model
    prefix_len = _shared_prefix_len(input_ids, labels)
    if prefix_len >= MIN_SHARED_PREFIX:
        cache = DynamicCache(config=causal_lm.config)
        body(input_ids=input_ids[:1, :prefix_len], cache=cache, use_cache=True)
        cache.batch_repeat_interleave(input_ids.shape[0])
        hidden = body(input_ids=input_ids[:, prefix_len:], attention_mask=attention_mask, cache=cache, use_cache=True).last_hidden_state
    else:
        prefix_len = 0
        hidden = body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    targets = labels[:, prefix_len + 1 :]
    supervised = targets != IGNORE_INDEX
    rows = supervised.nonzero()[:, 0]
    return hidden[:, :-1][supervised], targets[supervised], rows


def token_logprobs(causal_lm: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs [n], rows [n])``: the model's log-probability (float32) of each supervised label of a
    right-padded batch (inputs ``[batch, seq]``), in row-major order, and the row each belongs to.

    ``lm_head`` meets only the supervised positions. On CUDA the projection and log-softmax run in tiles (TRL's
    ``ChunkedLogProbFunction``: no ``[n, vocab]`` logits in memory, gradients accumulated in float32); elsewhere
    as one matmul and ``log_softmax``. The SFT loss is ``-logprobs.mean()``, a sequence's log-likelihood
    ``logprobs`` summed over its row.
    """
    hidden, targets, rows = _hidden_at_supervised(causal_lm, input_ids, attention_mask, labels)
    head = causal_lm.get_output_embeddings()
    if hidden.shape[0] == 0:
        return head(hidden).float().sum(-1), rows  # an empty result still connected to the graph
    if hidden.is_cuda:
        from trl.kernels import ChunkedLogProbFunction

        logprobs = ChunkedLogProbFunction.apply(hidden, head.weight, head.bias, targets, 1.0, LOGPROB_VOCAB_CHUNK, None, 1.0, ())[0]
        return logprobs, rows
    return -F.cross_entropy(head(hidden).float(), targets, reduction="none"), rows


def sequence_logprobs(logprobs: torch.Tensor, rows: torch.Tensor, batch: int) -> torch.Tensor:
    """``[batch]``: each row's summed log-probability of its supervised tokens (the log-likelihood of its answer)."""
    return torch.zeros(batch, dtype=logprobs.dtype, device=logprobs.device).index_add(0, rows, logprobs)


@dataclass
class Policy:
    """What a method's loss sees of the model being trained: the log-probabilities of the policy (with gradients)
    and of the reference policy (the model as the job started: the base with the adapter switched off for LoRA over
    the base, a frozen merged copy for LoRA continuing a parent adapter, a frozen copy for full weights; no gradients), sampling from the policy (:meth:`generate`), the ``device`` and
    the tokenizer's ``pad_token_id``."""

    device: Device
    pad_token_id: int
    _causal_lm: Any
    _reference: Callable[[], Any]

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`token_logprobs` of the model being trained."""
        with self.device.autocast():
            return token_logprobs(self._causal_lm, input_ids, attention_mask, labels)

    @torch.no_grad()
    def reference_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`token_logprobs` of the reference policy."""
        with self._reference() as reference, self.device.autocast():
            return token_logprobs(reference, input_ids, attention_mask, labels)

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], n: int, max_new_tokens: int, temperature: float) -> list[list[int]]:
        """``n`` completions of one prompt sampled from the policy as it is now (temperature ``temperature``, no top-p or
        top-k cut), each at most ``max_new_tokens`` tokens and ending at the model's end-of-sequence token (kept) or at
        that limit. Uses the torch generator of the device, so a seeded (or resumed) job samples the same completions.
        Dropout is off while sampling."""
        model = self._causal_lm
        was_training = model.training
        model.eval()
        try:
            input_ids = torch.tensor([prompt_ids], device=self.device.torch_device)
            with self.device.autocast():
                out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True, temperature=temperature,
                                     top_p=1.0, top_k=0, max_new_tokens=max_new_tokens, num_return_sequences=n, use_cache=True,
                                     pad_token_id=self.pad_token_id)
        finally:
            model.train(was_training)
        eos = model.generation_config.eos_token_id
        stops = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        completions = []
        for row in out[:, len(prompt_ids):].tolist():
            end = next((i + 1 for i, token in enumerate(row) if token in stops), len(row))
            completions.append(row[:end])
        return completions


# --------------------------------------------------------------------------- the method seam


class Method(Protocol):
    """One training method's step: how rows become examples, what an example costs and the loss of a batch.

    ``name``: its ``recipe.method``; ``spec``: its declaration (:class:`~services.common.recipes.MethodSpec`: its own
    fields, the dataset formats it trains on, whether its loss reads the reference policy, for which the loop then
    keeps one: the base with the adapter off for LoRA, a frozen copy of the starting weights for full fine-tuning,
    counted in the memory estimate). Both are set by :func:`method_step`. A ``spec.rewarded`` method's step is built
    with the job's reward function as its one argument (GRPO's ``reward``; none where only examples and token counts
    are needed, a job's estimate).
    """

    name: ClassVar[str]
    spec: ClassVar[recipes.MethodSpec]

    def examples(self, tokenizer: Any, rows: Sequence[Any], config: TrainConfig) -> list[Any]:
        """The rows as this method's examples, in order. Raises ``NoSupervisedTokens`` naming the rows that have
        nothing left to train on after truncation at ``config.max_seq_len``."""
        ...

    def batch_rows(self, config: TrainConfig) -> int:
        """The padded batch rows one example becomes (a DPO pair: 2; a GRPO prompt: its group), for the memory estimate."""
        ...

    def tokens(self, example: Any) -> TokenCounts:
        """Tokens one step spends on ``example`` (the billed quantities; at most, for a method that generates)."""
        ...

    def loss(self, policy: Policy, batch: Sequence[Any], config: TrainConfig) -> StepLoss:
        """One optimizer step's loss on ``batch`` (see :class:`StepLoss`)."""
        ...


STEPS: dict[str, type[Method]] = {}
"""The registered steps by method name (``trainer_service.methods`` imports every module that registers one)."""

M = TypeVar("M", bound=type)


def method_step(name: str) -> Callable[[M], M]:
    """Decorator: register the decorated class as the step of the method ``name`` declared in
    :mod:`services.common.recipes`, setting its ``name`` and ``spec``. ``KeyError`` for an undeclared method,
    ``ValueError`` for a second step of one method."""
    def register(cls: M) -> M:
        if name in STEPS:
            raise ValueError(f"method {name!r} has two steps")
        cls.name, cls.spec = name, recipes.method_spec(name)
        STEPS[name] = cls
        return cls
    return register


# --------------------------------------------------------------------------- models and checkpoints


def _lora(config: TrainConfig):  # noqa: ANN202
    from peft import LoraConfig

    return LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=config.target_modules, task_type="CAUSAL_LM")


def load_model(base_dir: Path, config: TrainConfig, device: Device, *, init_adapter: Path | None = None,
               init_weights: Path | None = None, resume: Path | None = None) -> Any:
    """The model to train on ``device``: a PEFT model (``config.adapter == "lora"``) or a plain causal LM (``full``).

    LoRA: the frozen base (bf16 on CUDA, float32 on CPU) with a trainable float32 adapter, from ``resume`` (a
    checkpoint folder of this job), else ``init_adapter`` (a parent adapter, whose own LoRA shape is kept), else
    fresh. Full: float32 weights from ``resume``, else ``init_weights`` (a parent full checkpoint), else the base;
    a LoRA parent (``init_adapter``) is merged into the base first.
    """
    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    def from_folder(folder: Path, dtype: torch.dtype) -> Any:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa")
        model.config.use_cache = False
        return model

    if config.adapter == "full":
        if resume is not None or init_weights is not None:
            model = from_folder(resume or init_weights, torch.float32)  # type: ignore[arg-type]
        elif init_adapter is not None:
            model = PeftModel.from_pretrained(from_folder(base_dir, torch.float32), init_adapter).merge_and_unload()
        else:
            model = from_folder(base_dir, torch.float32)
        return model.requires_grad_(True).to(device.torch_device)  # a merged LoRA parent comes back frozen
    base = from_folder(base_dir, torch.bfloat16 if device.is_cuda else torch.float32).to(device.torch_device)
    adapter = resume or init_adapter
    if adapter is not None:
        return PeftModel.from_pretrained(base, adapter, is_trainable=True)
    return get_peft_model(base, _lora(config))


def _reference_context(model: Any, config: TrainConfig, device: Device, base_dir: Path, *, init_adapter: Path | None,
                       init_weights: Path | None, resumed: bool) -> Callable[[], Any]:
    """A factory of context managers yielding the reference policy's causal LM (see :class:`Policy`): the model as the
    job started, whether it starts now or resumes. LoRA over the base: the base itself (the adapter switched off).
    Otherwise a frozen copy of the starting weights: the model just loaded when the job starts on full weights, else
    loaded again from the job's starting point (:func:`load_model` without ``resume``: a LoRA parent merged into the
    base, a full parent, or the base). Switching off a LoRA parent would give the bare base, and a resumed job's
    weights are not where it started: either way the loss would pull the policy towards the wrong model."""
    if config.adapter == "lora" and init_adapter is None:
        causal_lm = model.get_base_model()

        @contextmanager
        def lora_reference() -> Iterator[Any]:
            with model.disable_adapter():
                yield causal_lm

        return lora_reference
    if config.adapter == "full" and not resumed:
        frozen = copy.deepcopy(model)
    else:
        frozen = load_model(base_dir, replace(config, adapter="full"), device, init_adapter=init_adapter, init_weights=init_weights)
    frozen = frozen.requires_grad_(False).eval()
    if device.is_cuda:
        frozen = frozen.to(torch.bfloat16)
    return lambda: nullcontext(frozen)


def _save_checkpoint(model: Any, out_dir: Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``out_dir/step-<step>/`` (a PEFT adapter or full safetensors weights, plus ``training_state.pt``)
    atomically; return the folder."""
    final = out_dir / f"step-{step}"
    tmp = out_dir / f".step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    torch.save(state, tmp / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def train(
    base_dir: Path,
    method: Method,
    rows: Sequence[Any],
    config: TrainConfig,
    out_dir: Path,
    **kwargs: Any,
) -> TrainResult:
    """Train by ``method`` on dataset ``rows``: the rows become the method's examples with the base model's tokenizer
    (``method.examples``, cut to ``config.max_seq_len``), then :func:`train_examples` runs the loop.

    Raises :class:`NoSupervisedTokens` before any step if a row has nothing left to train on after the cut, and
    ``ValueError`` for no rows; ``kwargs`` and the rest as :func:`train_examples`.
    """
    from transformers import AutoTokenizer

    if not rows:
        raise ValueError("no training rows")
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    examples = method.examples(tokenizer, rows, config)
    return train_examples(base_dir, method, examples, config, out_dir, pad_token_id=tokenizer.pad_token_id, **kwargs)


def _compile_layers(causal_lm: Any) -> None:
    """Regional compilation: each decoder layer's forward through ``torch.compile`` (the layers share one graph)."""
    for layer in causal_lm.model.layers:
        layer.compile()


def train_examples(
    base_dir: Path,
    method: Method,
    examples: Sequence[Any],
    config: TrainConfig,
    out_dir: Path | None,
    *,
    pad_token_id: int,
    init_adapter: Path | None = None,
    init_weights: Path | None = None,
    resume: Path | None = None,
    on_start: Callable[[dict[str, Any]], None] | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
    on_checkpoint: Callable[[int, Path], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TrainResult:
    """The trainer's loop: ``config.max_steps`` optimizer steps of ``method`` over its ``examples``; checkpoints go
    to ``out_dir/step-<N>/`` (``out_dir`` ``None``: nothing is written, for benchmarks).

    ``base_dir`` is a prepared base model folder; ``init_adapter``/``init_weights`` a parent checkpoint (see
    :func:`load_model`). With ``resume`` (a checkpoint folder written by this function) the weights, optimizer,
    scheduler, RNG state and data position are restored, so steps ``N+1 ...`` are exactly those an uninterrupted
    run would have taken. ``on_start`` receives ``{"device", "precision", "method", "adapter",
    "trainable_parameters", "examples", "from_step", "compiled"}`` before the first step.

    Every ``config.checkpoint_every`` steps, at the end, and when ``should_stop()`` (checked between steps)
    returns true, the model (LoRA: ``adapter_model.safetensors`` + ``adapter_config.json``; full:
    ``model.safetensors`` + ``config.json``) and ``training_state.pt`` are written atomically to
    ``out_dir/step-<N>/`` and ``on_checkpoint(N, folder)`` is called. ``on_step`` receives :class:`StepMetrics`
    after every step.

    Raises ``ValueError`` for no examples or a ``resume`` state from a different seed, batch size or dataset size.
    """
    from transformers import get_scheduler

    if not examples:
        raise ValueError("no training rows")
    device = select_device(config)
    torch.manual_seed(config.seed)
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)

    model, policy, compiled = _policy(Path(base_dir), method, config, device, pad_token_id, init_adapter=init_adapter, init_weights=init_weights,
                                      resume=resume)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay, fused=device.is_cuda)
    scheduler = get_scheduler(config.lr_scheduler_type, optimizer, num_warmup_steps=config.warmup_steps, num_training_steps=config.max_steps)

    step, usage = _restore(Path(resume), config, len(examples), optimizer, scheduler, device) if resume is not None else (0, TokenCounts())

    start_info = {"device": device.name, "precision": f"{'bf16 autocast' if device.autocast_dtype else 'float32'}",
                  "method": method.name, "adapter": config.adapter, "trainable_parameters": sum(p.numel() for p in params),
                  "examples": len(examples), "from_step": step, "compiled": compiled}
    logger.info("training %s", start_info)
    if on_start is not None:
        on_start(start_info)

    checkpoints: list[Path] = []

    def checkpoint() -> Path | None:
        if out_dir is None:
            return None
        folder = _save_checkpoint(model, out_dir, step, _training_state(step, usage, config, len(examples), optimizer, scheduler, device))
        checkpoints.append(folder)
        if on_checkpoint is not None:
            on_checkpoint(step, folder)
        return folder

    last_checkpoint = Path(resume) if resume is not None else None
    loss_value, stopped = float("nan"), False
    started = time.monotonic()
    while step < config.max_steps:
        if should_stop is not None and should_stop():
            stopped = True
            break
        step_started = time.monotonic()
        batch = [examples[i] for i in _batch_indices(step + 1, len(examples), config.batch_size, config.seed)]
        learning_rate = scheduler.get_last_lr()[0]
        out, loss_value = _optimizer_step(method, policy, batch, config, optimizer, scheduler, params)
        step += 1
        tokens = out.tokens if out.tokens is not None else sum((method.tokens(e) for e in batch), TokenCounts())
        usage += tokens
        now = time.monotonic()
        if on_step is not None:
            on_step(StepMetrics(step=step, max_steps=config.max_steps, loss=loss_value, learning_rate=learning_rate, tokens=tokens.training,
                                tokens_per_s=tokens.training / max(now - step_started, 1e-9), elapsed_s=now - started, extra=out.metrics,
                                prefill_tokens=tokens.prefill, decode_tokens=tokens.decode))
        if step % config.checkpoint_every == 0 or step == config.max_steps:
            last_checkpoint = checkpoint() or last_checkpoint

    if out_dir is not None and (last_checkpoint is None or (stopped and last_checkpoint.name != f"step-{step}")):
        last_checkpoint = checkpoint()
    return TrainResult(steps_done=step, final_loss=loss_value, stopped=stopped,
                       last_checkpoint=last_checkpoint, checkpoints=checkpoints, usage=usage)


def _restore(resume: Path, config: TrainConfig, n_rows: int, optimizer: torch.optim.Optimizer, scheduler: Any,
             device: Device) -> tuple[int, TokenCounts]:
    """Load ``resume``'s training state into ``optimizer``, ``scheduler`` and the RNGs: ``(step, tokens so far)``. Raises
    ``ValueError`` for a state from a different seed, batch size or dataset size (its data order would differ)."""
    state = torch.load(resume / STATE_FILE, weights_only=True, map_location=device.torch_device)
    expected = {"seed": config.seed, "batch_size": config.batch_size, "n_rows": n_rows}
    found = {key: state[key] for key in expected}
    if found != expected:
        raise ValueError(f"resume state {found} does not match this job {expected}")
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"].cpu())
    if device.is_cuda and "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"].cpu(), device.torch_device)
    return state["step"], TokenCounts(state["tokens_total"], state.get("prefill_tokens", 0), state.get("decode_tokens", 0))


def _training_state(step: int, usage: TokenCounts, config: TrainConfig, n_rows: int, optimizer: torch.optim.Optimizer, scheduler: Any,
                    device: Device) -> dict[str, Any]:
    """What ``training_state.pt`` holds for :func:`_restore`: the step, tokens, data order's keys, optimizer, scheduler, RNGs."""
    state = {"step": step, "tokens_total": usage.training, "prefill_tokens": usage.prefill, "decode_tokens": usage.decode,
             "seed": config.seed, "batch_size": config.batch_size, "n_rows": n_rows,
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "torch_rng": torch.get_rng_state(), "config": asdict(config)}
    if device.is_cuda:
        state["cuda_rng"] = torch.cuda.get_rng_state(device.torch_device)
    return state


def _optimizer_step(method: Method, policy: Policy, batch: Sequence[Any], config: TrainConfig, optimizer: torch.optim.Optimizer,
                    scheduler: Any, params: list[torch.nn.Parameter]) -> tuple[StepLoss, float]:
    """One optimizer step on ``batch``: the method's loss, backward, gradients clipped to ``config.max_grad_norm``, AdamW
    and the schedule stepped. Returns the method's :class:`StepLoss` and the loss as a number (reading it waits for the
    step's kernels, so the step's measured time is real)."""
    optimizer.zero_grad(set_to_none=True)
    out = method.loss(policy, batch, config)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm, foreach=True)
    optimizer.step()
    scheduler.step()
    return out, float(out.loss.detach())


def _policy(base_dir: Path, method: Method, config: TrainConfig, device: Device, pad_token_id: int, *, init_adapter: Path | None,
            init_weights: Path | None, resume: Path | None) -> tuple[Any, Policy, bool]:
    """The model being trained (:func:`load_model`, in training mode, its layers compiled where ``config.compile`` or a
    GPU says so) and the :class:`Policy` the method's loss reads, with the reference policy where the method needs one:
    ``(model, policy, compiled)``."""
    model = load_model(base_dir, config, device, init_adapter=init_adapter, init_weights=init_weights, resume=resume)
    model.train()
    causal_lm = model.get_base_model() if config.adapter == "lora" else model
    reference = (_reference_context(model, config, device, base_dir, init_adapter=init_adapter, init_weights=init_weights, resumed=resume is not None)
                 if method.spec.needs_reference else (lambda: nullcontext(None)))
    compiled = device.is_cuda if config.compile is None else config.compile
    if compiled:
        _compile_layers(causal_lm)
    return model, Policy(device=device, pad_token_id=pad_token_id, _causal_lm=causal_lm, _reference=reference), compiled

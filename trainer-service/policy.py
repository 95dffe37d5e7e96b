"""The model being trained and what a method's loss sees of it: :func:`load_model` loads the base and a parent
checkpoint or a resumed one (LoRA adapter or full weights), :func:`build_policy` puts it in training mode, compiles
its layers where asked and wraps it, with the reference policy where the method reads one, as a :class:`Policy`.

Invariants: the reference policy is the model as the job started (the base, or the parent checkpoint the job
continues), whether the job starts now or resumes, and it takes no gradient; a resumed job's weights are its
checkpoint's, so its next steps are an uninterrupted run's. On CUDA a LoRA job's frozen base is bf16 and everything
trained is float32 (autocast computes in bf16); on CPU everything is float32.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from trainer_service.config import TrainConfig
from trainer_service.devices import Device
from trainer_service.logprobs import token_logprobs

if TYPE_CHECKING:
    from trainer_service.parallel import Parallel


class TokenLogprobs(torch.nn.Module):
    """:func:`~trainer_service.logprobs.token_logprobs` of ``causal_lm`` as a module: what a method's loss runs the model
    through, and so the module DDP and FSDP2 wrap (their gradient and parameter hooks run on a module's forward; the loss
    reads the model's body and ``lm_head`` itself, never its ``forward``). Parameter names are ``causal_lm.``'s.
    ``shared_prefix``: whether a prompt prefix the rows share runs once (off when FSDP2 shards the layers)."""

    def __init__(self, causal_lm: Any, shared_prefix: bool = True) -> None:
        super().__init__()
        self.causal_lm, self.shared_prefix = causal_lm, shared_prefix

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor | None = None,
                generate: dict[str, Any] | None = None) -> Any:
        """The supervised tokens' log-probabilities, or with ``generate`` (``model.generate``'s keyword arguments) sampled
        sequences: under FSDP2 sampling runs inside the root module's forward, which gathers the weights the layers share."""
        if generate is not None:
            return self.causal_lm.generate(input_ids=input_ids, attention_mask=attention_mask, **generate)
        return token_logprobs(self.causal_lm, input_ids, attention_mask, labels, self.shared_prefix)


@dataclass
class Policy:
    """What a method's loss sees of the model being trained: the log-probabilities of the policy (with gradients,
    through ``_forward``: a :class:`TokenLogprobs`, wrapped by DDP or FSDP2 on several devices) and of the reference
    policy (the model as the job started: the base with the adapter switched off for LoRA over the base, a frozen
    merged copy for LoRA continuing a parent adapter, a frozen copy for full weights; no gradients), sampling from the
    policy (:meth:`generate`), the ``device`` and the tokenizer's ``pad_token_id``. ``_sharded``: the FSDP2 root when the
    weights are sharded over processes (sampling then gathers them and keeps every process decoding until all are done)."""

    device: Device
    pad_token_id: int
    _causal_lm: Any
    _reference: Callable[[], Any]
    _forward: Any
    _sharded: Any = None

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`~trainer_service.logprobs.token_logprobs` of the model being trained."""
        with self.device.autocast():
            return self._forward(input_ids, attention_mask, labels)

    @torch.no_grad()
    def reference_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`~trainer_service.logprobs.token_logprobs` of the reference policy."""
        with self._reference() as reference, self.device.autocast():
            return token_logprobs(reference, input_ids, attention_mask, labels)

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], n: int, max_new_tokens: int, temperature: float) -> list[list[int]]:
        """``n`` completions of one prompt sampled from the policy as it is now (temperature ``temperature``, no top-p or
        top-k cut), each at most ``max_new_tokens`` tokens and ending at the model's end-of-sequence token (kept) or at
        that limit. Uses the torch generator of the device, so a seeded (or resumed) job samples the same completions.
        Dropout is off while sampling. With sharded weights every process must call it (transformers' ``synced_gpus``), and
        sampling runs through the FSDP2 root module (:class:`TokenLogprobs`), which gathers the weights outside the layers."""
        model = self._causal_lm
        was_training = model.training
        model.eval()
        try:
            input_ids = torch.tensor([prompt_ids], device=self.device.torch_device)
            options = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0, "max_new_tokens": max_new_tokens,
                       "num_return_sequences": n, "use_cache": True, "pad_token_id": self.pad_token_id}
            with self.device.autocast():
                if self._sharded is not None:  # through the FSDP2 root, every process decoding until all are done
                    out = self._sharded(input_ids, torch.ones_like(input_ids), generate={**options, "synced_gpus": True})
                else:
                    out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **options)
        finally:
            model.train(was_training)
        eos = model.generation_config.eos_token_id
        stops = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        completions = []
        for row in out[:, len(prompt_ids):].tolist():
            end = next((i + 1 for i, token in enumerate(row) if token in stops), len(row))
            completions.append(row[:end])
        return completions


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


def _compile_layers(causal_lm: Any) -> None:
    """Regional compilation: each decoder layer's forward through ``torch.compile`` (the layers share one graph)."""
    for layer in causal_lm.model.layers:
        layer.compile()


def build_policy(base_dir: Path, config: TrainConfig, device: Device, pad_token_id: int, *, needs_reference: bool,
                 init_adapter: Path | None, init_weights: Path | None, resume: Path | None,
                 parallel: Parallel | None = None) -> tuple[Any, Policy, bool]:
    """The model being trained (:func:`load_model`, in training mode, its layers compiled where ``config.compile`` or a
    GPU says so) and the :class:`Policy` the method's loss reads, with the reference policy where the method
    ``needs_reference``: ``(model, policy, compiled)``. With ``parallel`` the loss's module is wrapped for its processes
    (:meth:`~trainer_service.parallel.Parallel.wrap`: DDP for LoRA, FSDP2 for full weights) after the reference is
    taken, so the reference stays whole."""
    model = load_model(base_dir, config, device, init_adapter=init_adapter, init_weights=init_weights, resume=resume)
    model.train()
    causal_lm = model.get_base_model() if config.adapter == "lora" else model
    reference = (_reference_context(model, config, device, base_dir, init_adapter=init_adapter, init_weights=init_weights, resumed=resume is not None)
                 if needs_reference else (lambda: nullcontext(None)))
    compiled = device.is_cuda if config.compile is None else config.compile
    if compiled:
        _compile_layers(causal_lm)
    forward, sharded = TokenLogprobs(causal_lm), None
    if parallel is not None:
        forward, sharded = parallel.wrap(forward, config.adapter, device.torch_device)
    return model, Policy(device=device, pad_token_id=pad_token_id, _causal_lm=causal_lm, _reference=reference, _forward=forward,
                         _sharded=sharded), compiled

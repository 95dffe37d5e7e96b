"""The models one transformers engine answers with: its base model, PEFT LoRA adapters on it and full-weight checkpoints
of it, each checkpoint loaded from its folder on first use (no restart) and kept while it is recently used.

Invariants: at most ``max_loaded_adapters`` adapters are loaded on the base and at most ``max_loaded_full_checkpoints``
full checkpoints are in memory, each a float32 model object of its own; the least recently used goes first, a full one
before the next is loaded (never one more in memory than the bound) and its memory freed. The base answers with every
adapter disabled, so its output never depends on which adapters or checkpoints were used before. A full checkpoint
shares everything but its weights with the base: tokenizer, chat template, end-of-turn tokens, context window and
generation defaults (its own ``generation_config.json`` is not read: decoding is the request's); one of another
architecture or vocabulary is a ``ValueError``, for its requests alone. Not thread-safe: the engine uses it on its
worker thread, under its lock.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch
from inference_service.engines.base import Adapter

logger = logging.getLogger(__name__)


class LoadedModels:
    """The base model (``base``: PEFT-wrapped once an adapter is loaded), the adapters loaded on it (``adapters``:
    checkpoint name → PEFT adapter key) and the full checkpoints loaded (``full``: name → model), least recently used
    first."""

    def __init__(self, base: Any, *, max_loaded_adapters: int, max_loaded_full_checkpoints: int) -> None:
        self.base = base
        self.max_loaded_adapters = max_loaded_adapters
        self.max_loaded_full_checkpoints = max_loaded_full_checkpoints
        self.adapters: OrderedDict[str, str] = OrderedDict()
        self.full: OrderedDict[str, Any] = OrderedDict()
        self._adapter_serial = 0
        self._kind = (base.config.model_type, int(base.config.vocab_size))
        self._generation_config = copy.deepcopy(base.generation_config)  # the base's defaults, for its full checkpoints too

    @contextlib.contextmanager
    def serving(self, adapter: Adapter | None) -> Iterator[Any]:
        """The model object that answers for ``adapter`` while the context lasts: the base with every adapter
        disabled, the base with that LoRA adapter active, or the full checkpoint's own model."""
        from peft import PeftModel

        if adapter is None:
            if isinstance(self.base, PeftModel):
                with self.base.disable_adapter():
                    yield self.base
            else:
                yield self.base
        elif adapter.kind == "full":
            yield self._full_model(adapter)
        else:
            self._activate_adapter(adapter)
            yield self.base

    def _full_model(self, adapter: Adapter) -> Any:
        """The model of full checkpoint ``adapter``, loading it from its folder if it is not cached. Raises
        ``ValueError`` for weights that are not of the base model's shape (another vocabulary or architecture)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        if adapter.name in self.full:
            self.full.move_to_end(adapter.name)
            return self.full[adapter.name]
        config = AutoConfig.from_pretrained(adapter.path)
        kind = (config.model_type, int(config.vocab_size))
        if kind != self._kind:
            raise ValueError(f"checkpoint {adapter.name} is not a full checkpoint of this base model: a {kind[0]} model with {kind[1]} "
                             f"tokens, the base is a {self._kind[0]} model with {self._kind[1]}")
        while len(self.full) >= self.max_loaded_full_checkpoints:  # before loading: never one more in memory than the bound
            self._unload_full(next(iter(self.full)))
        model = AutoModelForCausalLM.from_pretrained(adapter.path, config=config, dtype=torch.float32).eval()
        model.generation_config = copy.deepcopy(self._generation_config)
        self.full[adapter.name] = model
        logger.info("loaded full checkpoint %s from %s", adapter.name, adapter.path)
        return model

    def _unload_full(self, name: str) -> None:
        """Drop full checkpoint ``name``'s model and free its memory."""
        del self.full[name]
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        logger.info("unloaded full checkpoint %s", name)

    def _activate_adapter(self, adapter: Adapter) -> None:
        """Make ``adapter`` the active one, loading it from its folder if it is not cached."""
        from peft import PeftModel

        if adapter.name in self.adapters:
            self.adapters.move_to_end(adapter.name)
        else:
            # PEFT keys adapters by module attribute names, so each gets an internal identifier.
            self._adapter_serial += 1
            key = f"adapter_{self._adapter_serial}"
            if isinstance(self.base, PeftModel):
                self.base.load_adapter(adapter.path, adapter_name=key)
            else:
                self.base = PeftModel.from_pretrained(self.base, adapter.path, adapter_name=key).eval()
            self.adapters[adapter.name] = key
            logger.info("loaded adapter %s from %s", adapter.name, adapter.path)
            while len(self.adapters) > self.max_loaded_adapters:
                evicted, evicted_key = self.adapters.popitem(last=False)
                self.base.delete_adapter(evicted_key)
                logger.info("unloaded adapter %s", evicted)
        self.base.set_adapter(self.adapters[adapter.name])

"""Inference engines behind one seam (:class:`~inference_service.engines.base.Engine`), one module each, chosen by
the ``engine`` setting: ``transformers`` (:mod:`.transformers`), ``vllm`` (vLLM in process, :mod:`.vllm`) and
``upstream`` (an OpenAI-compatible server, :mod:`.upstream`). An engine module registers its loader with
:func:`register_engine`; the module is imported only when its engine is chosen (vLLM is an optional extra). The
transformers engine's parts are modules of their own: :mod:`.batching`, :mod:`.decoding`, :mod:`.grammar`,
:mod:`.logprobs`, :mod:`.adapters`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from services.common.llms import base_model_dir, registry

if TYPE_CHECKING:
    from inference_service.engines.base import Engine
    from inference_service.settings import InferenceSettings

# engine name → loader(base model name, its prepared folder, settings) → Engine
Loader = Callable[[str, Path, "InferenceSettings"], "Engine"]
_LOADERS: dict[str, Loader] = {}


def register_engine(name: str) -> Callable[[Loader], Loader]:
    """Decorator: ``loader`` builds the engine called ``name`` for one base model."""
    def register(loader: Loader) -> Loader:
        _LOADERS[name] = loader
        return loader
    return register


def load_engine(name: str, settings: InferenceSettings) -> Engine:
    """An engine of ``settings.engine``'s kind for base model ``name``, prepared under ``settings.models_dir``
    (``UnknownBaseModel`` if it is not)."""
    importlib.import_module(f"{__name__}.{settings.engine}")
    return _LOADERS[settings.engine](name, base_model_dir(name, settings.models_dir), settings)


def load_engines(settings: InferenceSettings) -> dict[str, Engine]:
    """One engine of ``settings.engine``'s kind per base model prepared under ``settings.models_dir`` (the registry,
    :func:`services.common.llms.registry`)."""
    return {name: load_engine(name, settings) for name in registry(settings.models_dir)}

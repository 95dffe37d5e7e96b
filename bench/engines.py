"""The engines behind the seam against the raw libraries they wrap: new tokens per second, and an adapter's first token.

    .venv/bin/python bench/engines.py [--prompts 64] [--tokens 64] [--repeats 3] [--lora-rank 256] [--adapter-rank 16]
                                      [--adapter-prompts 16] [--adapter-tokens 16] [--only hf-raw,vllm-raw,...]

Workload: ``--prompts`` chain-sum chat prompts ("What is 3 + 4 + 5?", 3 to 5 terms, fixed), rendered by the model's
chat template (:class:`~inference_service.chat.ChatRenderer`, the same token ids everywhere), greedy, exactly
``--tokens`` new tokens each (end of turn suppressed: ``min_new_tokens`` / ``ignore_eos`` raw, a ``logit_bias`` of
-100 on the end-of-turn tokens through the seam), float32, all prompts submitted at once. Each configuration runs in
a fresh process (vLLM in process changes torch's threading for its process), one after the other, never two at once;
``--repeats`` rounds, configurations interleaved, so a noisy neighbour hits all of them alike.

Configurations:

- ``hf-raw``: transformers ``model.generate`` on all prompts as one left-padded batch.
- ``vllm-raw``: ``vllm.LLM.generate`` in process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, executor ``uni``, eager,
  float32, 2 GiB KV), as vLLM sets itself up; ``vllm-raw-1t``: the same with torch at 1 thread (what the engine uses).
- ``transformers``: :class:`~inference_service.engines.transformers.TransformersEngine` (``max_batch_size`` 64).
- ``vllm``: :class:`~inference_service.engines.vllm.VLLMEngine` as deployed (LoRA on, ``--lora-rank``, 8 adapters);
  ``vllm-lora16``: LoRA at rank 16; ``vllm-nolora``: LoRA off.

For each seam engine also: an adapter (``--adapter-rank``, all linear layers, random weights, made with PEFT) never
seen before, time from submit to the first streamed token (hot-load included), then the same again (loaded), and
the adapter's throughput on the first ``--adapter-prompts`` prompts x ``--adapter-tokens`` tokens (smaller: vLLM's
CPU LoRA at rank 256 runs at about one token per second). Prints a table: median tokens/s, the spread (min–max) over the
repeats, and the ratio of the median to the best raw median of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = "smollm2-135m-instruct"
RAW = ["hf-raw", "vllm-raw", "vllm-raw-1t"]
SEAM = ["transformers", "vllm", "vllm-lora16", "vllm-nolora"]


def chain_sums(count: int) -> list[str]:
    rng = random.Random(0)
    return [f"What is {' + '.join(str(rng.randint(1, 20)) for _ in range(rng.randint(3, 5)))}?" for _ in range(count)]


def model_dir() -> Path:
    from tests.conftest import prepared_models

    return prepared_models() / MODEL


def prompt_ids(tokenizer: Any, prompts: list[str]) -> list[list[int]]:
    from inference_service.chat import ChatRenderer

    renderer = ChatRenderer(tokenizer)
    return [tokenizer(renderer.render([{"role": "user", "content": p}]), add_special_tokens=False)["input_ids"] for p in prompts]


def end_tokens(path: Path, tokenizer: Any) -> list[int]:
    config = json.loads((path / "generation_config.json").read_text()) if (path / "generation_config.json").exists() else {}
    eos = config.get("eos_token_id")
    ids = {tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])}
    return sorted(i for i in ids if i is not None)


# ---------------------------------------------------------------------- one configuration (child process)

def run_hf_raw(prompts: list[str], tokens: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = prompt_ids(tokenizer, prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def generate(rows: list[list[int]], new: int) -> int:
        width = max(map(len, rows))
        input_ids = torch.full((len(rows), width), pad)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, width - len(row):] = torch.tensor(row)
            mask[i, width - len(row):] = 1
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                 pad_token_id=pad)
        return (out.shape[1] - width) * len(rows)

    generate(ids[:4], 4)  # warm-up
    start = time.perf_counter()
    count = generate(ids, tokens)
    return {"tokens": count, "s": time.perf_counter() - start}


def run_vllm_raw(prompts: list[str], tokens: int, one_thread: bool) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    path = model_dir()
    start = time.perf_counter()
    llm = LLM(model=str(path), dtype="float32", kv_cache_memory_bytes=2 << 30, enforce_eager=True, distributed_executor_backend="uni",
              disable_log_stats=True)
    started = time.perf_counter() - start
    if one_thread:
        torch._C.set_num_threads(1)  # vLLM's worker made torch.set_num_threads a no-op
    ids = [TokensPrompt(prompt_token_ids=p) for p in prompt_ids(llm.get_tokenizer(), prompts)]
    llm.generate(ids[:4], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(ids, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True), use_tqdm=False)
    return {"tokens": sum(len(o.outputs[0].token_ids) for o in outs), "s": time.perf_counter() - start, "start_s": started}


def run_seam(kind: str, prompts: list[str], tokens: int, lora_rank: int, adapter: Path, adapter_prompts: int,
             adapter_tokens: int) -> dict[str, Any]:
    from inference_service.engines.base import Adapter, GenerationRequest

    path = model_dir()
    start = time.perf_counter()
    if kind == "transformers":
        from inference_service.engines.transformers import TransformersEngine

        engine: Any = TransformersEngine(path, max_batch_size=len(prompts))
    else:
        from inference_service.engines.vllm import VLLMEngine

        rank = {"vllm": lora_rank, "vllm-lora16": 16, "vllm-nolora": 16}[kind]
        engine = VLLMEngine(path, max_loaded_adapters=8, max_lora_rank=rank, enable_lora=kind != "vllm-nolora")
    started = time.perf_counter() - start
    bias = {t: -100.0 for t in end_tokens(path, engine.tokenizer)}

    def request(q: str, new: int, stream: bool = False) -> GenerationRequest:
        return GenerationRequest(messages=[{"role": "user", "content": q}], max_tokens=new, temperature=0, logit_bias=bias, stream=stream)

    async def workload(new: int, count: int, on: Adapter | None = None) -> tuple[int, float]:
        begin = time.perf_counter()
        generations = await asyncio.gather(*(engine.submit(request(q, new), on) for q in prompts[:count]))
        results = await asyncio.gather(*(g.result() for g in generations))
        return sum(r.completion_tokens for r in results), time.perf_counter() - begin

    async def first_token(on: Adapter) -> float:
        begin = time.perf_counter()
        generation = await engine.submit(request(prompts[0], 4, stream=True), on)
        async for _ in generation.deltas():
            break
        elapsed = time.perf_counter() - begin
        generation.cancel()
        await generation.result()
        return elapsed

    async def main() -> dict[str, Any]:
        await workload(4, 4)  # warm-up
        count, seconds = await workload(tokens, len(prompts))
        out: dict[str, Any] = {"tokens": count, "s": seconds, "start_s": started}
        if kind != "vllm-nolora":
            ckpt = Adapter("bench-adapter", adapter)
            out["adapter_first_token_s"] = await first_token(ckpt)
            out["adapter_loaded_first_token_s"] = await first_token(ckpt)
            count, seconds = await workload(adapter_tokens, adapter_prompts, ckpt)
            out["adapter_tok_s"] = count / seconds
        await engine.aclose()
        return out

    return asyncio.run(main())


def child(args: argparse.Namespace) -> None:
    prompts = chain_sums(args.prompts)
    kind = args.one
    if kind == "hf-raw":
        result = run_hf_raw(prompts, args.tokens)
    elif kind in ("vllm-raw", "vllm-raw-1t"):
        result = run_vllm_raw(prompts, args.tokens, one_thread=kind == "vllm-raw-1t")
    else:
        result = run_seam(kind, prompts, args.tokens, args.lora_rank, Path(args.adapter), args.adapter_prompts, args.adapter_tokens)
    expected = args.prompts * args.tokens
    if result["tokens"] != expected:
        raise SystemExit(f"{kind}: {result['tokens']} new tokens, expected {expected}")
    result["load"] = os.getloadavg()[0]
    print("RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------------- the run (parent process)

def make_adapter(rank: int, folder: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir()),
                           LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", init_lora_weights=False))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    model.save_pretrained(folder)
    return folder


def measure(kind: str, args: argparse.Namespace, adapter: Path) -> dict[str, Any] | None:
    command = [sys.executable, __file__, "--one", kind, "--prompts", str(args.prompts), "--tokens", str(args.tokens),
               "--lora-rank", str(args.lora_rank), "--adapter", str(adapter), "--adapter-prompts", str(args.adapter_prompts),
               "--adapter-tokens", str(args.adapter_tokens)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line.removeprefix("RESULT "))
            result["tok_s"] = result["tokens"] / result["s"]
            return result
    print(f"{kind} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
    return None


def spread(values: list[float], digits: int = 1) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lora-rank", type=int, default=256, help="max_lora_rank of the `vllm` configuration (the setting's default)")
    parser.add_argument("--adapter-rank", type=int, default=16)
    parser.add_argument("--adapter-prompts", type=int, default=16, help="prompts of the adapter's throughput workload")
    parser.add_argument("--adapter-tokens", type=int, default=16, help="new tokens per prompt of the adapter's throughput workload")
    parser.add_argument("--only", default=",".join(RAW + SEAM), help="configurations to run, comma-separated")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--adapter", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        child(args)
        return
    kinds = args.only.split(",")
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        adapter = make_adapter(args.adapter_rank, Path(tmp) / "adapter")
        for round_ in range(args.repeats):
            for kind in kinds:
                result = measure(kind, args, adapter)
                if result is not None:
                    results[kind].append(result)
                    print(f"round {round_ + 1} {kind}: {result['tok_s']:.1f} tok/s (load {result['load']:.1f})", flush=True)
    medians = {k: statistics.median(r["tok_s"] for r in rs) for k, rs in results.items() if rs}
    best_raw = max((v for k, v in medians.items() if k in RAW), default=None)
    best_name = next((k for k in RAW if medians.get(k) == best_raw), "-")
    print(f"\n{args.prompts} chain-sum prompts x {args.tokens} new tokens, greedy, float32; {args.repeats} rounds; "
          f"ratio = median / best raw median ({best_name})\n")
    print("| configuration | new tok/s median (min–max) | ratio | start s | adapter first token s (new / loaded) | adapter tok/s |")
    print("|---|---|---|---|---|---|")
    for kind, rs in results.items():
        if not rs:
            print(f"| {kind} | failed | | | | |")
            continue
        ratio = f"{medians[kind] / best_raw:.2f}" if best_raw else "-"
        starts = [r["start_s"] for r in rs if "start_s" in r]
        first = [r["adapter_first_token_s"] for r in rs if "adapter_first_token_s" in r]
        loaded = [r["adapter_loaded_first_token_s"] for r in rs if "adapter_loaded_first_token_s" in r]
        adapted = [r["adapter_tok_s"] for r in rs if "adapter_tok_s" in r]
        hot = f"{spread(first, 2)} / {spread(loaded, 2)}" if first else "-"
        print(f"| {kind} | {spread([r['tok_s'] for r in rs])} | {ratio} | {spread(starts)} | {hot} | {spread(adapted)} |")
    print(f"\nload average during the runs: {spread([r['load'] for rs in results.values() for r in rs])}")


if __name__ == "__main__":
    main()

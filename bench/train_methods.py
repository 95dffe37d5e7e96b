"""Does each training method help on the reference task? Validation score before and after a short run of each.

    .venv/bin/python bench/train_methods.py [--steps 60] [--examples 400] [--only sft-lora,dpo-lora,...] [--port-base 19700]

Starts the embedded stack in a fresh data directory, loads ``benchmarks/chain-sum-demo.yaml`` with its recipe lock
lifted (name ``chain-sum-methods``; same suite, splits and evaluation settings), opens one run with a budget large
enough for all of it, evaluates the initial system (SmolLM2-135M-Instruct, the suite's default harness) on the 60
validation items, then for each configuration trains from the base model on ``--examples`` rows the reference agent
builds from the training pool (``crucible.agent.BaselineAgent.build_training_set``: validation questions left out)
and evaluates the job's last checkpoint on the same 60 items. Everything goes through the gateway as an agent would.

Configurations (``--steps`` steps, batch 8, warm-up 10%, cosine):

- ``sft-lora``: SFT, LoRA r16 on every linear layer, lr 1e-3 (the reference agent's default).
- ``dpo-lora``: DPO (β 0.1), the pool's answer chosen and another item's different answer rejected, LoRA r16, lr 1e-4.
- ``sft-full``: SFT on every weight, lr 1e-5.
- ``grpo-lora``: GRPO on the training pool's prompts (no dataset), rewarded by the suite's scorer through the grader,
  8 completions per prompt at temperature 1, at most 8 new tokens (the benchmark's ``max_tokens``), KL β 0.04, LoRA
  r16, lr 2e-4.
- ``grpo-after-sft``: the same GRPO continuing the ``sft-lora`` adapter (SFT, then RL: the usual order; the base model
  answers no validation item in the expected form, so its rollouts seldom earn a reward to learn from).
- ``merge``: a linear merge (0.5/0.5) of the ``sft-lora`` and ``dpo-lora`` adapters (needs both).

Prints a table: validation accuracy before and after, the difference with its 95% interval (paired bootstrap over the
60 items, 10,000 resamples), training wall time and the run's money spent by the job. Not a timed test: the numbers go
in docs/training.md.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS: dict[str, dict[str, Any]] = {
    "sft-lora": {"method": "sft", "adapter": "lora", "learning_rate": 1e-3},
    "dpo-lora": {"method": "dpo", "adapter": "lora", "learning_rate": 1e-4},
    "sft-full": {"method": "sft", "adapter": "full", "learning_rate": 1e-5},
    "grpo-lora": {"method": "grpo", "adapter": "lora", "learning_rate": 2e-4, "grpo_group_size": 8, "grpo_max_new_tokens": 8,
                  "grpo_temperature": 1.0},
    "grpo-after-sft": {"method": "grpo", "adapter": "lora", "learning_rate": 2e-4, "grpo_group_size": 8, "grpo_max_new_tokens": 8,
                       "grpo_temperature": 1.0, "parent": "sft-lora"},
}


def item_scores(client: Any, eval_id: str) -> dict[str, float]:
    """Per-item scores of a finished validation evaluation."""
    return {t["item_id"]: float(t["score"]) for t in client.trajectories(eval_id)}


def paired_interval(before: dict[str, float], after: dict[str, float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of mean(after - before) over items, by a paired bootstrap."""
    items = sorted(before)
    diffs = [after[i] - before[i] for i in items]
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--examples", type=int, default=400)
    parser.add_argument("--only", default="sft-lora,dpo-lora,sft-full,grpo-lora,grpo-after-sft,merge")
    parser.add_argument("--port-base", type=int, default=19700)
    args = parser.parse_args()

    from crucible.agent import AgentConfig, BaselineAgent
    from crucible.cli import _prepare
    from crucible.sdk import AdminClient, CrucibleClient
    from crucible.stack import Stack, admin_key

    chosen = args.only.split(",")
    with tempfile.TemporaryDirectory(prefix="crucible-methods-") as tmp:
        data_dir = Path(tmp)
        _prepare(data_dir)
        stack = Stack(data_dir, args.port_base)
        stack.start()
        try:
            admin = AdminClient(stack.gateway_url, admin_key(data_dir))
            doc = yaml.safe_load((ROOT / "benchmarks" / "chain-sum-demo.yaml").read_text())
            doc |= {"name": "chain-sum-methods", "recipe": {}, "budget": {"usd": 50.0, "wall_clock_hours": 24},
                    "limits": {"final_submissions": 1, "validation_evaluations_per_hour": 100}}
            admin.load_benchmark(doc)
            run = admin.create_run("chain-sum-methods", "methods-bench")
            client = CrucibleClient(stack.gateway_url, run["api_key"])
            task = client.run()["benchmark"]["tasks"][0]
            harness, base = task["initial_system"]["harness"], task["initial_system"]["model"]

            def evaluate(model: str) -> tuple[float, dict[str, float]]:
                ev = client.wait_evaluation(client.create_evaluation(model)["id"], poll_s=2)
                return float(ev["score"]["value"]), item_scores(client, ev["id"])

            initial, initial_items = evaluate(base)
            print(f"initial system: {100 * initial:.1f}% on {len(initial_items)} validation items", flush=True)
            validation = {it["question"] for it in client.validation_items()}
            rows: list[tuple[str, float, float, tuple[float, float], float, int]] = []
            checkpoints: dict[str, str] = {}
            results: dict[str, tuple[float, dict[str, float]]] = {}  # each configuration's validation score and item scores
            for name in [n for n in chosen if n in CONFIGS]:
                config = dict(CONFIGS[name])
                parent = config.pop("parent", None)
                if parent is not None and parent not in checkpoints:
                    print(f"{name}: skipped ({parent} did not run)", flush=True)
                    continue
                recipe = {**config, "max_steps": args.steps, "batch_size": 8, "warmup_steps": max(1, args.steps // 10),
                          "checkpoint_every": args.steps}
                agent = BaselineAgent(client, AgentConfig(train_examples=args.examples, recipe=recipe))
                spent = client.budget()["spent_usd_micros"]
                datasets = []
                if recipe["method"] != "grpo":  # GRPO trains on the training pool's prompts itself
                    data = agent.build_training_set(harness, validation, method=recipe["method"])
                    datasets = [client.upload_dataset(data, f"{name}.jsonl")["id"]]
                started = time.monotonic()
                job = agent.train(checkpoints[parent] if parent else base, datasets, recipe)
                took = time.monotonic() - started
                ckpt = client.checkpoints(job["id"])[-1]["id"]
                checkpoints[name] = ckpt
                score, items = evaluate(ckpt)
                results[name] = (score, items)
                before, before_items = results[parent] if parent else (initial, initial_items)  # GRPO after SFT: against the SFT checkpoint
                rows.append((f"{name} (before: the {parent} checkpoint)" if parent else name, before, score, paired_interval(before_items, items),
                             took, client.budget()["spent_usd_micros"] - spent))
                print(f"{name}: {100 * before:.1f}% -> {100 * score:.1f}% ({took:.0f} s training)", flush=True)
            if "merge" in chosen and {"sft-lora", "dpo-lora"} <= set(checkpoints):
                spent = client.budget()["spent_usd_micros"]
                started = time.monotonic()
                job = client.merge_checkpoints(base, [checkpoints["sft-lora"], checkpoints["dpo-lora"]], weights=[0.5, 0.5])
                while (job := client.training_job(job["id"]))["status"] not in ("succeeded", "failed", "cancelled"):
                    time.sleep(1)
                took = time.monotonic() - started
                score, items = evaluate(client.checkpoints(job["id"])[-1]["id"])
                rows.append(("merge (sft-lora + dpo-lora, linear 0.5/0.5)", initial, score, paired_interval(initial_items, items), took,
                             client.budget()["spent_usd_micros"] - spent))

            print(f"\nchain-sum-demo validation ({len(initial_items)} items), {args.steps} steps, {args.examples} training rows\n")
            print("| configuration | before | after | difference (95% CI) | job wall time (s) | job cost (µUSD, incl. its evaluation) |")
            print("|---|---:|---:|---:|---:|---:|")
            for name, before, after, (lo, hi), took, cost in rows:
                print(f"| {name} | {100 * before:.1f}% | {100 * after:.1f}% | {100 * (after - before):+.1f} pts ({100 * lo:+.1f} to {100 * hi:+.1f}) "
                      f"| {took:.0f} | {cost:,} |")
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
